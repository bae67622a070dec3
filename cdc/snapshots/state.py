"""A chunked snapshot's state in a batch's offset: one cursor per table, never one entry per chunk.

Stored under the offset's ``snapshot`` key (see :mod:`cdc.offsets`)::

    "snapshot": {"cut": {"pos": 1234, "seq": 1233},
                 "tables": {"public.orders": {"last": ["900000"], "after": ["400000"],
                                              "chunks": [[["200000"], ["300000"]], [["300000"], ["400000"]]],
                                              "late": [{"pos": 1300, "seq": 1299, "after": ["100000"],
                                                        "upto": ["200000"]}]}}}

Keys (:data:`Key`) are lists of the database's own text form of each key column, so they compare in the
database's order (collations included) and bind back as parameters exactly. Per table (:class:`TableCursor`):

``last``
    the table's largest key when the snapshot started: keys above it arrive as changes, never in a chunk.
``after``
    every key up to it (inclusive) has been emitted by a chunk; absent: none yet.
``done``
    the last chunk (the one ending at ``last``) has been emitted.
``chunks``
    only in the offset that ends a batch reading chunks: the chunks ``(after, upto]`` it reads, at ``cut``.
``late``
    keys whose chunk (or re-read row) was read at a later cut than its batch planned (a replay after that cut
    was lost): their changes up to ``seq`` are held back, since the rows emitted already include them. An
    entry with ``"all": true`` holds every key of the table: a table added to a running query, whose changes
    before the cut its snapshot starts at are never delivered (``last`` is then ``null`` when the table was
    empty at that cut: every row of it arrives as a change).

``refresh``
    a re-snapshot of a table the query already streams (started by a signal: ``cdc postgres resnapshot``):
    the ``_seq`` of the cut it started at. Every row it delivers, and every change after that cut, has a
    larger ``_seq``. Its changes are not held back (a consumer has every key's row), except those of late
    entries, deletes apart (a row emitted at a later cut that lacks the key was deleted meanwhile: the delete is
    delivered, older than that row).

``cut`` (only in an offset that ends a batch reading chunks): the batch's change range ends exactly at
``pos``, and its chunks are read as of that position; ``seq`` is the ``_seq`` their rows carry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cdc.channels import Position
from cdc.errors import OffsetError

Key = tuple[str, ...]
"""A key in the database's text form, one string per key column (JSON: a list of strings)."""


def _key(value: Any, where: str) -> Key:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise OffsetError(f"not a cdc offset: {where} must be a key (a list of strings), got {json.dumps(value)[:200]}")
    return tuple(value)


def _opt_key(value: Any, where: str) -> Key | None:
    return None if value is None else _key(value, where)


def _json_key(key: Key | None) -> list[str] | None:
    return None if key is None else list(key)


@dataclass(frozen=True)
class Cut:
    """A consistent cut of a table and its change channel: the rows read at it hold exactly the changes before
    ``pos``; they carry ``_seq = seq``, above every change before ``pos`` and below every change at or after it."""

    pos: Position
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"pos": self.pos, "seq": self.seq}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Cut:
        if not isinstance(value, dict) or set(value) != {"pos", "seq"} or not isinstance(value["seq"], int):
            raise OffsetError(f"not a cdc offset: {where} must be {{'pos': ..., 'seq': <long>}}, got {value!r}")
        return cls(value["pos"], value["seq"])


@dataclass(frozen=True)
class Chunk:
    """The keys ``(after, upto]`` of a table (``after`` None: from its first key)."""

    after: Key | None
    upto: Key

    def to_json(self) -> list[Any]:
        return [_json_key(self.after), list(self.upto)]


@dataclass(frozen=True)
class Late:
    """Changes at or below ``cut.seq`` of these keys are held back: their rows were emitted as of ``cut``. The keys
    are a range ``(after, upto]`` (a chunk), a set (rows re-read after a key change, see :mod:`.holdback`), or
    every key of the table (``every``: a table added to a running query, see the module docstring)."""

    cut: Cut
    after: Key | None = None
    upto: Key | None = None
    keys: tuple[Key, ...] | None = None
    every: bool = False

    def to_json(self) -> dict[str, Any]:
        out = self.cut.to_json()
        if self.every:
            out["all"] = True
        elif self.keys is not None:
            out["keys"] = [list(k) for k in self.keys]
        else:
            out["after"] = _json_key(self.after)
            out["upto"] = _json_key(self.upto)
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> Late:
        if not isinstance(value, dict):
            raise OffsetError(f"not a cdc offset: {where} must be an object, got {value!r}")
        cut = Cut.from_json({k: value.get(k) for k in ("pos", "seq")}, where)
        if value.get("all") is True:
            return cls(cut, every=True)
        if "keys" in value:
            if not isinstance(value["keys"], list):
                raise OffsetError(f"not a cdc offset: {where}: 'keys' must be a list of keys")
            return cls(cut, keys=tuple(_key(k, f"{where} key") for k in value["keys"]))
        return cls(cut, _opt_key(value.get("after"), f"{where} 'after'"), _key(value.get("upto"), f"{where} 'upto'"))


_TABLE_KEYS = frozenset({"last", "after", "done", "chunks", "late", "refresh"})


@dataclass(frozen=True)
class TableCursor:
    """One table's progress through a chunked snapshot (see the module docstring)."""

    last: Key | None
    """``None`` only for a table added to a running query that was empty at its start (then ``done``)."""
    after: Key | None = None
    done: bool = False
    chunks: tuple[Chunk, ...] = ()
    late: tuple[Late, ...] = ()
    refresh: int | None = None
    """A re-snapshot of a streaming table: the ``_seq`` of the cut it started at (see the module docstring)."""

    @property
    def held_after(self) -> Key | None:
        """The lower bound (exclusive) of the keys not yet emitted when the batch began: the first chunk's."""
        return self.chunks[0].after if self.chunks else self.after

    @property
    def holds(self) -> bool:
        """Some key of the table is held back in the batch that ends here."""
        return not self.done or bool(self.chunks) or bool(self.late)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"last": None if self.last is None else list(self.last)}
        if self.after is not None:
            out["after"] = list(self.after)
        if self.done:
            out["done"] = True
        if self.chunks:
            out["chunks"] = [c.to_json() for c in self.chunks]
        if self.late:
            out["late"] = [entry.to_json() for entry in self.late]
        if self.refresh is not None:
            out["refresh"] = self.refresh
        return out

    @classmethod
    def from_json(cls, table: str, value: Any) -> TableCursor:
        where = f"snapshot table {table!r}"
        if not isinstance(value, dict):
            raise OffsetError(f"not a cdc offset: {where} must be an object")
        unknown = sorted(set(value) - _TABLE_KEYS)
        if unknown:
            raise OffsetError(f"not a cdc offset: {where} has unknown keys {unknown}")
        chunks = value.get("chunks", [])
        if not isinstance(chunks, list) or not all(isinstance(c, list) and len(c) == 2 for c in chunks):
            raise OffsetError(f"not a cdc offset: {where}: 'chunks' must be a list of [after, upto] pairs")
        done = value.get("done", False)
        if not isinstance(done, bool):
            raise OffsetError(f"not a cdc offset: {where}: 'done' must be true or false")
        late = value.get("late", [])
        if not isinstance(late, list):
            raise OffsetError(f"not a cdc offset: {where}: 'late' must be a list")
        refresh = value.get("refresh")
        if refresh is not None and (isinstance(refresh, bool) or not isinstance(refresh, int)):
            raise OffsetError(f"not a cdc offset: {where}: 'refresh' must be a long, got {refresh!r}")
        return cls(
            last=_key(value["last"], f"{where} 'last'") if value.get("last") is not None or not done else None,
            after=_opt_key(value.get("after"), f"{where} 'after'"),
            done=done,
            chunks=tuple(Chunk(_opt_key(a, f"{where} chunk"), _key(u, f"{where} chunk")) for a, u in chunks),
            late=tuple(Late.from_json(e, f"{where} late entry") for e in late),
            refresh=refresh,
        )


@dataclass(frozen=True)
class SnapshotState:
    """Every table's cursor, and the cut of the batch that reads chunks (see the module docstring)."""

    tables: Mapping[str, TableCursor] = field(default_factory=dict)
    cut: Cut | None = None

    @property
    def pending(self) -> bool:
        """Some table still has chunks to read."""
        return any(not t.done for t in self.tables.values())

    def chunks(self) -> list[tuple[str, Chunk]]:
        return [(name, c) for name, t in self.tables.items() for c in t.chunks]

    def settled(self) -> SnapshotState:
        """The state a following batch starts from: no chunks in flight, no cut, finished tables dropped."""
        tables = {n: replace(t, chunks=()) for n, t in self.tables.items()}
        return SnapshotState({n: t for n, t in tables.items() if t.holds})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cut is not None:
            out["cut"] = self.cut.to_json()
        out["tables"] = {n: t.to_json() for n, t in self.tables.items()}
        return out

    @classmethod
    def from_json(cls, value: Any) -> SnapshotState:
        if not isinstance(value, dict) or not isinstance(value.get("tables"), dict):
            raise OffsetError(f"not a cdc offset: 'snapshot' must hold 'tables', got {json.dumps(value)[:200]}")
        unknown = sorted(set(value) - {"tables", "cut"})
        if unknown:
            raise OffsetError(f"not a cdc offset: 'snapshot' has unknown keys {unknown}")
        cut = Cut.from_json(value["cut"], "snapshot 'cut'") if "cut" in value else None
        tables = {str(n): TableCursor.from_json(str(n), t) for n, t in value["tables"].items()}
        if cut is None and any(t.chunks for t in tables.values()):
            raise OffsetError("not a cdc offset: snapshot chunks without a 'cut'")
        return cls(tables, cut)


def with_late(state: SnapshotState, late: Mapping[str, Sequence[Late]]) -> SnapshotState:
    """``state`` with more late entries per table."""
    tables = dict(state.tables)
    for name, entries in late.items():
        if entries:
            t = tables[name]
            tables[name] = replace(t, late=t.late + tuple(entries))
    return SnapshotState(tables, state.cut)
