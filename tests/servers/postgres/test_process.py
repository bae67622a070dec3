"""The PostgreSQL server process: start, logical WAL, kill -9 and restart on the same data, clean stop."""

from __future__ import annotations

import psycopg
import pytest

from cdc.servers.postgres import PostgresServer


@pytest.mark.slow  # a durable cluster (fsync on): ~10 s under load
def test_kill_restart_keeps_committed_data_and_stop_removes_it() -> None:
    server = PostgresServer(durable=True).start()
    try:
        dsn = server.create_database("life")
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
            conn.execute("CREATE TABLE t (id int primary key)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
        port = server.port
        server.kill()
        assert not server.running
        server.start()
        assert server.port == port
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    finally:
        server.stop()
    assert not server.running
    assert not server.data_dir.exists()
