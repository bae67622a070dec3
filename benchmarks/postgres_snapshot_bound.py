"""The ceiling of any snapshot design on this machine: Spark tasks that ``COPY`` their own chunk straight from
PostgreSQL, against ``COPY ... TO`` of the whole table by one connection, in the same run.

Issue 14 asks the snapshot for >= 0.5x ``COPY ... TO``. Our snapshot exports the slot's snapshot and
materialises chunk files while the export is held, then Spark reads them (so a replay reads the same rows;
see ``cdc/backends/postgres/snapshot.py``). The design that could be faster would overlap the two: the
executors read PostgreSQL directly. This script measures that design's upper bound, stripped of everything
the real source must add: no exported snapshot, no replication slot, no chunk file kept for replays, no
change-model columns, no planning round trips: a minimal Python data source whose tasks each run
``COPY (SELECT ... WHERE ctid in their page range) TO STDOUT (FORMAT binary)`` and yield the rows as Arrow
columns, through the snapshot's own chunk read (``chunks.read_arrow``: the ADBC PostgreSQL driver), into
Spark's ``noop`` sink, with 2 and 4
tasks, twice each. ``COPY`` is measured before and after (the mean is the reference).

Last line: ``ratio <best direct read rows/s / COPY rows/s>``. If it is below 0.5, no overlap of export and
read reaches 0.5x on this machine.

    python benchmarks/postgres_snapshot_bound.py            # 1M rows
    python benchmarks/postgres_snapshot_bound.py --rows 200000
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from postgres_source import copy_rows_per_s, create_bench_table  # noqa: E402 (this script's folder)
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402
from record import append_record  # noqa: E402


class DirectReader(DataSourceReader):
    def __init__(self, options: dict[str, str], table: Any) -> None:
        self.options, self.table = options, table

    def partitions(self) -> list[InputPartition]:
        tasks, pages = int(self.options["tasks"]), int(self.options["pages"])
        step = -(-pages // tasks)
        return [InputPartition((i * step, (i + 1) * step if i < tasks - 1 else None)) for i in range(tasks)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from psycopg import sql

        from cdc.backends.postgres.chunks import read_arrow

        lo, hi = partition.value  # type: ignore[attr-defined]
        where = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({lo},0)"))
        if hi is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({hi},0)"))
        # The snapshot's own chunk read: COPY's binary format turned into Arrow columns by the ADBC driver.
        data = read_arrow(self.options["dsn"], None, self.table, where, (), self.table.arrow_schema())
        yield from data.to_batches(65_536)


class DirectSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pg_direct_bound"

    def _table(self) -> Any:
        import psycopg

        from cdc.backends.postgres.catalog import describe

        with psycopg.connect(self.options["dsn"]) as conn:
            return describe(conn, "public.bench")

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self._table().arrow_schema())

    def reader(self, schema: Any) -> DirectReader:
        return DirectReader(dict(self.options), self._table())


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
def main(rows: int) -> None:
    import psycopg

    from cdc.servers.postgres import PostgresServer
    from tests.conftest import spark_builder

    with PostgresServer() as pg:
        dsn = pg.create_database("bench")
        create_bench_table(dsn, rows)  # the table of postgres_source.py
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT pg_relation_size('bench') / current_setting('block_size')::int").fetchone()
            assert row is not None
            pages = int(row[0])
        copy_before = copy_rows_per_s(dsn, rows)
        spark = spark_builder("postgres-snapshot-bound").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(DirectSource)

        def run(tasks: int, table_pages: int) -> float:
            start = time.perf_counter()
            (spark.read.format("pg_direct_bound").option("dsn", dsn).option("tasks", str(tasks))
             .option("pages", str(table_pages)).load().write.format("noop").mode("overwrite").save())
            return time.perf_counter() - start

        run(2, 20)  # warm-up: Python workers and imports
        best = 0.0
        for tasks in (2, 4, 2, 4):
            seconds = run(tasks, pages)
            best = max(best, rows / seconds)
            print(f"direct read, {tasks} tasks: {rows / seconds:,.0f} rows/s ({seconds:.2f} s)")
        spark.stop()
        copy_after = copy_rows_per_s(dsn, rows)
        copy_rate = (copy_before + copy_after) / 2
        print(f"COPY TO: {copy_rate:,.0f} rows/s (before {copy_before:,.0f}, after {copy_after:,.0f})")
        print(f"best direct read: {best:,.0f} rows/s; 0.5x COPY would be {copy_rate / 2:,.0f} rows/s")
        append_record("postgres_snapshot_bound", {"best direct read": (best, "rows/s"), "COPY TO": (copy_rate, "rows/s")}, ratio=best / copy_rate, params={"rows": rows})
        print(f"ratio {best / copy_rate:.3f}")


if __name__ == "__main__":
    main()
