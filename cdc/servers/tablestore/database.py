"""The server's one sqlite database (WAL journal) and the one lock that serialises every operation.

An acknowledged write survives ``kill -9``: each operation commits before its response is sent. The
server is a test and demo double, so a single writer keeps the semantics obvious.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Database:
    """Owns the connection and the lock; the parts (tables, shards, tunnels...) create their own tables.

    Parts that cache state derived from the database register a hook that runs after a rollback, so a
    failed operation leaves no cache ahead of what is stored.
    """

    FILE_NAME = "tablestore.sqlite"

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.conn = sqlite3.connect(data_dir / self.FILE_NAME, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self._rollback_hooks: list[Callable[[], None]] = []

    def create(self, schema: str) -> None:
        """Create the tables of one part (``CREATE TABLE IF NOT EXISTS`` statements)."""
        self.conn.executescript(schema)

    def on_rollback(self, hook: Callable[[], None]) -> None:
        self._rollback_hooks.append(hook)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    @contextmanager
    def txn(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock; any exception rolls it back and resets the caches."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                for hook in self._rollback_hooks:
                    hook()
                raise
            else:
                self.conn.execute("COMMIT")

    def close(self) -> None:
        with self.lock:
            self.conn.close()
