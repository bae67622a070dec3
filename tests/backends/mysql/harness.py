"""A harness over a real MariaDB: tables with primary keys, rows written by PyMySQL, changes read from the
server's binary log."""

from __future__ import annotations

import random
from typing import Any

import pymysql
from tenacity import Retrying, stop_after_delay, wait_fixed

from cdc.backend import Backend, open_backend
from cdc.backends.mysql.options import parse_dsn
from cdc.testing import Harness


def connect(dsn: str) -> Any:
    return pymysql.connect(**parse_dsn(dsn).connect_args())  # type: ignore[arg-type]


def purge_binlogs(conn: Any) -> None:
    """Start a new binary log and drop the older ones, as a server expiring them would: ``earliest`` is then this
    test's start (the session's server holds every earlier test's changes, which planning from earliest would
    walk). MariaDB keeps a file until its binlog checkpoint has moved past it (crash recovery may need it), so
    the purge is repeated until it took."""
    with conn.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        current = cur.fetchone()[0]
        for attempt in Retrying(stop=stop_after_delay(30), wait=wait_fixed(0.05), reraise=True):
            with attempt:
                cur.execute("PURGE BINARY LOGS TO %s", (current,))
                cur.execute("SHOW BINARY LOGS")
                assert [r[0] for r in cur.fetchall()] == [current], "an older binary log is still in use"


class MySQLHarness(Harness):
    """``append(n)`` inserts ``n`` new rows of ``items``, one transaction each unless ``txn_size`` says more
    (the contract suite's budgets count records: a transaction is never split)."""

    supports_split = False
    supports_merge = False
    exact_counts_without_budget = False  # without a budget, planning counts rows events, not rows

    def __init__(self, dsn: str, tables: tuple[str, ...] = ("items",), create: bool = True, fresh: bool = True,
                 **options: str) -> None:
        self.dsn = dsn
        self.tables = tables
        self.database = parse_dsn(dsn).database
        self.conn = connect(dsn)
        if fresh:
            purge_binlogs(self.conn)
        for t in tables if create else ():
            self.execute(f"CREATE TABLE IF NOT EXISTS `{t}` (id BIGINT PRIMARY KEY, v VARCHAR(200), n INT)")
        self.options = {"dsn": dsn, "tables": ",".join(tables), **options}
        self.next_id = 0
        self.txn_size = 1
        self.backends: list[Backend] = []

    def backend(self) -> Backend:
        b = open_backend("mysql", self.options)
        self.backends.append(b)
        return b

    def backend_with(self, **options: str) -> Backend:
        """A backend of other options (closed with the harness)."""
        b = open_backend("mysql", options)
        self.backends.append(b)
        return b

    def execute(self, query: str, params: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(query, params)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return list(cur.fetchall())

    def append(self, n: int, channel: str | None = None) -> None:
        table = self.tables[0]
        for lo in range(0, n, self.txn_size):
            self.conn.begin()
            with self.conn.cursor() as cur:
                cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, %s)",
                                [(self.next_id + i, f"v{self.next_id + i}", i) for i in range(lo, min(n, lo + self.txn_size))])
            self.conn.commit()
        self.next_id += n

    def start_chunked(self, rows: int, chunk_rows: int) -> Backend:
        table = self.tables[0]
        with self.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s, 0)", [(i, f"v{i}") for i in range(rows)])
        self.next_id = max(self.next_id, rows)
        self.options.update({"snapshot.chunkRows": str(chunk_rows), "snapshot.chunksPerBatch": "1"})
        assert "snapshot.path" in self.options, "a chunked harness is made with snapshot.path"
        return self.backend()

    def update(self, n: int) -> None:
        table = self.tables[0]
        self.conn.begin()
        with self.conn.cursor() as cur:
            for i in range(n):
                cur.execute(f"UPDATE `{table}` SET n = n + 1, v = %s WHERE id = %s", (f"u{i}", (i * 7) % max(1, self.next_id)))
        self.conn.commit()

    def table(self) -> dict[Any, dict[str, Any]]:
        return {(r[0],): {"id": r[0], "v": r[1], "n": r[2]} for r in self.rows(f"SELECT id, v, n FROM `{self.tables[0]}`")}

    def random_transaction(self, rng: random.Random, size: int) -> None:
        """A transaction of ``size`` random inserts, updates (some of the key) and deletes over every table."""
        self.conn.begin()
        with self.conn.cursor() as cur:
            for _ in range(size):
                t = rng.choice(self.tables)
                k = rng.randrange(30)
                op = rng.random()
                if op < 0.45:
                    cur.execute(f"INSERT INTO `{t}` VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v), "
                                "n = VALUES(n)", (k, f"r'{rng.random():.6f}\\", rng.randrange(1000)))
                elif op < 0.7:
                    cur.execute(f"UPDATE `{t}` SET n = %s WHERE id = %s", (rng.randrange(1000), k))
                elif op < 0.8:  # a key change, unless the new key is taken
                    cur.execute(f"UPDATE IGNORE `{t}` SET id = %s WHERE id = %s", (rng.randrange(30), k))
                else:
                    cur.execute(f"DELETE FROM `{t}` WHERE id = %s", (k,))
        self.conn.commit()

    def close(self) -> None:
        for b in self.backends:
            b.close()
        self.conn.close()
