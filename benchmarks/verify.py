"""``cdc verify`` of a PostgreSQL table equal to its Delta table, against ``COPY ... TO`` of the same table.

A real PostgreSQL (``cdc.servers.postgres``) holds ``bench`` (id bigint key, text, numeric(12,2), timestamptz,
int) with ``--rows`` rows; its Delta table (delta-rs) holds the same rows, as the sink writes them (plus
``_seq``). Paired rounds, in this order each round:

- ``COPY (SELECT * FROM bench) TO STDOUT`` read by psycopg: the time to get the table out of PostgreSQL at all;
- :func:`cdc.verify.compare.verify` (the ``cdc verify`` command's work, interpreter start excluded): chunk
  checksums in PostgreSQL while the Delta side reads, encodes and hashes its rows.

After the rounds, the ``cdc verify`` command's peak RSS and time (a child process each, interpreter start
included) over the Delta table written as files of 100,000 rows: read by groups of 100,000 rows, then whole (run at two ``--rows`` to see that
the first stays flat while the second grows).

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
    from cdc.backends.postgres.chunks import read_arrow

    with psycopg.connect(dsn) as conn:
        info = catalog.describe(conn, "public.bench")
    table = read_arrow(dsn, None, info, sql.SQL("true"), (), info.arrow_schema())
    table = table.append_column("_seq", pa.array([0] * table.num_rows, pa.int64()))
    write_deltalake(path, table, mode="overwrite")


def files_copy(path: str, to: str, rows: int) -> None:
    """The Delta table again, as files of ``rows`` rows each (as a pipeline's micro-batches write it)."""
    from deltalake import DeltaTable, write_deltalake

    table = DeltaTable(path).to_pyarrow_table()
    for at in range(0, table.num_rows, rows):
        write_deltalake(to, table.slice(at, rows), mode="append")


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


# VmHWM: the peak RSS of this process image (ru_maxrss would keep the forking benchmark's own peak).
_PEAK = ("import atexit, sys\n"
         "def peak():\n"
         "    hwm = [x for x in open('/proc/self/status') if x.startswith('VmHWM:')][0].split()[1]\n"
         "    print('peak', hwm, file=sys.stderr)\n"
         "atexit.register(peak)\n"
         "sys.argv = ['cdc', *sys.argv[1:]]\n"
         "from cdc.cli import main\n"
         "main()\n")


def command_peak(dsn: str, path: str, chunk_rows: int, whole_rows: int) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of the ``cdc verify`` command in a child process (interpreter start included),
    the Delta table read whole or by groups of about ``whole_rows`` rows."""
    import subprocess

    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, "verify", "public.bench", path, "--dsn", dsn,
                           "--chunk-rows", str(chunk_rows), "--whole-rows", str(whole_rows), "--rechecks", "1"],
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stdout + done.stderr
    peak = [line for line in done.stderr.splitlines() if line.startswith("peak ")][-1]
    return seconds, int(peak.split()[1]) / 1024


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
        # Memory of the command (a child each, its own peak RSS) over the table written as files of 100,000
        # rows: by groups of 100,000 rows, then read whole.
        files = str(Path(tmp) / "files")
        files_copy(path, files, 100_000)
        for label, whole_rows in (("groups of 100,000 rows", 100_000), ("read whole", rows)):
            t, mib = command_peak(dsn, files, chunk_rows, whole_rows)
            print(f"cdc verify, Delta table {label}: peak RSS {mib:.0f} MiB, {t:.3f} s "
                  f"(command, {rows:,} rows) [{load()}]")
            figures[f"cdc verify peak RSS, {label}"] = (mib, "MiB")
            figures[f"cdc verify command, {label}"] = (t, "s")
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
