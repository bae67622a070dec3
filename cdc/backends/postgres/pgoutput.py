"""A decoder of PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

The message formats are PostgreSQL's "Logical Replication Message Formats" (protocol documentation,
chapter 55.9). Only what a change record needs is kept: transaction boundaries (Begin carries the commit
LSN and time) and relation descriptions (sent before a relation's first change in every decoding
session). Row changes are decoded by :mod:`.changes`, straight into Arrow columns; their values stay in
PostgreSQL's text form until Arrow's casts or :mod:`.catalog`'s parsers convert them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class Unchanged:
    """The value of an unchanged TOASTed column: pgoutput sends a marker, not the value."""

    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()
Value = bytes | None | Unchanged


@dataclass(frozen=True)
class Begin:
    commit_lsn: int
    commit_time: datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    columns: tuple[Column, ...]
    identity: str = "d"
    """The table's replica identity: ``d`` default (the primary key), ``f`` full, ``i`` an index, ``n``
    nothing; the columns flagged as key are the identity's."""

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"

    @cached_property
    def key_indexes(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.columns) if c.is_key)


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]


Message = Begin | Commit | Relation | Truncate | None


def _timestamp(micros: int) -> datetime:
    return PG_EPOCH + timedelta(microseconds=micros)


_STRUCTS: dict[str, struct.Struct] = {}


class _Buffer:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def unpack(self, fmt: str) -> tuple[int, ...]:
        s = _STRUCTS.get(fmt) or _STRUCTS.setdefault(fmt, struct.Struct(fmt))
        out = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return out

    def cstring(self) -> str:
        end = self.data.index(0, self.pos)
        text = self.data[self.pos : end].decode()
        self.pos = end + 1
        return text


def kind_of(data: bytes) -> str:
    """The message type, without decoding the message."""
    return chr(data[0])


def records_of(data: bytes) -> int:
    """How many change records a message becomes (an update that changes the key is a delete of the old key
    and an insert of the new one), read from its first bytes only: planning counts without decoding rows."""
    kind = data[0]
    if kind in (0x49, 0x44):  # 'I', 'D'
        return 1
    if kind == 0x55:  # 'U': an old key ('K') is sent only when the key changed
        return 2 if data[5] == 0x4B else 1
    return 0


def decode(data: bytes) -> Message:
    """One message other than a row change (:mod:`.changes` decodes those, column-wise, in its hot loop);
    ``None`` for the kinds a change record has no use for (origin, type, message) and for row changes."""
    buf = _Buffer(data)
    kind = buf.byte()
    if kind == 0x42:  # 'B'
        lsn, ts, xid = buf.unpack("!qqi")
        return Begin(lsn, _timestamp(ts), xid)
    if kind == 0x43:  # 'C'
        buf.byte()
        lsn, end, _ts = buf.unpack("!qqq")
        return Commit(lsn, end)
    if kind == 0x52:  # 'R'
        (oid,) = buf.unpack("!I")
        namespace = buf.cstring() or "pg_catalog"
        name = buf.cstring()
        identity = chr(buf.byte())
        (ncols,) = buf.unpack("!h")
        cols = []
        for _ in range(ncols):
            flags = buf.byte()
            col = buf.cstring()
            type_oid, typmod = buf.unpack("!Ii")
            cols.append(Column(col, type_oid, typmod, bool(flags & 1)))
        return Relation(oid, namespace, name, tuple(cols), identity)
    if kind == 0x54:  # 'T'
        (n,) = buf.unpack("!i")
        buf.byte()
        return Truncate(tuple(buf.unpack(f"!{n}I")))
    return None
