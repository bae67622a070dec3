"""``cdc verify`` of a PostgreSQL table equal to its Delta table, against ``COPY ... TO`` of the same table.

A real PostgreSQL (``cdc.servers.postgres``) holds ``bench`` (id bigint key, text, numeric(12,2), timestamptz,
int) with ``--rows`` rows; its Delta table (delta-rs) holds the same rows, as the sink writes them (plus
``_seq``). Paired rounds, in this order each round:

- ``COPY (SELECT * FROM bench) TO STDOUT`` read by psycopg: the time to get the table out of PostgreSQL at all;
- :func:`cdc.verify.compare.verify` (the ``cdc verify`` command's work, interpreter start excluded): chunk
  checksums in PostgreSQL while the Delta side reads, encodes and hashes its rows.

Printed: each round's figures, the medians, ``verify/COPY`` (median of the rounds' time ratios; target <= 2),
then the time of a verify that finds 100 rows changed in the Delta table at scattered keys (every one of them
named), and last ``ratio <verify/COPY>``. The load average is printed with the figures: on a shared machine
they are noisy.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import append_record  # noqa: E402 (after the path is set)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def create_table(dsn: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, name text, amount numeric(12,2), at timestamptz, "
                     "n int)")
        conn.execute("INSERT INTO bench SELECT g, 'customer-' || g, g * 1.25, now(), g %% 1000 "
                     "FROM generate_series(1, %s) g", (rows,))
        conn.execute("VACUUM ANALYZE bench")


def delta_copy(dsn: str, path: str) -> None:
    """The table's rows into a Delta table, typed as the sink writes them, with a ``_seq`` column."""
    import psycopg
    import pyarrow as pa
    from deltalake import write_deltalake
    from psycopg import sql

    from cdc.backends.postgres import catalog
    from cdc.backends.postgres.chunks import copy_csv

    with psycopg.connect(dsn) as conn:
        info = catalog.describe(conn, "public.bench")
        with conn.transaction():
            table = copy_csv(conn, info, sql.SQL("true"), info.arrow_schema())
    table = table.append_column("_seq", pa.array([0] * table.num_rows, pa.int64()))
    write_deltalake(path, table, mode="overwrite")


def copy_seconds(dsn: str) -> float:
    import psycopg

    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        start = time.perf_counter()
        with cur.copy("COPY (SELECT * FROM bench) TO STDOUT") as copy:
            for _ in copy:
                pass
        return time.perf_counter() - start


def verify_seconds(dsn: str, path: str, chunk_rows: int) -> tuple[float, int]:
    from cdc.backends.postgres.verify import PostgresVerifySource
    from cdc.verify.compare import verify

    start = time.perf_counter()
    source = PostgresVerifySource(dsn, "public.bench")
    try:
        report = verify(source, path, chunk_rows=chunk_rows, rechecks=1)
    finally:
        source.close()
    return time.perf_counter() - start, sum(len(c.rows) for c in report.differences)


def scatter(path: str, rows: int, count: int) -> None:
    """Change the name of ``count`` rows at scattered keys, directly in the Delta table."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    table = DeltaTable(path).to_pyarrow_table()
    ids = pa.array(random.Random(1).sample(range(1, rows + 1), count), pa.int64())
    name = pc.if_else(pc.is_in(table.column("id"), ids), "tampered", table.column("name"))
    write_deltalake(path, table.set_column(table.schema.get_field_index("name"), "name", name), mode="overwrite")


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--rounds", default=3, show_default=True, help="Paired rounds (COPY, verify) per median.")
@click.option("--chunk-rows", default=50_000, show_default=True)
def main(rows: int, rounds: int, chunk_rows: int) -> None:
    from cdc.servers.postgres import PostgresServer

    params = {"rows": rows, "rounds": rounds, "chunk_rows": chunk_rows}
    figures: dict[str, object] = {}
    with PostgresServer() as pg, tempfile.TemporaryDirectory() as tmp:
        dsn = pg.create_database("bench")
        create_table(dsn, rows)
        path = str(Path(tmp) / "bench")
        delta_copy(dsn, path)
        verify_seconds(dsn, path, chunk_rows)  # warm-up: imports, DuckDB, the table's pages in memory
        ratios, copies, verifies = [], [], []
        for r in range(rounds):
            c = copy_seconds(dsn)
            v, differing = verify_seconds(dsn, path, chunk_rows)
            assert differing == 0, f"the equal table was reported different ({differing} rows)"
            copies.append(c)
            verifies.append(v)
            ratios.append(v / c)
            print(f"round {r + 1}: COPY {c:.3f} s; verify {v:.3f} s; verify/COPY {v / c:.3f} [{load()}]")
            figures[f"round {r + 1} COPY"] = (c, "s")
            figures[f"round {r + 1} verify"] = (v, "s")
        ratio = statistics.median(ratios)
        print(f"COPY {statistics.median(copies):.3f} s (median of {rounds}, {rows:,} rows)")
        print(f"verify {statistics.median(verifies):.3f} s (median of {rounds}, {rows:,} rows)")
        print(f"verify/COPY {ratio:.3f} (median of {rounds}; target <= 2) [{load()}]")
        scatter(path, rows, 100)
        s, differing = verify_seconds(dsn, path, chunk_rows)
        assert differing == 100, f"100 rows changed in Delta, {differing} reported"
        print(f"verify with 100 scattered differing rows {s:.3f} s ({differing} rows named) [{load()}]")
        figures["COPY"] = (statistics.median(copies), "s")
        figures["verify"] = (statistics.median(verifies), "s")
        figures["verify/COPY"] = ratio
        figures["verify, 100 differing rows"] = (s, "s")
    append_record("verify", figures, ratio=ratio, target="<= 2", params=params)
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
