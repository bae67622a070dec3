"""Fixtures of the real-Debezium tests: a database of their own on the session's PostgreSQL server
(``postgres_server`` of tests/conftest.py, ``wal_level=logical``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Database:
    """Where the engine connects: ``user`` at 127.0.0.1:``port``/``name`` (trust authentication)."""

    port: int
    name: str
    user: str
    dsn: str

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)


@pytest.fixture(scope="module")
def debezium_db(postgres_server: Any, request: pytest.FixtureRequest) -> Database:
    """A fresh database per test module (the engine's replication slots and publications stay in it)."""
    import hashlib

    from psycopg.conninfo import conninfo_to_dict

    name = "dbz_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    dsn = str(postgres_server.create_database(name))
    info = conninfo_to_dict(dsn)
    return Database(int(info.get("port", 5432)), name, str(info["user"]), dsn)
