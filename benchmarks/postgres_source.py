"""PostgreSQL snapshot (``startingOffsets=snapshot``, ``snapshot.mode=chunked``, the default) against ``COPY ... TO``
and Debezium's embedded engine, on the same table, in the same run.

A PostgreSQL started on loopback by this script holds ``--rows`` rows (id, text, numeric, timestamptz, int).
Each of ``--rounds`` paired rounds measures, one after the other:

- ``COPY (SELECT * FROM bench) TO STDOUT`` read by psycopg (the physical limit of a snapshot);
- the cdc source's chunked snapshot: a streaming query (``Trigger.AvailableNow``, a new slot and checkpoint)
  into Spark's ``noop`` sink, rows counted by the query's progress (its batches' input rows), timed from
  ``start()`` to its end (so the source's planning is inside the figure);
- Debezium's embedded engine (``tests/debezium/engine``, ``make debezium-engine``) snapshotting the same table:
  ``SnapshotCount`` counts the rows inside its JVM in Kafka Connect's record format (no serialisation, no pipe
  to Python), ``snapshot.mode=initial_only``, one table, fetch and batch sizes raised from their defaults. The
  JVM and the engine start slower than our query, so Debezium's snapshot phase is timed from its own event:
  the connector task's start (``ConnectorCallback.taskStarted``) to its last row, read inside the JVM.

Printed per label: the median of the rounds' ratios (``snapshot/COPY``: our rows/s over COPY's;
``snapshot/debezium``: ours over Debezium's). Also measured on every cdc run: the source's own time before the
first batch (its ``initialOffset``, first ``latestOffset`` and first ``partitions``, timed by a subclass of the
source's stream reader registered as ``cdc_timed``: these run in the Python process Spark starts for the
source on the driver), the growth of the driver's resident memory (this Python process, the Spark JVM and the
source's Python process, sampled every 0.2 s against their size before the query), and the bytes under the
checkpoint and under ``snapshot.path`` when the snapshot is done. One more run snapshots the table while a
writer updates rows in small transactions: its change rate, and the changes the query delivered meanwhile.
``--exported`` adds one run of ``snapshot.mode=exported`` (secondary line).

``--scale`` adds a ``--scale-rows`` (10M) table, snapshotted once: its memory growth (target <= 200 MB), bytes
under the checkpoint and time before the first batch (target <= 1 s) beside the first table's; with Debezium,
one run of its engine on it too (``snapshot/debezium at <n> rows``: a streaming query's fixed second weighs a
tenth as much there as at 1M rows).

Last line: ``ratio <snapshot/COPY>`` (target >= 0.5).

    python benchmarks/postgres_source.py                  # 1M rows, 3 rounds
    python benchmarks/postgres_source.py --scale          # and a 10M-row table
    python benchmarks/postgres_source.py --rows 200000 --rounds 1 --no-debezium   # a smoke run
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from record import append_record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from cdc.source import CdcDataSource, CdcStreamReader  # noqa: E402 (after the path is set)

ATTEMPTS = 8
"""Runs of a snapshot query before giving up on a source process that starts too slowly (a loaded machine)."""
TIMING_ENV = "CDC_BENCH_TIMING"
"""The file the timed reader appends its calls to (inherited by the source's Python process through the JVM)."""


def create_bench_table(dsn: str, rows: int, table: str = "bench") -> None:
    """The benchmark's table (id, text, numeric, timestamptz, int) with ``rows`` rows, vacuumed."""
    import psycopg
    from psycopg import sql

    ident = sql.Identifier(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text, amount numeric(12,2), "
                             "at timestamptz, n int)").format(ident))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, 'customer-' || g, g * 1.25, now(), g %% 1000 "
                             "FROM generate_series(1, %s) g").format(ident), (rows,))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(ident))


def copy_rows_per_s(dsn: str, rows: int, table: str = "bench") -> float:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        start = time.perf_counter()
        size = 0
        with cur.copy(sql.SQL("COPY (SELECT * FROM {}) TO STDOUT").format(sql.Identifier(table))) as copy:
            for data in copy:
                size += len(data)
        return rows / (time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- the timed source
class TimedStreamReader(CdcStreamReader):
    """The source's stream reader, appending the time of each planning call to the file ``CDC_BENCH_TIMING``."""

    def _timed(self, call: str, fn: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        out = fn()
        line = json.dumps({"call": call, "seconds": time.perf_counter() - began, "at": time.time(),
                           "pid": os.getpid()})
        with open(os.environ[TIMING_ENV], "a") as f:
            f.write(line + "\n")
        return out

    def initialOffset(self) -> Any:  # noqa: N802 (Spark's name)
        return self._timed("initialOffset", super().initialOffset)

    def latestOffset(self, start: Any, limit: Any) -> Any:  # noqa: N802 (Spark's name)
        return self._timed("latestOffset", lambda: super(TimedStreamReader, self).latestOffset(start, limit))

    def partitions(self, start: Any, end: Any) -> Any:
        return self._timed("partitions", lambda: super(TimedStreamReader, self).partitions(start, end))


class TimedCdc(CdcDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_timed"

    def streamReader(self, schema: Any) -> Any:  # noqa: N802 (Spark's name)
        return TimedStreamReader(self._config, schema)


def before_first_batch(timing: Path, since: float) -> float:
    """The source's time before the first batch: its first initialOffset, latestOffset and partitions calls."""
    first: dict[str, float] = {}
    for line in timing.read_text().splitlines() if timing.exists() else []:
        call = json.loads(line)
        if call["at"] >= since:
            first.setdefault(call["call"], call["seconds"])
    return sum(first.values())


# ---------------------------------------------------------------------------------------------- memory
def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def source_runners(jvm: int) -> list[int]:
    """The Python processes the JVM started for streaming sources (not the executors' workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == jvm and b"pyspark.daemon" not in cmd and b"python" in cmd:
            found.append(int(entry.name))
    return found


class DriverMemory:
    """Samples the driver's resident memory (this process + the JVM + the source's Python processes)."""

    def __init__(self, jvm: int) -> None:
        self.jvm = jvm
        self.peak = {"python": 0.0, "jvm": 0.0, "source": 0.0}
        self.base = self.sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, float]:
        return {"python": rss_mb(os.getpid()), "jvm": rss_mb(self.jvm),
                "source": sum(rss_mb(p) for p in source_runners(self.jvm))}

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for k, v in self.sample().items():
                self.peak[k] = max(self.peak[k], v)

    def __enter__(self) -> DriverMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def growth(self) -> dict[str, float]:
        """Peak minus the size before the query (the source's process is new per query: its whole size)."""
        return {k: max(0.0, self.peak[k] - self.base[k]) for k in self.peak}


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


# ---------------------------------------------------------------------------------------------- one snapshot
def cdc_snapshot(spark: Any, dsn: str, table: str, tmp: Path, tag: str, timing: Path,
                 mode: str = "chunked", writes: bool = False) -> dict[str, Any]:
    """One streaming snapshot of ``table`` into ``noop`` (Trigger.AvailableNow): rows, seconds and the figures.
    Rows are counted by the query's own progress (its batches' input rows: every row is a snapshot row when
    nothing writes); with ``writes`` an observed metric tells snapshot rows from changes (a per-row aggregate
    inside the query, so that run's rate is a secondary figure)."""
    from pyspark.sql import functions as F

    slot = f"bench_{tag}"
    checkpoint, snap = tmp / f"ckpt-{tag}", tmp / f"snap-{tag}"
    df = (spark.readStream.format("cdc_timed").option("backend", "postgres").option("dsn", dsn)
          .option("tables", table).option("slot.name", slot).option("startingOffsets", "snapshot")
          .option("snapshot.mode", mode).option("snapshot.path", str(snap)).load())
    if writes:
        is_snapshot = F.col("_op") == "snapshot"
        df = df.observe("rows", F.sum(F.when(is_snapshot, 1).otherwise(0)).alias("snapshot"),
                        F.sum(F.when(is_snapshot, 0).otherwise(1)).alias("changes"))
    for attempt in range(ATTEMPTS):
        since = time.time()
        with DriverMemory(spark.sparkContext._gateway.proc.pid) as memory:
            began = time.perf_counter()
            query = (df.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination()
            except Exception as exc:
                # On a loaded machine the source's Python process may start slower than Spark waits for it
                # (10 s): run again from scratch, saying so.
                if "failed to connect back" not in str(exc) or attempt == ATTEMPTS - 1:
                    raise
                print(f"  ({tag}: the source's Python process did not start within Spark's 10 s: again)")
                _drop_slot(dsn, slot)
                shutil.rmtree(checkpoint, ignore_errors=True)
                shutil.rmtree(snap, ignore_errors=True)
                continue
            seconds = time.perf_counter() - began
            break
    snapshot_rows = changes = 0
    batches = 0
    for progress in query.recentProgress:
        if not writes:
            snapshot_rows += progress.numInputRows
            batches += progress.numInputRows > 0
            continue
        metrics = progress.observedMetrics.get("rows")
        if metrics is not None:
            snapshot_rows += metrics["snapshot"] or 0
            changes += metrics["changes"] or 0
            batches += 1
    _drop_slot(dsn, slot)
    return {"rows": snapshot_rows, "changes": changes, "seconds": seconds, "batches": batches,
            "first": before_first_batch(timing, since), "memory": memory.growth(),
            "checkpoint": du(checkpoint), "snapshot_path": du(snap)}


def _drop_slot(dsn: str, slot: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,))


def debezium_snapshot(dsn: str, table: str, rows: int, tmp: Path, tag: str) -> dict[str, float]:
    """Debezium's embedded engine snapshotting ``table``: its task start to its last row, timed in its JVM."""
    from psycopg.conninfo import conninfo_to_dict

    engine = ROOT / "tests" / "debezium" / "engine" / "target"
    listed = engine / "classpath.txt"
    if not listed.exists():
        raise click.ClickException("the Debezium engine is not built: run `make debezium-engine`")
    info = conninfo_to_dict(dsn)
    slot = f"dbz_{tag}"
    props = tmp / f"{slot}.properties"
    props.write_text("\n".join([
        "name=" + slot,
        "connector.class=io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage=org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms=60000",
        "database.hostname=127.0.0.1",
        f"database.port={info.get('port', 5432)}",
        f"database.user={info['user']}",
        "database.password=unused",
        f"database.dbname={info['dbname']}",
        "topic.prefix=pg",
        "plugin.name=pgoutput",
        f"slot.name={slot}",
        "slot.drop.on.stop=true",
        f"publication.name={slot}",
        "publication.autocreate.mode=filtered",
        f"table.include.list=public.{table}",
        "snapshot.mode=initial_only",
        # Its fastest single-table settings: larger fetches, batches and queue than the defaults (10240,
        # 2048, 8192), the engine polling its queue often.
        "snapshot.fetch.size=50000",
        "max.batch.size=20000",
        "max.queue.size=80000",
        "poll.interval.ms=20",
    ]) + "\n")
    classpath = listed.read_text().strip() + os.pathsep + str(engine / "classes")
    out = subprocess.run(
        ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath, "cdctunnel.SnapshotCount",
         str(props), str(rows)],
        capture_output=True, text=True, timeout=1800, check=False,
    )
    if out.returncode != 0:
        raise click.ClickException(f"Debezium's engine failed ({out.returncode}): {out.stderr[-2000:]}")
    started, first, last, count = (int(v) for v in out.stdout.split())
    assert count == rows, (count, rows)
    return {"seconds": (last - started) / 1000, "task_start_ms": started, "first_row_ms": first}


# ---------------------------------------------------------------------------------------------- the writer
class Writer:
    """Updates random rows of the table in transactions of 100 rows while it runs."""

    def __init__(self, dsn: str, table: str, rows: int) -> None:
        self.dsn, self.table, self.rows = dsn, table, rows
        self.changed = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg
        from psycopg import sql

        rng = random.Random(7)
        query = sql.SQL("UPDATE {} SET n = n + 1 WHERE id = ANY(%s)").format(sql.Identifier(self.table))
        began = time.perf_counter()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                ids = rng.sample(range(1, self.rows + 1), 100)
                conn.execute(query, (ids,))
                self.changed += 100
        self.seconds = time.perf_counter() - began

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--rounds", default=3, show_default=True, help="Paired rounds (COPY, cdc, Debezium) per median.")
@click.option("--debezium/--no-debezium", default=True, show_default=True)
@click.option("--exported", is_flag=True, help="Also one run of snapshot.mode=exported (secondary line).")
@click.option("--scale", is_flag=True, help="Also snapshot a --scale-rows table: memory, checkpoint, planning.")
@click.option("--scale-rows", default=10_000_000, show_default=True)
@click.option("--warm/--cold", default=True, show_default=True,
              help="Warm the JVM with one unmeasured snapshot of the measured table first (its JIT compiles Spark's "
                   "Arrow-to-row conversion and query planning once, as the first rows of a large snapshot do).")
@click.option("--marginal/--no-marginal", default=True, show_default=True,
              help="Also snapshot and COPY a table of twice the rows each round: the rate of the added rows, "
                   "without the fixed cost of a query (planning, tasks, JIT).")
def main(rows: int, rounds: int, debezium: bool, exported: bool, scale: bool, scale_rows: int, warm: bool,
         marginal: bool) -> None:
    import cdc
    from cdc.servers.postgres import PostgresServer
    from tests.conftest import spark_builder

    params = {"rows": rows, "rounds": rounds, "debezium": debezium, "exported": exported, "scale": scale,
              "scale_rows": scale_rows if scale else None, "warm": warm, "marginal": marginal}
    figures: dict[str, Any] = {}
    with PostgresServer() as pg, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        timing = tmp / "timing.jsonl"
        os.environ[TIMING_ENV] = str(timing)
        dsn = pg.create_database("bench")
        create_bench_table(dsn, rows)
        create_bench_table(dsn, 20_000, "warm")
        if marginal:
            create_bench_table(dsn, 2 * rows, "bench_double")
        spark = spark_builder("postgres-source-benchmark").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        spark.dataSource.register(TimedCdc)
        cdc_snapshot(spark, dsn, "warm", tmp, "warm", timing)  # Python workers and imports
        if warm:
            cdc_snapshot(spark, dsn, "bench", tmp, "warmjit", timing)  # the JIT: unmeasured
        copy_ratios, dbz_ratios, runs, marginal_ratios = [], [], [], []
        for r in range(rounds):
            copy_rate = copy_rows_per_s(dsn, rows)
            run = cdc_snapshot(spark, dsn, "bench", tmp, f"r{r}", timing)
            assert run["rows"] == rows, (run["rows"], rows)
            rate = rows / run["seconds"]
            runs.append(run)
            copy_ratios.append(rate / copy_rate)
            line = (f"round {r + 1}: COPY {copy_rate:,.0f} rows/s; cdc snapshot {rate:,.0f} rows/s "
                    f"({run['seconds']:.2f} s, {run['batches']} batches, {run['first']:.3f} s before the first "
                    f"batch)")
            if debezium:
                dbz = debezium_snapshot(dsn, "bench", rows, tmp, f"r{r}")
                dbz_rate = rows / dbz["seconds"]
                dbz_ratios.append(rate / dbz_rate)
                line += (f"; Debezium {dbz_rate:,.0f} rows/s ({dbz['seconds']:.2f} s from its task's start, which "
                         f"came {dbz['task_start_ms'] / 1000:.1f} s after its engine was built)")
            if marginal:
                # COPY's time swings by a third from run to run and a difference of two times magnifies that:
                # the fastest of three runs of each table.
                copy_double = max(copy_rows_per_s(dsn, 2 * rows, "bench_double") for _ in range(3))
                copy_single = max([copy_rate, *(copy_rows_per_s(dsn, rows) for _ in range(2))])
                double = cdc_snapshot(spark, dsn, "bench_double", tmp, f"d{r}", timing)
                assert double["rows"] == 2 * rows, (double["rows"], 2 * rows)
                # Seconds of the added rows: the double table's time less the table's.
                cdc_added = rows / max(double["seconds"] - run["seconds"], 1e-6)
                copy_added = rows / max(2 * rows / copy_double - rows / copy_single, 1e-6)
                marginal_ratios.append(cdc_added / copy_added)
                line += (f"; the added {rows:,} rows of a {2 * rows:,}-row table: cdc {cdc_added:,.0f} rows/s, "
                         f"COPY {copy_added:,.0f} rows/s")
            print(line, f"[{load()}]", flush=True)
            figures[f"round {r + 1} COPY"] = (copy_rate, "rows/s")
            figures[f"round {r + 1} snapshot"] = (rate, "rows/s")
        small = runs[len(runs) // 2]
        mem = small["memory"]
        print(f"{rows:,} rows: driver RSS growth python {mem['python']:.0f} MB, JVM {mem['jvm']:.0f} MB, source "
              f"process {mem['source']:.0f} MB; checkpoint {small['checkpoint']:,} bytes, snapshot.path "
              f"{small['snapshot_path']:,} bytes after the snapshot")
        figures["before first batch"] = (statistics.median(r["first"] for r in runs), "s")
        figures["checkpoint bytes"] = (small["checkpoint"], "bytes")

        with Writer(dsn, "bench", rows) as writer:
            busy = cdc_snapshot(spark, dsn, "bench", tmp, "writes", timing, writes=True)
        assert busy["rows"] == rows, (busy["rows"], rows)
        print(f"snapshot with a writer: {rows / busy['seconds']:,.0f} snapshot rows/s while the writer changed "
              f"{writer.changed / writer.seconds:,.0f} rows/s; the query delivered {busy['changes']:,} changes "
              f"meanwhile ({busy['changes'] / busy['seconds']:,.0f} changes/s) [{load()}]", flush=True)
        figures["snapshot rows/s with writer"] = (rows / busy["seconds"], "rows/s")
        figures["changes delivered during snapshot"] = (busy["changes"] / busy["seconds"], "rows/s")
        figures["writer rate"] = (writer.changed / writer.seconds, "rows/s")

        if exported:
            old = cdc_snapshot(spark, dsn, "bench", tmp, "exported", timing, mode="exported")
            copy_rate = copy_rows_per_s(dsn, rows)
            print(f"snapshot/COPY (snapshot.mode=exported, one run) {rows / old['seconds'] / copy_rate:.3f}")
            figures["exported snapshot"] = (rows / old["seconds"], "rows/s")

        if scale:
            create_bench_table(dsn, scale_rows, "bench_scale")
            big = cdc_snapshot(spark, dsn, "bench_scale", tmp, "scale", timing)
            assert big["rows"] == scale_rows, (big["rows"], scale_rows)
            mem = big["memory"]
            driver = mem["python"] + mem["jvm"] + mem["source"]
            print(f"{scale_rows:,} rows: {scale_rows / big['seconds']:,.0f} rows/s ({big['seconds']:.1f} s, "
                  f"{big['batches']} batches) [{load()}]")
            print(f"driver RSS growth {driver:.0f} MB (python {mem['python']:.0f}, JVM {mem['jvm']:.0f}, source "
                  f"process {mem['source']:.0f}; target <= 200)")
            print(f"checkpoint bytes {small['checkpoint']:,} at {rows:,} rows, {big['checkpoint']:,} at "
                  f"{scale_rows:,} (snapshot.path {big['snapshot_path']:,} bytes after the snapshot)")
            print(f"before the first batch {figures['before first batch'][0]:.3f} s at {rows:,} rows, "
                  f"{big['first']:.3f} s at {scale_rows:,} (target <= 1 s)")
            figures["scale driver RSS growth"] = (driver, "MB")
            figures["scale checkpoint bytes"] = (big["checkpoint"], "bytes")
            figures["scale before first batch"] = (big["first"], "s")
            figures["scale snapshot"] = (scale_rows / big["seconds"], "rows/s")
            if debezium:
                # One run each at the larger table: a streaming query's fixed second weighs a tenth as much there.
                dbz_big = debezium_snapshot(dsn, "bench_scale", scale_rows, tmp, "scale")
                figures["scale snapshot/debezium"] = dbz_big["seconds"] / big["seconds"]
                print(f"snapshot/debezium at {scale_rows:,} rows {figures['scale snapshot/debezium']:.2f} (one run "
                      f"each: Debezium {scale_rows / dbz_big['seconds']:,.0f} rows/s) [{load()}]", flush=True)
        spark.stop()

    ratio = statistics.median(copy_ratios)
    if debezium:
        figures["snapshot/debezium"] = statistics.median(dbz_ratios)
        print(f"snapshot/debezium {figures['snapshot/debezium']:.2f} (median of {rounds}; target >= 10, floor 5)")
    if marginal:
        figures["snapshot/COPY of the added rows"] = statistics.median(marginal_ratios)
        print(f"snapshot/COPY of the added rows {figures['snapshot/COPY of the added rows']:.3f} (a {2 * rows:,}-row "
              f"table less a {rows:,}-row one: the per-row rate without a query's fixed cost; median of {rounds})")
    figures["snapshot/COPY"] = ratio
    print(f"snapshot/COPY {ratio:.3f} (median of {rounds}; target >= 0.5) [{load()}]")
    append_record("postgres_source", figures, ratio=ratio, target=">= 0.5", params=params)
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
