"""Holding back the changes of keys a chunked snapshot has not emitted yet: the rule a change read applies.

While a table is being snapshotted, a change of a key that no chunk has emitted yet is not delivered: the
chunk that emits the key later is read at a later cut and includes it. Delivering it would hand a consumer a
change of a row it does not have yet: an update that leaves columns unchanged (PostgreSQL's unchanged TOASTed
values) could not be applied. For a change at ``_seq`` of key ``k`` of a table whose batch window (see
:func:`.planning.hold_window`) holds ``after``, ``last`` and ``late`` entries, the change is **held** when

* ``after < k <= last`` (in the database's key order; ``after`` absent: from the first key): the chunk holding
  ``k`` is read in this batch or a later one; or
* a late entry holds ``k`` (its range or key set) with ``_seq <= seq``: ``k``'s row was emitted at a later cut
  than planned, so it already includes this change (an entry for every key, with ``_seq <= seq``: the table
  was added to a running query and its snapshot starts at that cut); or
* ``k`` was **re-keyed into** earlier in this read (below).

Keys above ``last`` were inserted after the snapshot started: their whole history is in the change log and
they are never held. A key change (a ``delete`` of the old key, then an ``insert`` of the new key linked to it
by ``_old_key``) is held half by half. When the old key is held but the new key is not, the insert is the
new key's first change a consumer sees: if it is whole, it is delivered with its link cleared (the consumer
never had the old row); if it leaves columns unchanged (their values are the old row's, which no consumer
holds), the new key is **re-keyed into**: its changes from there on are held, and the read ends with the new
key's row as of the batch's cut (``_op = snapshot``, ``_seq`` = the cut's), read by the backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.model import OLD_KEY, OP, SEQ, UNCHANGED, Op
from cdc.snapshots.state import Cut, Key, Late

JSON_TABLE, JSON_KEY = "_table", "_key"
"""The JSON layout's columns naming a record's table and key."""

KeyValues = tuple[Any, ...]
"""A key as the records carry it (typed values), before the database turns it into a :data:`Key`."""

Classify = Callable[[str, Sequence[KeyValues], Sequence[tuple[Key | None, Key]]], tuple[list[Key], list[list[bool]]]]
"""``classify(table, keys, ranges)``: each key's text form (:data:`Key`, as the database prints it) and, per
range ``(after, upto]``, whether the key lies in it, in the database's order."""


class _Table(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def keys(self) -> tuple[str, ...]: ...


class Layout(Protocol):
    """A backend's record layout: typed (one table, its key columns are the record's) or JSON (``_table`` and
    ``_key``, the key's values as a JSON object in key order)."""

    @property
    def typed(self) -> bool: ...
    @property
    def tables(self) -> Sequence[_Table]: ...


class RecordKeys(Protocol):
    """How a backend's record layout names each record's table and key."""

    def keys(self, batch: pa.RecordBatch) -> list[tuple[str, KeyValues]]:
        """Every record's table and key."""

    def old_keys(self, batch: pa.RecordBatch) -> list[tuple[str, KeyValues] | None]:
        """Every record's ``_old_key`` as a table and key (None where it is null or absent)."""


class LayoutKeys:
    """Each record's table and key in a backend's layout (:class:`RecordKeys`)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def keys(self, batch: pa.RecordBatch) -> list[tuple[str, KeyValues]]:
        if self.layout.typed:
            t = self.layout.tables[0]
            columns = [batch.column(k).to_pylist() for k in t.keys]
            return [(t.name, key) for key in zip(*columns, strict=True)]
        return [(table, tuple(json.loads(key).values()))
                for table, key in zip(batch.column(JSON_TABLE).to_pylist(), batch.column(JSON_KEY).to_pylist(),
                                      strict=True)]

    def old_keys(self, batch: pa.RecordBatch) -> list[tuple[str, KeyValues] | None]:
        values = batch.column(OLD_KEY).to_pylist()
        if self.layout.typed:
            t = self.layout.tables[0]
            return [None if v is None else (t.name, tuple(v[k] for k in t.keys)) for v in values]
        return [None if v is None else (v[JSON_TABLE], tuple(json.loads(v[JSON_KEY]).values())) for v in values]


@dataclass(frozen=True)
class _TableHold:
    after: Key | None
    last: Key | None
    late: tuple[Late, ...]
    deletes: bool = False
    """Deletes are delivered, never held (a re-snapshot: the consumer has the rows; see ``TableCursor.refresh``)."""

    @classmethod
    def from_window(cls, value: Mapping[str, Any]) -> _TableHold:
        last = value.get("last")
        after = value.get("after")
        late = tuple(Late.from_json(e, "hold window") for e in value.get("late", []))
        return cls(None if after is None else tuple(after), None if last is None else tuple(last), late,
                   bool(value.get("deletes", False)))

    def ranges(self) -> list[tuple[Key | None, Key]]:
        """The ranges to classify keys against: the region first (when there is one), then each late range."""
        out: list[tuple[Key | None, Key]] = []
        if self.last is not None:
            out.append((self.after, self.last))
        out += [(e.after, e.upto) for e in self.late if e.keys is None and e.upto is not None]
        return out


@dataclass
class HoldBack:
    """Applies the rule above to the change batches of one range, in order; :attr:`rekeyed` collects the keys
    re-keyed into, per table, whose rows the read must end with."""

    window: Mapping[str, Mapping[str, Any]]
    layout: RecordKeys
    classify: Classify
    rekeyed: dict[str, list[Key]] = field(default_factory=dict)
    held: int = 0
    """Records held back so far."""

    def __post_init__(self) -> None:
        self._tables = {t: _TableHold.from_window(v) for t, v in self.window.items()}
        self._rekeyed: dict[str, set[Key]] = {}

    def _status(self, items: Sequence[tuple[str, KeyValues]]) -> dict[tuple[str, KeyValues], tuple[Key, float]]:
        """Each distinct (table, key) of a held table: its text form and the ``_seq`` up to which it is held
        whatever it is (``inf``: always, ``-inf``: never)."""
        by_table: dict[str, list[KeyValues]] = {}
        for table, key in dict.fromkeys(items):
            if table in self._tables:
                by_table.setdefault(table, []).append(key)
        out: dict[tuple[str, KeyValues], tuple[Key, float]] = {}
        for table, keys in by_table.items():
            hold = self._tables[table]
            ranges = hold.ranges()
            texts, flags = self.classify(table, keys, ranges)
            ranged_late = [e for e in hold.late if e.keys is None and e.upto is not None]
            every = max((e.cut.seq for e in hold.late if e.every), default=-np.inf)
            for key, text, inside in zip(keys, texts, flags, strict=True):
                until = every
                offset = 0
                if hold.last is not None:
                    offset = 1
                    if inside[0]:
                        until = np.inf
                for e, hit in zip(ranged_late, inside[offset:], strict=True):
                    if hit:
                        until = max(until, e.cut.seq)
                for e in hold.late:
                    if e.keys is not None and text in e.keys:
                        until = max(until, e.cut.seq)
                out[(table, key)] = (text, until)
        return out

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` without its held records (and with the links of delivered inserts whose old key is held
        cleared)."""
        n = batch.num_rows
        if n == 0 or not self._tables:
            return batch
        keys = self.layout.keys(batch)
        olds = self.layout.old_keys(batch) if OLD_KEY in batch.schema.names else [None] * n
        status = self._status(keys + [o for o in olds if o is not None])
        seqs = batch.column(SEQ).to_numpy(zero_copy_only=False)
        ops = batch.column(OP).to_pylist()
        unchanged = batch.column(UNCHANGED).to_pylist() if UNCHANGED in batch.schema.names else [None] * n
        keep = np.ones(n, dtype=bool)
        unlink: list[int] = []

        def held(item: tuple[str, KeyValues], seq: int) -> bool:
            entry = status.get(item)
            if entry is None:
                return False
            text, until = entry
            return seq <= until or text in self._rekeyed.get(item[0], ())

        passes = {t for t, h in self._tables.items() if h.deletes}
        for i in range(n):
            item, seq = keys[i], int(seqs[i])
            old = olds[i]
            if passes and item[0] in passes and ops[i] == Op.DELETE.value:
                continue
            if held(item, seq):
                keep[i] = False
            elif old is not None and ops[i] == Op.INSERT.value and held(old, seq):
                if unchanged[i]:  # its unchanged values are the old row's, which no consumer holds
                    keep[i] = False
                    text = status[item][0]
                    self._rekeyed.setdefault(item[0], set()).add(text)
                    self.rekeyed.setdefault(item[0], []).append(text)
                else:
                    unlink.append(i)
        self.held += int(n - keep.sum())
        if unlink:
            column = batch.schema.get_field_index(OLD_KEY)
            cleared = np.zeros(n, dtype=bool)
            cleared[unlink] = True
            links = batch.column(column)
            batch = batch.set_column(column, batch.schema.field(column),
                                     pc.if_else(pa.array(cleared), pa.nulls(n, links.type), links))
        return batch if keep.all() else batch.filter(pa.array(keep))


def late_keys(cut: Cut, rekeyed: Mapping[str, Sequence[Key]]) -> dict[str, list[Late]]:
    """The late entries of keys re-keyed into whose rows were read at ``cut``."""
    return {t: [Late(cut, keys=tuple(keys))] for t, keys in rekeyed.items() if keys}


def rekeyed_to_json(rekeyed: Mapping[str, Sequence[Key]]) -> str:
    return json.dumps({t: [list(k) for k in keys] for t, keys in rekeyed.items()}, separators=(",", ":"))


def rekeyed_from_json(text: str) -> dict[str, list[Key]]:
    return {t: [tuple(k) for k in keys] for t, keys in json.loads(text).items()}
