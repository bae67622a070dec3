"""A harness over a real PostgreSQL database: tables with primary keys, rows written by psycopg, changes read
through a real logical replication slot."""

from __future__ import annotations

import random
from typing import Any

import psycopg

from cdc.backend import Backend, open_backend
from cdc.backends.postgres import connection
from cdc.testing import Harness


class PostgresHarness(Harness):
    """``append(n)`` inserts ``n`` new rows of ``items``, one transaction each unless ``txn_size`` says more
    (the contract suite's budgets count records: a transaction is never split)."""

    supports_split = False
    supports_merge = False

    def __init__(self, dsn: str, tables: tuple[str, ...] = ("items",), create: bool = True, **options: str) -> None:
        self.dsn = dsn
        self.tables = tables
        self.conn = psycopg.connect(dsn, autocommit=True)
        for t in tables if create else ():
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {t} (id bigint PRIMARY KEY, v text, n int)".encode())
        self.options = {"dsn": dsn, "tables": ",".join(tables), **options}
        self.next_id = 0
        self.txn_size = 1
        self.backends: list[Backend] = []
        self.backend().prepare_start()  # creates the slot: changes from here on are held

    def backend(self) -> Backend:
        b = open_backend("postgres", self.options)
        self.backends.append(b)
        return b

    def append(self, n: int, channel: str | None = None) -> None:
        table = self.tables[0]
        for lo in range(0, n, self.txn_size):
            with self.conn.transaction():
                for i in range(lo, min(n, lo + self.txn_size)):
                    self.conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)".encode(),
                                      (self.next_id + i, f"v{self.next_id + i}", i))
        self.next_id += n

    def execute(self, query: str, params: Any = None) -> None:
        self.conn.execute(query.encode(), params)

    def random_transaction(self, rng: random.Random, size: int) -> None:
        """A transaction of ``size`` random inserts, updates and deletes over every table."""
        with self.conn.transaction():
            for _ in range(size):
                t = rng.choice(self.tables)
                k = rng.randrange(30)
                op = rng.random()
                if op < 0.5:
                    self.conn.execute(
                        f"INSERT INTO {t} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
                        "n = excluded.n".encode(), (k, f"r{rng.random():.6f}", rng.randrange(1000)))
                elif op < 0.8:
                    self.conn.execute(f"UPDATE {t} SET n = %s WHERE id = %s".encode(), (rng.randrange(1000), k))
                else:
                    self.conn.execute(f"DELETE FROM {t} WHERE id = %s".encode(), (k,))

    def close(self) -> None:
        slot = self.backends[0].slot if self.backends else None  # type: ignore[attr-defined]
        for b in self.backends:
            b.close()
        if slot is not None:  # a slot left behind would hold the session server's WAL forever
            connection.drop_slot(self.conn, slot)
        self.conn.close()
