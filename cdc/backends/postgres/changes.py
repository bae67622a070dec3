"""Peeked ``pgoutput`` messages straight into Arrow batches: the hot loop of change reads.

A message is a sequence of variable-length fields, so Python must walk it; it does nothing else per
value. Each column's kind and length are read with precompiled ``struct`` readers and its text value is
sliced into one flat list per batch: no object per message, change or column. Per batch, column ``j`` of
a one-table (typed) query is the slice ``flat[j::columns]``, converted at once by Arrow's C++ casts
(:meth:`.records.Layout.column`, chosen per column type); ``_seq``, ``_position`` and ``_commit_ts`` come
from lists of ints. A many-table (JSON) query builds its rows from the same flat list.

Range rules (the reader's): transactions committing in ``[lsn_of(start), lsn_of(end))``, their records at
positions ``>= start``; a transaction before the range is skipped without decoding its rows (its relation
messages still count: PostgreSQL sends a relation once per decoding session).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from cdc.backends.postgres.errors import ReplicaIdentityError
from cdc.backends.postgres.pgoutput import PG_EPOCH, UNCHANGED, Relation, Truncate, decode
from cdc.backends.postgres.positions import INDEX_BITS, MAX_INDEX, format_lsn, pack
from cdc.backends.postgres.records import Layout, Record
from cdc.errors import CdcError, MalformedRecordError
from cdc.model import OLD_KEY, Op

log = logging.getLogger(__name__)

_BEGIN = struct.Struct("!qq").unpack_from  # final (commit) LSN, commit time; after the kind byte
_RELID = struct.Struct("!I").unpack_from
_COUNT = struct.Struct("!h").unpack_from
_LENGTH = struct.Struct("!i").unpack_from
_UNIX_MINUS_PG_US = 946_684_800_000_000  # 2000-01-01 (PostgreSQL's epoch) in Unix microseconds

_B, _C, _R, _I, _U, _D, _T, _K, _O = b"BCRIUDTKO"
_TEXT, _NULL, _TOAST = b"tnu"
_MESSAGES = {_I: "insert", _U: "update", _D: "delete", _R: "relation", _B: "begin", _C: "commit", _T: "truncate"}
_INSERT, _UPDATE, _DELETE = Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value


@dataclass
class _Relation:
    """A relation as the loop needs it, prepared once per relation message."""

    relation: Relation
    width: int
    keys: tuple[int, ...]
    non_keys: tuple[int, ...]
    checked: bool = False
    wanted: bool = True
    """A table of the query (a publication may carry others: a table removed from the query, or one the user's
    publication names besides): the records of others are counted, never delivered."""

    @classmethod
    def of(cls, rel: Relation, layout: Layout, only: frozenset[str] | None = None) -> _Relation:
        # pgoutput flags the replica identity's columns as the key: the primary key under the default
        # identity, every column under REPLICA IDENTITY FULL. Records are keyed by the primary key.
        primary = next((t.keys for t in layout.tables if t.name == rel.qualified), None)
        if primary is not None and rel.identity == "i" and {c.name for c in rel.columns if c.is_key} != set(primary):
            raise ReplicaIdentityError(
                f"table {rel.qualified!r} has REPLICA IDENTITY USING INDEX on columns "
                f"{[c.name for c in rel.columns if c.is_key]}, not its primary key {list(primary)}: its updates "
                "and deletes would be logged by other columns than the records' key. Run ALTER TABLE "
                f"{rel.qualified} REPLICA IDENTITY DEFAULT (or FULL), then restart the query",
                rel.qualified,
            )
        if primary is not None:
            rel = replace(rel, columns=tuple(replace(c, is_key=c.name in primary) for c in rel.columns))
        keys = rel.key_indexes
        wanted = primary is not None and (only is None or rel.qualified in only)
        return cls(rel, len(rel.columns), keys, tuple(i for i in range(len(rel.columns)) if i not in keys),
                   wanted=wanted)


def _tuple(data: bytes, pos: int, add: Callable[[Any], None], width: int) -> tuple[int, list[int] | None]:
    """Append a TupleData's values (text bytes, or None for null and unchanged TOAST) through ``add``;
    return the position after it and the indexes of unchanged TOASTed columns (None when there are none)."""
    (n,) = _COUNT(data, pos)
    if n != width:
        raise ValueError(f"a row of {n} columns for a relation of {width}")
    pos += 2
    unchanged = None
    for j in range(n):
        kind = data[pos]
        if kind == _TEXT:
            (length,) = _LENGTH(data, pos + 1)
            pos += 5 + length
            add(data[pos - length : pos])
        elif kind == _NULL:
            pos += 1
            add(None)
        elif kind == _TOAST:
            pos += 1
            add(None)
            if unchanged is None:
                unchanged = [j]
            else:
                unchanged.append(j)
        else:  # 'b' (binary) is sent only when asked for, and it is not
            raise ValueError(f"column {j} has value kind {chr(kind)!r} (expected t, n or u)")
    if pos > len(data):
        raise ValueError(f"the row runs past the message's {len(data)} bytes")
    return pos, unchanged


def _records_of_update(data: bytes, r: _Relation) -> int:
    """How many records an update message becomes: two when it carries an old key or row whose key
    differs from the new row's (a delete and an insert), else one."""
    if data[5] not in (_K, _O):
        return 1
    old: list[Any] = []
    new: list[Any] = []
    pos, _ = _tuple(data, 6, old.append, r.width)
    _tuple(data, pos + 1, new.append, r.width)
    return 2 if any(old[i] != new[i] for i in r.keys) else 1


def decode_changes(
    rows: Iterable[tuple[bytes]], layout: Layout, channel: str, start: int, end: int, batch_rows: int = 8192,
    only: frozenset[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The change records of ``[start, end)`` in ``rows`` (one message per row, as the slot is peeked), as
    Arrow batches of ``batch_rows`` records (one more when a key change ends one). A message that cannot
    be decoded raises :class:`~cdc.errors.MalformedRecordError` naming its kind and its transaction. Only the
    records of the layout's tables (of those among ``only``, when given) are delivered; the others keep their
    places in the positions."""
    build = _BatchBuilder(layout, channel)
    first_lsn, end_lsn = start >> INDEX_BITS, end >> INDEX_BITS
    relations: dict[int, _Relation] = {}
    flat: list[Any] = []
    add = flat.append
    ops: list[str] = []
    positions: list[int] = []
    times: list[int] = []
    rels: list[_Relation] = []
    unchanged: dict[int, list[int]] = {}
    old_keys: dict[int, dict[int, Any]] = {}  # the insert half of a key change: its old key's values
    skipping = False
    commit_lsn = base = index = low = when = 0
    kind = 0
    for (data,) in rows:
        kind = data[0]
        if skipping:
            # A transaction outside the range (planned but not yet acknowledged): only its relation
            # messages matter, its rows are not decoded.
            if kind == _R:
                rel = decode(bytes(data))
                assert isinstance(rel, Relation)
                relations[rel.oid] = _Relation.of(rel, layout, only)
            elif kind == _C:
                skipping = False
            continue
        try:
            if kind == _I or kind == _U or kind == _D:
                (relid,) = _RELID(data, 1)
                r = relations.get(relid)
                if r is None:
                    raise ValueError(f"relation {relid} was not described by a relation message before it")
                if not r.wanted or index < low:  # not the query's, or before the range's start: count, keep nothing
                    if not r.wanted:
                        index += _records_of_update(data, r) if kind == _U else 1
                        continue
                    count = _records_of_update(data, r) if kind == _U else 1
                    if index + count <= low:
                        index += count
                        continue
                    # else a key change whose insert is the range's first record: its delete is left out below
                if not r.checked:
                    layout.check(r.relation)
                    r.checked = True
                width = r.width
                if kind == _I or data[5] == 0x4E:  # an insert, or an update without an old row ('N')
                    _, gone = _tuple(data, 6, add, width)
                    op = _INSERT if kind == _I else _UPDATE
                elif kind == _D:
                    old: list[Any] = []
                    _, gone = _tuple(data, 6, old.append, width)
                    for i in r.non_keys:
                        old[i] = None
                    flat.extend(old)
                    gone = [j for j in gone if j in r.keys] if gone else None
                    op = _DELETE
                else:  # an update with the old key ('K', the key changed) or the old row ('O', replica identity full)
                    old = []
                    pos, old_gone = _tuple(data, 6, old.append, width)
                    new: list[Any] = []
                    _, gone = _tuple(data, pos + 1, new.append, width)
                    op = _UPDATE
                    if gone is not None and data[5] == _O:
                        gone = _from_old_row(new, old, gone, old_gone)
                    if any(old[i] != new[i] for i in r.keys):  # the key changed: a delete, then an insert
                        if index >= low:
                            flat.extend([old[i] if i in r.keys else None for i in range(width)])
                            ops.append(_DELETE)
                            positions.append(base + index)
                            times.append(when)
                            rels.append(r)
                        index += 1
                        op = _INSERT
                        old_keys[len(ops)] = {i: old[i] for i in r.keys}
                    flat.extend(new)
                if index > MAX_INDEX:
                    pack(commit_lsn, index)  # raises: the position would not fit a long
                if gone is not None:
                    unchanged[len(ops)] = gone
                ops.append(op)
                positions.append(base + index)
                times.append(when)
                rels.append(r)
                index += 1
            elif kind == _B:
                commit_lsn, micros = _BEGIN(data, 1)
                if not first_lsn <= commit_lsn < end_lsn:
                    skipping = True
                    continue
                base, index, when = commit_lsn << INDEX_BITS, 0, micros + _UNIX_MINUS_PG_US
                low = start - base if commit_lsn == first_lsn else 0
            elif kind == _R:
                rel = decode(bytes(data))
                assert isinstance(rel, Relation)
                relations[rel.oid] = _Relation.of(rel, layout, only)
            elif kind == _T:
                msg = decode(bytes(data))
                assert isinstance(msg, Truncate)
                log.warning("TRUNCATE of %s is not a row change and is not delivered",
                            [relations[r].relation.qualified for r in msg.relids if r in relations])
        except CdcError:
            raise
        except (ValueError, IndexError, struct.error) as exc:
            what = _MESSAGES.get(kind, repr(chr(kind)))
            raise MalformedRecordError(
                f"pgoutput {what} message of the transaction committing at {format_lsn(commit_lsn)} cannot be "
                f"decoded: {exc}"
            ) from exc
        if len(ops) >= batch_rows:
            yield build(flat, ops, positions, times, rels, unchanged, old_keys)
            flat, ops, positions, times, rels, unchanged, old_keys = [], [], [], [], [], {}, {}
            add = flat.append
    if ops:
        yield build(flat, ops, positions, times, rels, unchanged, old_keys)


def _from_old_row(new: list[Any], old: list[Any], gone: list[int], old_gone: list[int] | None) -> list[int] | None:
    """Under ``REPLICA IDENTITY FULL`` the old row ('O') carries every column, TOASTed ones included
    (PostgreSQL inlines them into the logged old row): an unchanged TOASTed column of the new row takes the
    old row's value, so the record is whole. Returns the columns still unknown (None: none)."""
    still = []
    for j in gone:
        if old_gone is not None and j in old_gone:
            still.append(j)
        else:
            new[j] = old[j]
    return still or None


class _BatchBuilder:
    """Turns a batch's flat values and metadata lists into an Arrow batch of the query's layout."""

    def __init__(self, layout: Layout, channel: str) -> None:
        self.layout = layout
        self.channel = channel
        self.schema = layout.arrow_schema()
        self.typed = layout.typed
        self.columns = layout.tables[0].columns if layout.typed else ()
        self._times: dict[int, datetime] = {}

    def __call__(
        self, flat: list[Any], ops: list[str], positions: list[int], times: list[int], rels: list[_Relation],
        unchanged: dict[int, list[int]], old_keys: dict[int, dict[int, Any]],
    ) -> pa.RecordBatch:
        if not self.typed:
            return self._json(flat, ops, positions, times, rels, unchanged, old_keys)
        n = len(ops)
        width = len(self.columns)
        schema = self.schema
        position = pa.array(positions, pa.int64())
        cols: dict[str, pa.Array] = {
            "_op": pa.array(ops, pa.string()),
            "_seq": position,
            "_commit_ts": pa.array(times, pa.timestamp("us", tz="UTC")),
            "_channel": pa.repeat(pa.scalar(self.channel, pa.string()), n),
            "_position": position,
        }
        for j, (name, oid, typmod) in enumerate(self.columns):
            cols[name] = self.layout.column(oid, typmod, schema.field(name).type, flat[j::width])
        if unchanged:
            names: list[list[str] | None] = [None] * n
            for i, gone in unchanged.items():
                names[i] = [self.columns[j][0] for j in gone]
            cols["_unchanged"] = pa.array(names, pa.list_(pa.string()))
        else:
            cols["_unchanged"] = pa.nulls(n, pa.list_(pa.string()))
        cols[OLD_KEY] = self._old_key(n, old_keys)
        return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)

    def _old_key(self, n: int, old_keys: dict[int, dict[int, Any]]) -> pa.Array:
        """``_old_key``: the old key's columns on the insert half of a key change, else null."""
        struct = self.schema.field(OLD_KEY).type
        if not old_keys:
            return pa.nulls(n, struct)
        index = {name: j for j, (name, _, _) in enumerate(self.columns)}
        children = []
        for f in struct:
            j = index[f.name]
            _, oid, typmod = self.columns[j]
            raw = [None] * n
            for i, values in old_keys.items():
                raw[i] = values[j]
            children.append(self.layout.column(oid, typmod, f.type, raw))
        absent = pa.array([i not in old_keys for i in range(n)], pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(struct), mask=absent)

    def _json(
        self, flat: list[Any], ops: list[str], positions: list[int], times: list[int], rels: list[_Relation],
        unchanged: dict[int, list[int]], old_keys: dict[int, dict[int, Any]],
    ) -> pa.RecordBatch:
        records = []
        at = 0  # rows of different tables have different widths
        for i, op in enumerate(ops):
            values = flat[at : at + rels[i].width]
            at += rels[i].width
            for j in unchanged.get(i, ()):
                values[j] = UNCHANGED
            old = old_keys.get(i)
            old_key = None if old is None else tuple(old.get(j) for j in range(rels[i].width))
            records.append(Record(Op(op), positions[i], self._time(times[i]), rels[i].relation, tuple(values),
                                  old_key))
        return self.layout.batch(records, self.channel)

    def _time(self, unix_micros: int) -> datetime:
        # One commit time per transaction: a cache, not a datetime per record.
        t = self._times.get(unix_micros)
        if t is None:
            t = self._times[unix_micros] = PG_EPOCH + timedelta(microseconds=unix_micros - _UNIX_MINUS_PG_US)
        return t
