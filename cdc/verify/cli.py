"""``cdc verify``: compare a source table with its Delta table (exit 0: equal, 1: different, 2: cannot compare)."""

from __future__ import annotations

import sys

import click

from cdc.errors import requires_extra

_BACKENDS = ("postgres",)


class _CannotCompare(click.ClickException):
    exit_code = 2


@click.command("verify")
@click.argument("table")
@click.argument("delta_path")
@click.option("--backend", type=click.Choice(_BACKENDS), default="postgres", show_default=True,
              help="The source's backend.")
@click.option("--dsn", envvar="CDC_POSTGRES_DSN", show_envvar=True,
              help="libpq connection URI of the database, without the password: libpq reads it from PGPASSWORD "
                   "or ~/.pgpass.")
@click.option("--slot", default=None,
              help="The query's replication slot (see `cdc postgres slots`): its confirmed position is the "
                   "pipeline's committed position, which the Delta table is compared at. Without it, differences "
                   "newer than a read are still told by _seq, but changes the pipeline has not written yet are "
                   "reported.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Keys per chunk (one checksum each).")
@click.option("--rechecks", type=click.IntRange(min=1), default=3, show_default=True,
              help="How many times a differing chunk is read again before its difference is reported.")
@click.option("--wait-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for the pipeline to pass a read's position (with --slot).")
@click.option("--whole-rows", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="A Delta table of at most this many rows is read into memory whole (fastest); a larger one "
                   "keyed by one integer column is read by groups of chunks of about this many rows, its memory "
                   "bounded by a group.")
@click.option("--exclude", multiple=True, metavar="COLUMN",
              help="A source column the Delta table does not store (the sink's except_column_list); not compared. "
                   "Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the report) instead of text.")
def main(table: str, delta_path: str, backend: str, dsn: str | None, slot: str | None, chunk_rows: int,
         rechecks: int, wait_timeout: float, whole_rows: int, exclude: tuple[str, ...], as_json: bool) -> None:
    """Compare TABLE (schema.table) with the Delta table at DELTA_PATH, chunk by chunk with checksums computed
    where the data is; only differing chunks are compared row by row. Prints the differing key ranges and rows
    and a summary line. Exit status: 0 equal, 1 different, 2 cannot compare (the table does not exist or has
    no primary key, DELTA_PATH is not its Delta table)."""
    with requires_extra("postgres", "cdc verify"):
        import psycopg

        from cdc.backends.postgres.verify import PostgresVerifySource
    with requires_extra("delta", "cdc verify"):
        import deltalake  # noqa: F401
        import duckdb  # noqa: F401

    from cdc.verify.compare import VerifyError, iter_lines, verify

    if not dsn:
        raise _CannotCompare("give --dsn or set CDC_POSTGRES_DSN (libpq URI; keep the password in PGPASSWORD)")
    try:
        source = PostgresVerifySource(dsn, table, slot, exclude)
    except psycopg.OperationalError as e:
        raise _CannotCompare(f"cannot connect to the database: {e}") from None
    except VerifyError as e:
        raise _CannotCompare(str(e)) from None
    try:
        report = verify(source, delta_path, chunk_rows=chunk_rows, rechecks=rechecks, wait_timeout=wait_timeout,
                        whole_rows=whole_rows)
    except VerifyError as e:
        raise _CannotCompare(str(e)) from None
    finally:
        source.close()
    if as_json:
        click.echo(report.to_json())
    else:
        for line in iter_lines(report):
            click.echo(line)
    sys.exit(0 if report.equal else 1)
