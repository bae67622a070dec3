"""How decoded changes become change records, in the two layouts of a query.

* **Typed** (one table): the table's own columns, typed (see :mod:`.catalog`); a relation whose columns
  differ from those the query started with stops the query (:class:`~cdc.errors.SchemaChangedError`).
* **JSON** (several tables): ``_table`` and ``_key`` (the primary key's values as a JSON object, in key
  order) are the change schema's keys, ``_row`` the row as a JSON object; a column added to a table simply
  appears in later rows' JSON.

Every layout is partial: an update's unchanged TOASTed columns (pgoutput sends a marker, not the value)
are named in ``_unchanged`` and carry null, never a made-up value. Under ``REPLICA IDENTITY FULL`` the
logged old row holds those values, and the record takes them from it: ``_unchanged`` stays empty. An update
that changes the primary key becomes a delete of the old key and an insert of the new one whose
``_old_key`` is the old key (see :mod:`cdc.model`; in the JSON layout ``{_table, _key}``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.backends.postgres.catalog import (
    BOOL,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    TIMESTAMP,
    TIMESTAMPTZ,
    TableInfo,
    ValueParser,
    arrow_type,
)
from cdc.backends.postgres.pgoutput import UNCHANGED, Relation, Value
from cdc.errors import SchemaChangedError
from cdc.model import OLD_KEY, ChangeSchema, Op

# Types whose PostgreSQL text form Arrow's cast parses exactly (bool's 't'/'f' it does not).
_ARROW_CASTS = frozenset({INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, DATE, TIMESTAMP, TIMESTAMPTZ})

JSON_TABLE, JSON_KEY, JSON_ROW = "_table", "_key", "_row"
JSON_SCHEMA = ChangeSchema.of(
    [(JSON_TABLE, pa.string()), (JSON_KEY, pa.string()), (JSON_ROW, pa.string())], [JSON_TABLE, JSON_KEY],
    partial=True, key_changes=True,
)


@dataclass
class Record:
    """One change record before it becomes a row of an Arrow batch."""

    op: Op
    position: int
    commit_time: datetime
    relation: Relation
    values: tuple[Value, ...]
    """Text values in the relation's column order (None for a delete's non-key columns)."""
    old_key: tuple[Value, ...] | None = None
    """The insert half of a key change: the old row's values in column order (only its key's are read)."""


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


@dataclass
class Layout:
    """A query's record layout: typed (``tables`` holds one table) or JSON (several, or one under ``layout=json``)."""

    tables: tuple[TableInfo, ...]
    json_layout: bool = False
    """The JSON layout even for one table (option ``layout=json``)."""
    _parsers: dict[tuple[int, int], ValueParser] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # psycopg's loaders do not pickle; an executor's copy makes its own.
        return {"tables": self.tables, "json_layout": self.json_layout, "_parsers": {}}

    @property
    def typed(self) -> bool:
        return len(self.tables) == 1 and not self.json_layout

    def change_schema(self) -> ChangeSchema:
        if self.typed:
            t = self.tables[0]
            return ChangeSchema.of(t.arrow_schema(), t.keys, partial=True, key_changes=True)
        return JSON_SCHEMA

    def arrow_schema(self) -> pa.Schema:
        return self.change_schema().arrow()

    def _parser(self, type_oid: int, typmod: int) -> ValueParser:
        key = (type_oid, typmod)
        if key not in self._parsers:
            self._parsers[key] = ValueParser(type_oid, arrow_type(type_oid, typmod))
        return self._parsers[key]

    def column(self, oid: int, typmod: int, arrow: pa.DataType, raw: Sequence[bytes | None]) -> pa.Array:
        """A column of text values as ``arrow``: cast by Arrow where its parser reads PostgreSQL's text form
        (numbers, decimals, dates, timestamps with offsets; naive ones as UTC; booleans 't'/'f'), else value
        by value with psycopg's loader."""
        if pa.types.is_string(arrow):
            return pa.array(raw, pa.binary()).cast(pa.string())
        if oid == BOOL:
            return pc.equal(pa.array(raw, pa.binary()), pa.scalar(b"t", pa.binary()))
        if oid in _ARROW_CASTS:
            try:
                text = pa.array(raw, pa.binary()).cast(pa.string())
                if oid == TIMESTAMP:
                    return text.cast(pa.timestamp("us")).cast(arrow)
                return text.cast(arrow)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # e.g. 'infinity', a BC date, 'NaN' numeric: PostgreSQL's own parser decides
        parse = self._parser(oid, typmod)
        return pa.array([None if v is None else parse(v) for v in raw], arrow)

    def check(self, rel: Relation) -> None:
        """In the typed layout, refuse a relation whose columns are not the ones the query started with."""
        if not self.typed:
            return
        t = self.tables[0]
        now = tuple((c.name, c.type_oid, c.typmod) for c in rel.columns)
        if now != t.signature():
            raise SchemaChangedError(
                f"table {t.name!r} changed its columns from {[c[0] for c in t.columns]} to "
                f"{[c[0] for c in now]} (or their types): restart the query to read the new schema",
                t.name,
            )

    def batch(self, records: Sequence[Record], channel: str, seq: int | None = None) -> pa.RecordBatch:
        """An Arrow batch of ``records`` in the JSON layout; ``seq`` replaces each record's position as
        ``_seq`` (snapshots). Typed change records are built column-wise by :mod:`.changes`."""
        if self.typed:
            raise TypeError("Layout.batch builds the JSON layout; typed changes are built by changes.decode_changes")
        schema = self.arrow_schema()
        cols: dict[str, Any] = {
            "_op": [r.op.value for r in records],
            "_seq": [r.position if seq is None else seq for r in records],
            "_commit_ts": [r.commit_time for r in records],
            "_channel": [channel] * len(records),
            "_position": [r.position for r in records],
        }
        unchanged: list[list[str] | None] = []
        tables, keys, rows = [], [], []
        old_keys: list[dict[str, str] | None] = []
        for r in records:
            old_keys.append(None if r.old_key is None else {
                JSON_TABLE: r.relation.qualified, JSON_KEY: self._json_key(r.relation, r.old_key)})
            key: dict[str, Any] = {}
            row: dict[str, Any] = {}
            gone = []
            for col, raw in zip(r.relation.columns, r.values, strict=True):
                if raw is UNCHANGED:
                    gone.append(col.name)
                    continue
                value = self._parser(col.type_oid, col.typmod)(raw) if isinstance(raw, bytes) else None
                if col.is_key:
                    key[col.name] = value
                if r.op is not Op.DELETE or col.is_key:
                    row[col.name] = value
            tables.append(r.relation.qualified)
            keys.append(json.dumps(key, default=_json_default, separators=(",", ":")))
            rows.append(None if r.op in (Op.DELETE, Op.REFRESH) else json.dumps(row, default=_json_default, separators=(",", ":")))
            unchanged.append(gone or None)
        cols.update({JSON_TABLE: tables, JSON_KEY: keys, JSON_ROW: rows})
        cols["_unchanged"] = unchanged
        cols[OLD_KEY] = old_keys
        arrays = [cols[f.name] if isinstance(cols[f.name], pa.Array) else pa.array(cols[f.name], type=f.type)
                  for f in schema]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _json_key(self, relation: Relation, values: Sequence[Value]) -> str:
        """The ``_key`` JSON object of a row's key columns (in the relation's column order)."""
        key = {
            col.name: self._parser(col.type_oid, col.typmod)(raw) if isinstance(raw, bytes) else None
            for col, raw in zip(relation.columns, values, strict=True) if col.is_key
        }
        return json.dumps(key, default=_json_default, separators=(",", ":"))
