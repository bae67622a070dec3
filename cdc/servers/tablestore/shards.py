"""Shards (partitions) and their change logs: split, merge, trim.

A table's key space is cut into shards, each an interval ``[lo, hi)`` of order-preserving keys
(:mod:`.keys`); exactly the open shards cover the key space. Every write appends one record to the change
log of the open shard holding its key: ``(shard, seq)`` with ``seq`` counting from 1, plus the stream
record itself (PlainBuffer with the sequence-info extension ``(epoch=1, timestamp=commit micros,
row_index=position in the request)``). A **split** seals a shard and opens two children covering its
interval; a **merge** seals two adjacent open shards and opens one child covering both. A sealed shard
never gets another record.

Whoever follows shards (the tunnels) subscribes a :class:`ShardListener`: it hears of child shards and of
trimmed logs inside the transaction that makes them, so it never reads shard internals to find out.
"""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.backends.tablestore.plainbuffer import PrimaryKeyValue, Special

from .database import Database
from .errors import OTSError, param_invalid
from .keys import decode_key, encode_value
from .rows import Rows
from .tables import Tables, now_ms

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS shards(
    shard_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, lo BLOB NOT NULL, hi BLOB, parents TEXT NOT NULL,
    sealed INTEGER NOT NULL, created_ms INTEGER NOT NULL, ord INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log(shard_id TEXT NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL,
    action INTEGER NOT NULL, record BLOB NOT NULL, PRIMARY KEY(shard_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trims(shard_id TEXT PRIMARY KEY, upto INTEGER NOT NULL);
"""
_SHARD_COLUMNS = "shard_id, tbl, lo, hi, parents, sealed, ord"


@dataclass
class ShardInfo:
    shard_id: str
    table: str
    lo: bytes
    hi: bytes | None
    parents: list[str]
    sealed: bool
    ord: int

    def holds(self, key: bytes) -> bool:
        return self.lo <= key and (self.hi is None or key < self.hi)


class ShardListener(Protocol):
    """Told of shard changes inside the transaction that makes them (``db`` is that transaction)."""

    def children_opened(
        self, db: sqlite3.Connection, table: str, parents: list[str], children: list[str]
    ) -> None:
        """``parents`` were sealed by a split or merge that opened ``children``."""

    def log_trimmed(self, db: sqlite3.Connection, shard_id: str, upto: int) -> None:
        """The change log of ``shard_id`` lost every record up to position ``upto``."""


class Shards:
    """Shards, change logs and the commit clock (timestamps strictly increase across all logs)."""

    def __init__(self, db: Database, tables: Tables) -> None:
        self.db = db
        self.tables = tables
        self.rows: Rows | None = None  # set by the store once rows exist (they log to shards)
        db.create(_SCHEMA)
        self._listeners: list[ShardListener] = []
        self._open: dict[str, list[ShardInfo]] = {}
        self._last_seq: dict[str, int] = {}
        self._reload_positions()
        row = db.execute("SELECT MAX(ts) FROM log").fetchone()
        self._last_ts = int(row[0] or 0)
        db.on_rollback(self._forget)

    def subscribe(self, listener: ShardListener) -> None:
        self._listeners.append(listener)

    def _reload_positions(self) -> None:
        self._last_seq = {
            r[0]: r[1] for r in self.db.execute("SELECT shard_id, MAX(seq) FROM log GROUP BY shard_id")
        }

    def _forget(self) -> None:
        self._open.clear()
        self._reload_positions()

    # ------------------------------------------------------------------ lookups
    @staticmethod
    def _shard(r: Sequence[Any]) -> ShardInfo:
        return ShardInfo(
            r[0], r[1], bytes(r[2]), None if r[3] is None else bytes(r[3]), json.loads(r[4]), bool(r[5]), r[6]
        )

    def open_shards(self, table: str) -> list[ShardInfo]:
        """The open shards of ``table``, ordered by key."""
        cached = self._open.get(table)
        if cached is None:
            cached = [
                self._shard(r)
                for r in self.db.execute(
                    f"SELECT {_SHARD_COLUMNS} FROM shards WHERE tbl=? AND sealed=0 ORDER BY lo", (table,)
                )
            ]
            self._open[table] = cached
        return cached

    def shard_for(self, table: str, key: bytes) -> ShardInfo:
        for shard in self.open_shards(table):
            if shard.holds(key):
                return shard
        raise OTSError("OTSInternalServerError", f"no open shard holds a key of table {table}", 500)

    def is_sealed(self, shard_id: str) -> bool:
        r = self.db.execute("SELECT sealed FROM shards WHERE shard_id=?", (shard_id,)).fetchone()
        return bool(r and r[0])

    def last_seq(self, shard_id: str) -> int:
        """The position of the last record of a shard's log (0: none yet)."""
        return self._last_seq.get(shard_id, 0)

    def trimmed_upto(self, shard_id: str) -> int | None:
        """The last position dropped from the shard's log by :meth:`trim`, or None."""
        r = self.db.execute("SELECT upto FROM trims WHERE shard_id=?", (shard_id,)).fetchone()
        return None if r is None else int(r[0])

    def read_log(self, shard_id: str, after: int, limit: int) -> list[tuple[int, int, bytes]]:
        """Up to ``limit`` records ``(seq, action, record)`` after position ``after``."""
        return self.db.execute(
            "SELECT seq, action, record FROM log WHERE shard_id=? AND seq>? ORDER BY seq LIMIT ?",
            (shard_id, after, limit),
        ).fetchall()

    # ------------------------------------------------------------------ writes
    def next_ts(self) -> int:
        """A commit timestamp (micros) after every one handed out before."""
        ts = max(int(time.time() * 1_000_000), self._last_ts + 1)
        self._last_ts = ts
        return ts

    def next_seq(self, shard_id: str) -> int:
        seq = self._last_seq.get(shard_id, 0) + 1
        self._last_seq[shard_id] = seq
        return seq

    def append(self, db: sqlite3.Connection, records: Sequence[tuple[str, int, int, int, bytes]]) -> None:
        """Log ``(shard_id, seq, ts, action, record)`` rows (``seq`` from :meth:`next_seq`)."""
        db.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?)", records)

    def open_root(self, db: sqlite3.Connection, table: str) -> str:
        """The first shard of a new table: every key."""
        shard_id = self._new_shard(db, table, b"", None, [])
        self._open.pop(table, None)
        return shard_id

    def _new_shard(
        self, db: sqlite3.Connection, table: str, lo: bytes, hi: bytes | None, parents: list[str]
    ) -> str:
        shard_id = uuid.uuid4().hex
        order = db.execute("SELECT COALESCE(MAX(ord), 0) + 1 FROM shards").fetchone()[0]
        db.execute(
            "INSERT INTO shards VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
            (shard_id, table, lo, hi, json.dumps(parents), now_ms(), order),
        )
        self._last_seq[shard_id] = 0
        return shard_id

    def drop_table(self, db: sqlite3.Connection, table: str) -> None:
        for (shard_id,) in db.execute("SELECT shard_id FROM shards WHERE tbl=?", (table,)).fetchall():
            db.execute("DELETE FROM log WHERE shard_id=?", (shard_id,))
            self._last_seq.pop(shard_id, None)
        db.execute("DELETE FROM shards WHERE tbl=?", (table,))
        self._open.pop(table, None)

    # ------------------------------------------------------------------ admin
    def describe(self, table: str) -> list[dict[str, Any]]:
        """Every shard of ``table`` (open and sealed) with lineage, bounds and record count."""
        with self.db.lock:
            names = [n for n, _ in self.tables.get(table).pk]
            out = []
            for r in self.db.execute(
                f"SELECT {_SHARD_COLUMNS} FROM shards WHERE tbl=? ORDER BY ord", (table,)
            ):
                s = self._shard(r)
                out.append(
                    {
                        "shard_id": s.shard_id,
                        "parents": s.parents,
                        "sealed": s.sealed,
                        "lo": _readable(decode_key(s.lo, names)) if s.lo else None,
                        "hi": None if s.hi is None else _readable(decode_key(s.hi, names)),
                        "records": self._last_seq.get(s.shard_id, 0),
                    }
                )
            return out

    def _rows(self) -> Rows:
        assert self.rows is not None, "the store wires rows into shards"
        return self.rows

    def split(
        self, table: str, shard_id: str | None = None, split_key: Sequence[Any] | None = None
    ) -> dict[str, Any]:
        """Seal one open shard and open two children. Default split point: the shard's median row."""
        rows = self._rows()
        with self.db.txn() as db:
            info = self.tables.get(table)
            open_shards = self.open_shards(table)
            if shard_id is None:
                shard = max(open_shards, key=lambda s: (rows.count(table, s.lo, s.hi), -s.ord))
            else:
                matches = [s for s in open_shards if s.shard_id == shard_id]
                if not matches:
                    raise param_invalid(f"shard {shard_id!r} is not an open shard of table {table}")
                shard = matches[0]
            if split_key is not None:
                if not 1 <= len(split_key) <= len(info.pk):
                    raise param_invalid(
                        f"split_key needs 1..{len(info.pk)} values (the leading primary-key columns)"
                    )
                point = b"".join(encode_value(_from_json(v)) for v in split_key)
            else:
                count = rows.count(table, shard.lo, shard.hi)
                if count < 2:
                    raise param_invalid(
                        f"shard {shard.shard_id} holds {count} row(s); give split_key to split it"
                    )
                point = rows.key_at(table, shard.lo, shard.hi, count // 2)
            if point <= shard.lo or (shard.hi is not None and point >= shard.hi):
                raise param_invalid("split point must lie strictly inside the shard")
            db.execute("UPDATE shards SET sealed=1 WHERE shard_id=?", (shard.shard_id,))
            left = self._new_shard(db, table, shard.lo, point, [shard.shard_id])
            right = self._new_shard(db, table, point, shard.hi, [shard.shard_id])
            self._open.pop(table, None)
            for listener in self._listeners:
                listener.children_opened(db, table, [shard.shard_id], [left, right])
        log.info("split shard %s of table %s into %s, %s", shard.shard_id, table, left, right)
        return {"parent": shard.shard_id, "children": [left, right]}

    def merge(self, table: str, shard_ids: Sequence[str] | None = None) -> dict[str, Any]:
        """Seal two adjacent open shards and open one child covering both."""
        with self.db.txn() as db:
            self.tables.get(table)
            open_shards = self.open_shards(table)  # sorted by lo
            if shard_ids is None:
                if len(open_shards) < 2:
                    raise param_invalid(f"table {table} has a single open shard: nothing to merge")
                a, b = open_shards[0], open_shards[1]
            else:
                if len(shard_ids) != 2:
                    raise param_invalid("merge needs exactly two shard ids")
                by_id = {s.shard_id: s for s in open_shards}
                if any(s not in by_id for s in shard_ids):
                    raise param_invalid(f"merge: {list(shard_ids)} are not both open shards of table {table}")
                a, b = sorted((by_id[s] for s in shard_ids), key=lambda s: s.lo)
            if a.hi != b.lo:
                raise param_invalid(f"shards {a.shard_id} and {b.shard_id} are not adjacent")
            for s in (a, b):
                db.execute("UPDATE shards SET sealed=1 WHERE shard_id=?", (s.shard_id,))
            child = self._new_shard(db, table, a.lo, b.hi, [a.shard_id, b.shard_id])
            self._open.pop(table, None)
            for listener in self._listeners:
                listener.children_opened(db, table, [a.shard_id, b.shard_id], [child])
        log.info("merged shards %s, %s of table %s into %s", a.shard_id, b.shard_id, table, child)
        return {"parents": [a.shard_id, b.shard_id], "child": child}

    def trim(self, table: str, before_ms: int) -> dict[str, int]:
        """Drop change-log records committed before ``before_ms`` (what stream expiration does).

        Returns, per shard, the last dropped position. Listeners hear of each trimmed shard (the tunnels
        expire a BaseAndStream tunnel still in its base-data stage that loses undelivered records).
        """
        cutoff = before_ms * 1000
        out: dict[str, int] = {}
        with self.db.txn() as db:
            self.tables.get(table)
            for (shard_id,) in db.execute("SELECT shard_id FROM shards WHERE tbl=?", (table,)).fetchall():
                row = db.execute(
                    "SELECT MAX(seq) FROM log WHERE shard_id=? AND ts<?", (shard_id, cutoff)
                ).fetchone()
                if row[0] is None:
                    continue
                upto = int(row[0])
                db.execute("DELETE FROM log WHERE shard_id=? AND seq<=?", (shard_id, upto))
                db.execute(
                    "INSERT INTO trims VALUES (?, ?) ON CONFLICT(shard_id) DO UPDATE SET upto=MAX(upto, excluded.upto)",
                    (shard_id, upto),
                )
                out[shard_id] = upto
                for listener in self._listeners:
                    listener.log_trimmed(db, shard_id, upto)
        log.info("trimmed the change log of table %s before %d ms: %s", table, before_ms, out)
        return out


def _readable(pk: Sequence[tuple[str, PrimaryKeyValue]]) -> list[Any]:
    return [_to_json(v) for _, v in pk]


def _to_json(value: PrimaryKeyValue) -> Any:
    if isinstance(value, Special):
        return value.name
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    return value


def _from_json(value: Any) -> PrimaryKeyValue:
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    if isinstance(value, bool | int | str):
        return value
    raise param_invalid(f"split_key value {value!r}: expected an integer, a string or {{'b64': ...}}")
