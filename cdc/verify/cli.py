"""``cdc verify``: compare a source table with its Delta table (exit 0: equal, 1: different, 2: cannot compare)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from cdc.errors import requires_extra

if TYPE_CHECKING:
    from cdc.verify.compare import VerifySource

_BACKENDS = ("postgres", "mysql")
_DSN_ENV = {"postgres": "CDC_POSTGRES_DSN", "mysql": "CDC_MYSQL_DSN"}


class _CannotCompare(click.ClickException):
    exit_code = 2


@click.command("verify")
@click.argument("table")
@click.argument("delta_path")
@click.option("--backend", type=click.Choice(_BACKENDS), default="postgres", show_default=True,
              help="The source's backend.")
@click.option("--dsn",
              help="The database, without the password. postgres: a libpq connection URI (the password from "
                   "PGPASSWORD or ~/.pgpass; default: CDC_POSTGRES_DSN). mysql: mysql://user@host[:port][/database], "
                   "MariaDB (the password from MYSQL_PWD; default: CDC_MYSQL_DSN).")
@click.option("--slot", default=None,
              help="postgres: the query's replication slot (see `cdc postgres slots`): its confirmed position is the "
                   "pipeline's committed position, which the Delta table is compared at. Without it (or "
                   "--checkpoint), differences newer than a read are still told by _seq, but changes the pipeline "
                   "has not written yet are reported.")
@click.option("--checkpoint", default=None, metavar="CHECKPOINT",
              help="mysql: the query's Spark checkpoint (a path or a URI, as for `cdc offsets`): the end of its "
                   "last committed batch is the pipeline's committed position.")
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
def main(table: str, delta_path: str, backend: str, dsn: str | None, slot: str | None, checkpoint: str | None,
         chunk_rows: int, rechecks: int, wait_timeout: float, whole_rows: int, exclude: tuple[str, ...],
         as_json: bool) -> None:
    """Compare TABLE (postgres: schema.table; mysql: database.table) with the Delta table at DELTA_PATH, chunk by
    chunk with checksums computed where the data is; only differing chunks are compared row by row. Prints the
    differing key ranges and rows and a summary line. Exit status: 0 equal, 1 different, 2 cannot compare (the table does not exist or has
    no primary key, DELTA_PATH is not its Delta table)."""
    with requires_extra("delta", "cdc verify"):
        import deltalake  # noqa: F401
        import duckdb  # noqa: F401

    from cdc.verify.compare import VerifyError, iter_lines, verify

    dsn = dsn or os.environ.get(_DSN_ENV[backend])
    if not dsn:
        raise _CannotCompare(f"give --dsn or set {_DSN_ENV[backend]} (" + (
            "libpq URI; keep the password in PGPASSWORD)" if backend == "postgres" else
            "mysql://user@host[:port][/database]; keep the password in MYSQL_PWD)"))
    if backend == "postgres" and checkpoint is not None:
        raise _CannotCompare("--checkpoint is for --backend mysql; the postgres backend's position is its --slot")
    if backend == "mysql" and slot is not None:
        raise _CannotCompare("--slot is for --backend postgres; give the mysql query's --checkpoint")
    try:
        source: VerifySource = _source(backend, dsn, table, slot, checkpoint, exclude)
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


def _source(backend: str, dsn: str, table: str, slot: str | None, checkpoint: str | None,
            exclude: tuple[str, ...]) -> VerifySource:
    """The backend's side of the comparison; a server it cannot reach or log in to is a :class:`_CannotCompare`."""
    if backend == "mysql":
        with requires_extra("mysql", "cdc verify --backend mysql"):
            from cdc.backends.mysql.errors import MissingPrivilegeError
            from cdc.backends.mysql.verify import MySQLVerifySource
        from cdc.errors import BackendUnavailableError

        try:
            return MySQLVerifySource(dsn, table, checkpoint, exclude)
        except (BackendUnavailableError, MissingPrivilegeError) as e:
            raise _CannotCompare(f"cannot connect to the database: {e}") from None
    with requires_extra("postgres", "cdc verify"):
        import psycopg

        from cdc.backends.postgres.verify import PostgresVerifySource
    try:
        return PostgresVerifySource(dsn, table, slot, exclude)
    except psycopg.OperationalError as e:
        raise _CannotCompare(f"cannot connect to the database: {e}") from None
