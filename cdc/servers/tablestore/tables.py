"""Tables: the schema catalog (name, primary key, defined columns, options, stream settings)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdc.backends.tablestore.plainbuffer import AUTO_INCREMENT, PrimaryKeyValue, Special

from .database import Database
from .errors import OTSError, not_exist, param_invalid
from .limits import MAX_DEFINED_COLUMNS, check_name, check_pk_values

PK_TYPES = {1: "INTEGER", 2: "STRING", 3: "BINARY", 5: "BOOLEAN"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tables(
    name TEXT PRIMARY KEY, pk TEXT NOT NULL, defined TEXT NOT NULL, options TEXT NOT NULL,
    stream TEXT NOT NULL, created_ms INTEGER NOT NULL, auto_incr INTEGER NOT NULL DEFAULT 0);
"""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class TableInfo:
    name: str
    pk: list[tuple[str, str]]  # (name, INTEGER|STRING|BINARY|BOOLEAN)
    auto_increment: set[str]
    defined: list[tuple[str, int]]
    options: dict[str, Any]
    stream: dict[str, Any]
    created_ms: int


class Tables:
    """The catalog, cached in memory (it changes only by CreateTable/DeleteTable)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)
        self._tables: dict[str, TableInfo] = {}
        self._load()
        db.on_rollback(self._load)

    def _load(self) -> None:
        self._tables.clear()
        for name, pk, defined, options, stream, created in self.db.execute(
            "SELECT name, pk, defined, options, stream, created_ms FROM tables"
        ):
            pk_list = json.loads(pk)
            self._tables[name] = TableInfo(
                name,
                [(n, t) for n, t, _ in pk_list],
                {n for n, _, auto in pk_list if auto},
                [tuple(d) for d in json.loads(defined)],
                json.loads(options),
                json.loads(stream),
                created,
            )

    def get(self, name: str) -> TableInfo:
        info = self._tables.get(name)
        if info is None:
            raise not_exist(f"Requested table {name!r} does not exist.")
        return info

    def names(self) -> list[str]:
        with self.db.lock:
            return sorted(self._tables)

    def add(
        self,
        db: sqlite3.Connection,
        name: str,
        pk: list[tuple[str, str, bool]],
        defined: list[tuple[str, int]],
        options: dict[str, Any],
        stream: dict[str, Any],
    ) -> None:
        """Record a new table (inside the caller's transaction)."""
        check_name("table", name)
        for column in [*(n for n, _, _ in pk), *(n for n, _ in defined)]:
            check_name("column", column)
        if len(defined) > MAX_DEFINED_COLUMNS:
            raise param_invalid(
                f"The number of predefined columns must be in range: [0, {MAX_DEFINED_COLUMNS}]."
            )
        if not pk:
            raise param_invalid("The number of primary key columns must be in range: [1, 4].")
        if len(pk) > 4:
            raise param_invalid("The number of primary key columns must be in range: [1, 4].")
        if len({n for n, _, _ in pk}) != len(pk):
            raise param_invalid("duplicated primary key name")
        if name in self._tables:
            raise OTSError("OTSObjectAlreadyExist", f"Requested table already exists: {name}.", 409)
        stream = {**stream, "stream_id": uuid.uuid4().hex, "last_enable_time": now_ms() * 1000}
        created = now_ms()
        db.execute(
            "INSERT INTO tables(name, pk, defined, options, stream, created_ms) VALUES (?, ?, ?, ?, ?, ?)",
            (name, json.dumps(pk), json.dumps(defined), json.dumps(options), json.dumps(stream), created),
        )
        self._tables[name] = TableInfo(
            name, [(n, t) for n, t, _ in pk], {n for n, _, a in pk if a}, defined, options, stream, created
        )

    def drop(self, db: sqlite3.Connection, name: str) -> None:
        db.execute("DELETE FROM tables WHERE name=?", (name,))
        self._tables.pop(name, None)

    def auto_increment(self, db: sqlite3.Connection, name: str) -> int:
        """The last auto-increment value handed out for ``name``."""
        return int(db.execute("SELECT auto_incr FROM tables WHERE name=?", (name,)).fetchone()[0] or 0)

    def set_auto_increment(self, db: sqlite3.Connection, name: str, value: int) -> None:
        db.execute("UPDATE tables SET auto_incr=? WHERE name=?", (value, name))


def check_pk(
    info: TableInfo,
    pk: Sequence[tuple[str, PrimaryKeyValue]],
    *,
    bound: bool = False,
    allow_auto: bool = False,
) -> None:
    """Names, order and types must match the schema (range bounds may use INF_MIN/INF_MAX)."""
    names = [n for n, _ in pk]
    expected = [n for n, _ in info.pk]
    if names != expected:
        raise param_invalid(f"Validate PK name fail. Input: {','.join(names)}, Meta: {','.join(expected)}.")
    for (name, value), (_, ptype) in zip(pk, info.pk, strict=True):
        if isinstance(value, Special):
            if value is AUTO_INCREMENT and allow_auto and name in info.auto_increment:
                continue
            if value is not AUTO_INCREMENT and bound:
                continue
            raise param_invalid(f"Primary key column {name!r} cannot be {value.name} here.")
        ok = {
            "INTEGER": isinstance(value, int) and not isinstance(value, bool),
            "STRING": isinstance(value, str),
            "BINARY": isinstance(value, bytes),
            "BOOLEAN": isinstance(value, bool),
        }[ptype]
        if not ok:
            raise param_invalid(
                f"Validate PK type fail. Column {name!r} is {ptype}, got {type(value).__name__}."
            )
    check_pk_values(pk)
