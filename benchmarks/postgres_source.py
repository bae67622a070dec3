"""PostgreSQL source throughput: snapshot rows/s and change rows/s into Spark's ``noop`` sink and into Delta,
against ``COPY (SELECT * FROM t) TO STDOUT`` of the same table in the same run (the physical limit for a
snapshot).

A PostgreSQL started on loopback by this script holds ``--rows`` rows (id, text, numeric, timestamptz, int).
Measured: ``COPY ... TO`` read by psycopg; a batch read of the cdc source with ``startingOffsets=snapshot``
(export, materialised chunks, Spark job) into ``noop``, then (a new slot, a new export) into a Delta table
through ``sinks.delta.DeltaUpsertSink``; then ``--changes`` updates in transactions of 10,000 read from the
slot (``startingOffsets=earliest``) into ``noop``, then applied to that Delta table. Spark's session start
and a warm-up job (a small snapshot, which starts the Python workers) are excluded. Flink CDC's published
figure for comparison: ~10k rows/s per snapshot reader. The snapshot's time is split in two: the export and
materialisation alone (in this process), and Spark reading the materialised chunks (the same read again,
which reuses them, as a replay does). Last line:
``ratio <cdc snapshot rows/s into noop / COPY rows/s>``.

    python benchmarks/postgres_source.py            # 1M rows, 200k changes
    python benchmarks/postgres_source.py --quick    # 200k rows, 50k changes
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import click
from record import append_record

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def create_bench_table(dsn: str, rows: int) -> None:
    """The benchmark's table ``bench`` (id, text, numeric, timestamptz, int) with ``rows`` rows, vacuumed."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, name text, amount numeric(12,2), "
                     "at timestamptz, n int)")
        conn.execute("INSERT INTO bench SELECT g, 'customer-' || g, g * 1.25, now(), g %% 1000 "
                     "FROM generate_series(1, %s) g", (rows,))
        conn.execute("VACUUM ANALYZE bench")


def copy_rows_per_s(dsn: str, rows: int) -> float:
    import psycopg

    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        start = time.perf_counter()
        size = 0
        with cur.copy("COPY (SELECT * FROM bench) TO STDOUT") as copy:
            for data in copy:
                size += len(data)
        return rows / (time.perf_counter() - start)


def cdc_noop(spark: object, options: dict[str, str]) -> tuple[float, int]:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observed = Observation("rows")
    reader = spark.read.format("cdc").option("backend", "postgres")  # type: ignore[attr-defined]
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load().observe(observed, F.count(F.lit(1)).alias("n"))
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start, int(observed.get["n"])


def cdc_delta(spark: object, options: dict[str, str], path: str, batch_id: int) -> tuple[float, int]:
    from sinks.delta import DeltaUpsertSink

    reader = spark.read.format("cdc").option("backend", "postgres")  # type: ignore[attr-defined]
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load()
    start = time.perf_counter()
    # One action: the sink collects the batch as Arrow and merges it (a persisted count would read twice).
    DeltaUpsertSink(path, keys=["id"], app_id="benchmark")(df, batch_id)
    seconds = time.perf_counter() - start
    from deltalake import DeltaTable

    return seconds, DeltaTable(path).version()


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--changes", default=200_000, show_default=True)
@click.option("--quick", is_flag=True, help="200k rows, 50k changes.")
def main(rows: int, changes: int, quick: bool) -> None:
    import psycopg

    import cdc
    from cdc.backend import open_backend
    from cdc.servers.postgres import PostgresServer
    from tests.conftest import spark_builder

    if quick:
        rows, changes = 200_000, 50_000
    with PostgresServer() as pg, tempfile.TemporaryDirectory() as tmp:
        dsn = pg.create_database("bench")
        create_bench_table(dsn, rows)
        copy_rate = copy_rows_per_s(dsn, rows)
        print(f"COPY TO: {copy_rate:,.0f} rows/s")
        spark = spark_builder("postgres-source-benchmark").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        base = {"dsn": dsn, "tables": "bench", "snapshot.path": os.path.join(tmp, "snap")}
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE warm (LIKE bench INCLUDING ALL)")
            conn.execute("INSERT INTO warm SELECT * FROM bench LIMIT 20000")
        cdc_noop(spark, {**base, "tables": "warm", "slot.name": "warmup", "startingOffsets": "snapshot",
                         "snapshot.chunkRows": "2000"})
        seconds, n = cdc_noop(spark, {**base, "slot.name": "snap", "startingOffsets": "snapshot"})
        assert n == rows, (n, rows)
        snap_rate = n / seconds
        print(f"cdc snapshot -> noop: {n:,} rows in {seconds:.2f} s = {snap_rate:,.0f} rows/s "
              f"(Flink CDC published: ~10,000 rows/s per snapshot reader)")
        # Where the time goes: the same read again reuses the materialised chunks (what a replay reads), so it
        # is Spark's share alone; the export and materialisation alone run in this process.
        replay, n = cdc_noop(spark, {**base, "slot.name": "snap", "startingOffsets": "snapshot"})
        assert n == rows, (n, rows)
        backend = open_backend("postgres", {**base, "slot.name": "alone", "snapshot.path": os.path.join(tmp, "alone")})
        began = time.perf_counter()
        backend.snapshot()
        alone = time.perf_counter() - began
        backend.close()
        print(f"  of which: export + materialise alone {alone:.2f} s ({rows / alone:,.0f} rows/s, "
              f"{rows / alone / copy_rate:.2f}x COPY); Spark reading the materialised chunks {replay:.2f} s")
        lake = os.path.join(tmp, "lake")
        seconds, _ = cdc_delta(spark, {**base, "slot.name": "snapd", "startingOffsets": "snapshot"}, lake, 0)
        print(f"cdc snapshot -> Delta: {rows:,} rows in {seconds:.2f} s = {rows / seconds:,.0f} rows/s")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for slot in ("snap", "snapd", "warmup", "alone"):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            # Opening the backend creates its publication, prepare_start() its slot: a slot decodes only with a
            # publication that existed before the changes.
            open_backend("postgres", {**base, "slot.name": "changes"}).prepare_start()
            for lo in range(0, changes, 10_000):
                conn.execute("UPDATE bench SET n = n + 1 WHERE id > %s AND id <= %s", (lo, lo + 10_000))
        seconds, n = cdc_noop(spark, {**base, "slot.name": "changes", "startingOffsets": "earliest"})
        assert n == changes, (n, changes)
        print(f"cdc changes -> noop: {n:,} rows in {seconds:.2f} s = {n / seconds:,.0f} rows/s")
        seconds, _ = cdc_delta(spark, {**base, "slot.name": "changes", "startingOffsets": "earliest"}, lake, 1)
        print(f"cdc changes -> Delta: {changes:,} rows in {seconds:.2f} s = {changes / seconds:,.0f} rows/s")
        spark.stop()
        append_record("postgres_source", {"snapshot -> noop": (snap_rate, "rows/s"), "COPY TO": (copy_rate, "rows/s")}, ratio=snap_rate / copy_rate, target=">= 0.5")
        print(f"ratio {snap_rate / copy_rate:.3f}")


if __name__ == "__main__":
    main()
