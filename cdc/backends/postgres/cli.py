"""``cdc postgres``: tools of the PostgreSQL backend (list and drop a query's replication slot, ask running queries
for a table's re-snapshot).

A replication slot keeps every WAL segment from its position on until it is advanced or dropped: a query
that is gone for good must have its slot dropped, else the server's disk fills up.
"""

from __future__ import annotations

import json
import sys

import click

from cdc.errors import requires_extra


def _dsn(dsn: str | None) -> str:
    if dsn:
        return dsn
    raise click.UsageError("give --dsn or set CDC_POSTGRES_DSN (libpq URI; keep the password in PGPASSWORD)")


@click.group("postgres")
def cli() -> None:
    """PostgreSQL backend tools."""


_DSN_HELP = ("libpq connection URI of the database, without the password: libpq reads it from PGPASSWORD or "
             "~/.pgpass.")


@cli.command("slots")
@click.option("--dsn", envvar="CDC_POSTGRES_DSN", show_envvar=True, help=_DSN_HELP)
def list_slots(dsn: str | None) -> None:
    """List the logical replication slots of the database and the WAL each one retains."""
    with requires_extra("postgres", "cdc postgres"):
        import psycopg

    with psycopg.connect(_dsn(dsn), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT slot_name, plugin, active, confirmed_flush_lsn::text, "
            "pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) FROM pg_replication_slots "
            "WHERE slot_type = 'logical' AND database = current_database() ORDER BY slot_name"
        ).fetchall()
    for name, plugin, active, confirmed, retained in rows:
        click.echo(json.dumps({"slot": name, "plugin": plugin, "active": active, "confirmed": confirmed,
                               "retained_wal": retained}))


@cli.command("drop-slot")
@click.argument("slot")
@click.option("--dsn", envvar="CDC_POSTGRES_DSN", show_envvar=True, help=_DSN_HELP)
@click.option("--publication/--no-publication", default=False, help="Also drop the publication named like the slot.")
@click.option("--snapshot-path", type=click.Path(file_okay=False), default=None,
              help="Also remove the slot's materialised snapshot under this snapshot.path.")
def drop_slot(slot: str, dsn: str | None, publication: bool, snapshot_path: str | None) -> None:
    """Drop SLOT (a query's replication slot) so PostgreSQL stops retaining WAL for it."""
    import shutil
    from pathlib import Path

    with requires_extra("postgres", "cdc postgres"):
        import psycopg
        from psycopg import sql

        from cdc.backends.postgres import connection

    with psycopg.connect(_dsn(dsn), autocommit=True) as conn:
        if not connection.drop_slot(conn, slot):
            click.echo(f"no replication slot {slot!r}", err=True)
            sys.exit(1)
        click.echo(f"dropped replication slot {slot}")
        if publication:
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))
            click.echo(f"dropped publication {slot}")
    if snapshot_path:
        shutil.rmtree(Path(snapshot_path) / slot, ignore_errors=True)


@cli.command("resnapshot")
@click.option("--dsn", envvar="CDC_POSTGRES_DSN", show_envvar=True, help=_DSN_HELP)
@click.option("--table", "table", required=True,
              help="The table to snapshot again: `schema.table`, or `table` for schema public.")
@click.option("--slot", default=None,
              help="Only the query of this replication slot (`cdc postgres slots` lists them); default: every query "
                   "that reads the table.")
def resnapshot(dsn: str | None, table: str, slot: str | None) -> None:
    """Ask the running queries that read TABLE to snapshot it again in chunks while their other tables keep
    streaming; once its last chunk is delivered, the rows the source no longer has are deleted from the sink.

    Writes a logical decoding message into the WAL (pg_logical_emit_message): the queries act on it when they
    reach it, in order with the changes around it. A query stopped now acts on it when it runs again."""
    with requires_extra("postgres", "cdc postgres"):
        import psycopg

        from cdc.backends.postgres import signals
        from cdc.backends.postgres.catalog import describe
        from cdc.backends.postgres.errors import NoPrimaryKeyError
        from cdc.backends.postgres.positions import format_lsn
        from cdc.errors import OptionError

    name = table if "." in table else f"public.{table}"
    with psycopg.connect(_dsn(dsn), autocommit=True) as conn:
        try:
            info = describe(conn, name)
        except (OptionError, NoPrimaryKeyError) as exc:
            raise click.BadParameter(str(exc).removeprefix("option 'tables': "), param_hint="'--table'") from None
        if slot is not None and not conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND database = current_database()",
                (slot,)).fetchone():
            raise click.BadParameter(f"no replication slot {slot!r} in this database (cdc postgres slots lists them)",
                                     param_hint="'--slot'")
        try:
            lsn = signals.emit_resnapshot(conn, info.name, slot)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise click.ClickException(f"{str(exc).strip()}: {signals.PRIVILEGE}") from None
    click.echo(json.dumps({"resnapshot": info.name, "slot": slot, "lsn": format_lsn(lsn)}))
