"""The change decoder of ``backend=postgres`` before the column-wise one, frozen here as the reference of
``benchmarks/postgres_decode.py`` (a copy of its hot path at commit a381dcd, typed layout): one ``Change``
object per message, one ``Record`` per change, then columns by ``zip``. Not used by the library.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdc.backends.postgres.catalog import TIMESTAMP
from cdc.backends.postgres.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Relation,
    Truncate,
    Value,
    _Buffer,
    decode,
)
from cdc.backends.postgres.positions import lsn_of, pack
from cdc.backends.postgres.records import _ARROW_CASTS, Layout, Record
from cdc.model import Op


@dataclass(frozen=True)
class Change:
    kind: str
    relid: int
    old: tuple[Value, ...] | None
    new: tuple[Value, ...] | None


class _OldBuffer(_Buffer):
    def tuple_data(self) -> tuple[Value, ...]:
        data, pos = self.data, self.pos
        n = int.from_bytes(data[pos : pos + 2], "big", signed=True)
        pos += 2
        out: list[Value] = []
        append = out.append
        for _ in range(n):
            kind = data[pos]
            pos += 1
            if kind == 0x6E:  # 'n'
                append(None)
            elif kind == 0x75:  # 'u'
                append(UNCHANGED)
            else:
                length = int.from_bytes(data[pos : pos + 4], "big")
                pos += 4
                append(data[pos : pos + length])
                pos += length
        self.pos = pos
        return tuple(out)


def old_decode(data: bytes) -> Any:
    buf = _OldBuffer(data)
    kind = buf.byte()
    if kind == 0x49:  # 'I'
        (relid,) = buf.unpack("!I")
        buf.byte()
        return Change("I", relid, None, buf.tuple_data())
    if kind == 0x55:  # 'U'
        (relid,) = buf.unpack("!I")
        marker = buf.byte()
        old = None
        if marker in (0x4B, 0x4F):
            old = buf.tuple_data()
            buf.byte()
        return Change("U", relid, old, buf.tuple_data())
    if kind == 0x44:  # 'D'
        (relid,) = buf.unpack("!I")
        buf.byte()
        return Change("D", relid, buf.tuple_data(), None)
    return decode(data)  # the other kinds decode as they did


def _append(records: list[Record], begin: Begin, rel: Relation, change: Change) -> None:
    def add(op: Op, values: tuple[Any, ...]) -> None:
        records.append(Record(op, pack(begin.commit_lsn, len(records)), begin.commit_time, rel, values))

    keys = rel.key_indexes
    if change.kind == "I" and change.new is not None:
        add(Op.INSERT, change.new)
    elif change.kind == "U" and change.new is not None:
        old = change.old
        if old is not None and any(old[i] != change.new[i] for i in keys):
            add(Op.DELETE, _key_only(old, keys))
            add(Op.INSERT, change.new)
        else:
            add(Op.UPDATE, change.new)
    elif change.kind == "D" and change.old is not None:
        add(Op.DELETE, _key_only(change.old, keys))


def _key_only(values: tuple[Any, ...], keys: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(v if i in keys else None for i, v in enumerate(values))


def transactions(rows: Iterable[tuple[bytes]], start: int, end_lsn: int) -> Iterator[list[Record]]:
    relations: dict[int, Relation] = {}
    begin: Begin | None = None
    records: list[Record] = []
    skipping = False
    first = lsn_of(start)
    for (data,) in rows:
        if skipping:
            if data[0] == 0x52:
                rel = decode(bytes(data))
                assert isinstance(rel, Relation)
                relations[rel.oid] = rel
            elif data[0] == 0x43:
                skipping = False
            continue
        msg = old_decode(bytes(data))
        if isinstance(msg, Begin):
            if msg.commit_lsn < first:
                skipping = True
                continue
            begin, records = msg, []
        elif isinstance(msg, Relation):
            relations[msg.oid] = msg
        elif isinstance(msg, Change) and begin is not None:
            _append(records, begin, relations[msg.relid], msg)
        elif isinstance(msg, Truncate):
            pass
        elif isinstance(msg, Commit) and begin is not None:
            if records and first <= begin.commit_lsn < end_lsn:
                kept = [r for r in records if r.position >= start]
                if kept:
                    yield kept
            begin = None


def _column(layout: Layout, oid: int, typmod: int, arrow: pa.DataType, raw: Sequence[Any]) -> Any:
    if pa.types.is_string(arrow):
        return pa.array(raw, pa.binary()).cast(pa.string())
    if oid in _ARROW_CASTS:
        try:
            text = pa.array(raw, pa.binary()).cast(pa.string())
            if oid == TIMESTAMP:
                return text.cast(pa.timestamp("us")).cast(arrow)
            return text.cast(arrow)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    parse = layout._parser(oid, typmod)
    return [None if v is None else parse(v) for v in raw]


def typed_batch(layout: Layout, records: Sequence[Record], channel: str) -> pa.RecordBatch:
    schema = layout.arrow_schema()
    cols: dict[str, Any] = {
        "_op": [r.op.value for r in records],
        "_seq": [r.position for r in records],
        "_commit_ts": [r.commit_time for r in records],
        "_channel": [channel] * len(records),
        "_position": [r.position for r in records],
    }
    for rel in {id(r.relation): r.relation for r in records}.values():
        layout.check(rel)
    table = layout.tables[0]
    columns = list(zip(*(r.values for r in records), strict=True))
    unchanged: list[list[str] | None] = [None for _ in records]
    for (name, oid, typmod), text in zip(table.columns, columns, strict=True):
        if UNCHANGED in text:
            for i, v in enumerate(text):
                if v is UNCHANGED:
                    unchanged[i] = (unchanged[i] or []) + [name]
            text = tuple(None if v is UNCHANGED else v for v in text)
        cols[name] = _column(layout, oid, typmod, schema.field(name).type, text)
    cols["_unchanged"] = unchanged
    arrays = [cols[f.name] if isinstance(cols[f.name], pa.Array) else pa.array(cols[f.name], type=f.type)
              for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def old_read(rows: Iterable[tuple[bytes]], layout: Layout, channel: str, start: int, end: int) -> list[pa.RecordBatch]:
    """The old reader's path: transactions of records, then batches of 8192 records."""
    out, chunk = [], []
    for records in transactions(rows, start, lsn_of(end)):
        for r in records:
            if r.position < end:
                chunk.append(r)
                if len(chunk) >= 8192:
                    out.append(typed_batch(layout, chunk, channel))
                    chunk = []
    if chunk:
        out.append(typed_batch(layout, chunk, channel))
    return out

