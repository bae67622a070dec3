"""How often a query creates its replication slot, as the real server records it.

Creating a logical slot waits for every transaction running at that moment to end (its consistent point),
so a snapshot query must create its slot once, with the exported snapshot, never first a plain slot that
is then dropped for an export. The server logs every statement and replication command of this test's
connections (``log_statement`` and ``log_replication_commands`` set through the DSN), and the test counts
the creations and drops in that log.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg

from cdc.backend import open_backend
from cdc.backends.postgres import connection
from cdc.planner import Planner
from cdc.testing import read_range

_CREATE = re.compile(r"pg_create_logical_replication_slot\(|received replication command: CREATE_REPLICATION_SLOT")
_DROP = re.compile(r"pg_drop_replication_slot\(|received replication command: DROP_REPLICATION_SLOT")


class ServerLog:
    """The statements the server logged from here on."""

    def __init__(self, server: Any) -> None:
        self.path = Path(server.data_dir) / "postgres.log"
        self.start = self.path.stat().st_size

    def count(self, pattern: re.Pattern[str]) -> int:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            text = f.read().decode(errors="replace")
        return sum(1 for line in text.splitlines() if "LOG:" in line and pattern.search(line))


def test_a_snapshot_query_creates_its_slot_once_and_a_restart_keeps_it(
    postgres_server: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    dsn = postgres_dsn + "?options=-c%20log_statement%3Dall%20-c%20log_replication_commands%3Don"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g")
    options = {"dsn": dsn, "tables": "items", "slot.name": "once", "snapshot.path": str(tmp_path / "snap")}
    server_log = ServerLog(postgres_server)
    backend = open_backend("postgres", options)
    try:
        planner = Planner(backend)
        # Spark's order under Trigger.AvailableNow: the target (every channel's head), then the initial offset.
        planner.until("latest")
        start = planner.initial("snapshot")
        assert server_log.count(_CREATE) == 1, "the slot must be created once, with its exported snapshot"
        assert server_log.count(_DROP) == 0
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (51, 'after the cut')")
        backend.close()

        # A restarted driver asks for the initial offset again: the same slot, the same cut, the change
        # written meanwhile still held (nothing created, nothing dropped).
        backend = open_backend("postgres", options)
        planner = Planner(backend)
        planner.until("latest")
        assert planner.initial("snapshot") == start
        assert server_log.count(_CREATE) == 1 and server_log.count(_DROP) == 0
        cut = start["channels"]["changes"]["pos"]
        end = planner.next(planner.next(start))  # the snapshot chunks, then the changes after the cut
        changes = read_range(backend, "changes", cut, end["channels"]["changes"]["pos"])
        assert changes.column("id").to_pylist() == [51]
    finally:
        backend.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            connection.drop_slot(conn, "once")
