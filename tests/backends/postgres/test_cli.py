"""``cdc postgres drop-slot`` and ``cdc postgres slots`` against a real PostgreSQL."""

from __future__ import annotations

import psycopg
from click.testing import CliRunner

from cdc.cli import main


def test_drop_slot_releases_the_slot(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('cli_slot', 'pgoutput')")
    runner = CliRunner()
    listed = runner.invoke(main, ["postgres", "slots", "--dsn", postgres_dsn])
    assert listed.exit_code == 0 and '"slot": "cli_slot"' in listed.output
    dropped = runner.invoke(main, ["postgres", "drop-slot", "cli_slot", "--dsn", postgres_dsn])
    assert dropped.exit_code == 0, dropped.output
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cli_slot'").fetchone() == (0,)
    again = runner.invoke(main, ["postgres", "drop-slot", "cli_slot", "--dsn", postgres_dsn])
    assert again.exit_code == 1 and "no replication slot 'cli_slot'" in again.output
