"""Row images of the binary log straight into change records, in the two layouts of a query.

**Decoding.** A rows event holds row images (a null bitmap, then each non-null column's value in its binary
form), one per inserted or deleted row, two (before and after) per updated row. Python walks each image with
precompiled readers (a ``struct`` for fixed-width numbers, a length prefix for strings and blobs, a byte count
for the rest) and appends the raw value to a list per column; nothing else happens per value. Each column is
then converted at once, when a batch is built: numbers by Arrow from the lists, dates and times by numpy from
the packed bytes, strings by Arrow's UTF-8 check (:func:`convert`). ``mysql-replication`` parses the table
map events (column types, names, character sets, ``ENUM``/``SET`` labels, from ``binlog_row_metadata=FULL``),
once per distinct table map; its own row decoding builds a dict per row and converts every value in Python,
which measured several times slower.

**Layouts.** One table (*typed*): the table's columns, typed (:mod:`.catalog`). Several (*JSON*): ``_table``
(``database.table``) and ``_key`` (the primary key's values as a JSON object, in key order) are the change
schema's keys, ``_row`` the row as a JSON object (null for a delete). Every change carries the whole row
(``binlog_row_image=FULL``); a delete carries its key only. An update that changes the primary key becomes a
delete of the old key and an insert of the new one.

**Schema changes** arrive as table maps whose columns differ from the ones the query knows (:meth:`Layout.check`):
an added column flows into the JSON layout's rows, and stops a typed query with
:class:`~cdc.errors.SchemaChangedError` (a restart reads the new schema; its older rows, without the column,
then carry null there); a column whose type changed, or that was renamed (one column gone and another come
in the same table map), stops both layouts, naming the table and the columns. A dropped column stops
appearing in the JSON layout and is null in the typed one.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pymysql.protocol import MysqlPacket
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent

from cdc.backends.mysql.catalog import (
    BINARY,
    ColumnType,
    TableInfo,
    binlog_type,
)
from cdc.backends.mysql.errors import ServerSettingError
from cdc.backends.mysql.values import convert, decimal_bytes, fraction_bytes
from cdc.errors import SchemaChangedError
from cdc.model import ChangeSchema, Op

JSON_TABLE, JSON_KEY, JSON_ROW = "_table", "_key", "_row"
JSON_SCHEMA = ChangeSchema.of(
    [(JSON_TABLE, pa.string()), (JSON_KEY, pa.string()), (JSON_ROW, pa.string())], [JSON_TABLE, JSON_KEY]
)
INSERT, UPDATE, DELETE = Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value

# Rows event kinds.
WRITE, UPDATE_ROWS, DELETE_ROWS = 0, 1, 2

# Readers: how a column's value is found in a row image.
_STRUCT, _RAW, _VAR1, _VAR2, _LENGTH, _INT24 = range(6)
_INTS = {FIELD_TYPE.TINY: "b", FIELD_TYPE.SHORT: "h", FIELD_TYPE.LONG: "i", FIELD_TYPE.LONGLONG: "q",
         FIELD_TYPE.YEAR: "B"}


_TEMPORAL_BYTES = {FIELD_TYPE.DATE: 3, FIELD_TYPE.NEWDATE: 3, FIELD_TYPE.TIME: 3, FIELD_TYPE.DATETIME: 8,
                   FIELD_TYPE.TIMESTAMP: 4, FIELD_TYPE.DATETIME2: 5, FIELD_TYPE.TIMESTAMP2: 4, FIELD_TYPE.TIME2: 3}
_FRACTIONAL = frozenset({FIELD_TYPE.DATETIME2, FIELD_TYPE.TIMESTAMP2, FIELD_TYPE.TIME2})


def _reader(column: Any) -> tuple[int, Any]:
    t = column.type
    if t in _INTS:
        code = _INTS[t]
        return _STRUCT, struct.Struct("<" + (code.upper() if column.unsigned else code))
    if t == FIELD_TYPE.FLOAT:
        return _STRUCT, struct.Struct("<f")
    if t == FIELD_TYPE.DOUBLE:
        return _STRUCT, struct.Struct("<d")
    if t == FIELD_TYPE.INT24:
        return _INT24, not column.unsigned
    if t in (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING):
        return (_VAR2 if column.max_length > 255 else _VAR1), None
    if t in (FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY, FIELD_TYPE.JSON, FIELD_TYPE.TINY_BLOB, FIELD_TYPE.MEDIUM_BLOB,
             FIELD_TYPE.LONG_BLOB):
        return _LENGTH, column.length_size
    if t == FIELD_TYPE.NEWDECIMAL:
        return _RAW, decimal_bytes(column.precision, column.decimals)
    if t == FIELD_TYPE.BIT:
        return _RAW, column.bytes
    if t in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        return _RAW, column.size
    if t in _TEMPORAL_BYTES:
        return _RAW, _TEMPORAL_BYTES[t] + (fraction_bytes(column.fsp) if t in _FRACTIONAL else 0)
    raise ValueError(f"column {column.name!r} has binary log type {t}, which backend mysql does not decode")


@dataclass(frozen=True)
class ColumnSpec:
    """One column of a table map: its type and what decoding and converting its values need."""

    name: str
    type: ColumnType
    field_type: int
    encoding: str | None
    """Text columns: the Python codec of the column's character set (``utf8`` for utf8mb3/utf8mb4)."""
    labels: tuple[str, ...] = ()
    """``ENUM``: the labels, with ``''`` (MySQL's value for an invalid label) first; ``SET``: the labels."""
    fsp: int = 0
    width: int = 0
    """``BINARY(n)``: n. The binary log drops a fixed-length binary value's trailing zero bytes, which the column
    holds (and a ``SELECT`` returns): they are put back."""


class _Ctl:
    """What ``mysql-replication``'s event classes ask of a control connection when parsing a table map."""

    charset = "utf8mb4"

    def __init__(self, mariadb: bool) -> None:
        self._dbms = "mariadb" if mariadb else "mysql"

    def _get_dbms(self) -> str:
        return self._dbms


@dataclass
class MappedTable:
    """A table as one table map event describes it, with its row image readers."""

    name: str
    columns: tuple[ColumnSpec, ...]
    keys: tuple[int, ...]
    """Column indexes of the primary key (the query's key columns for the table)."""
    readers: list[tuple[int, int, Any]]
    index: dict[str, int] = field(default_factory=dict)
    checked: bool = False

    @property
    def width(self) -> int:
        return len(self.columns)


def parse_table_map(packet: bytes, checksum: bool, mariadb: bool) -> Any:
    """A table map event's packet parsed by ``mysql-replication`` (its ``Table``: columns with their metadata)."""
    wrapper = BinLogPacketWrapper(
        MysqlPacket(packet, "utf8"), {}, _Ctl(mariadb), (0, 0, 0), checksum, frozenset([TableMapEvent]),
        None, None, None, None, False, False, False, True, False, False, None,
    )
    if wrapper.event is None:
        raise ValueError("the table map event could not be parsed")
    return wrapper.event.get_table()


def map_table(table: Any, keys: Sequence[str]) -> MappedTable:
    """A :class:`MappedTable` from a parsed table map; ``keys`` names the primary key's columns."""
    specs = []
    readers = []
    for j, column in enumerate(table.columns):
        labels: tuple[str, ...] = ()
        if column.type == FIELD_TYPE.ENUM:
            labels = tuple(column.enum_values or ("",))
        elif column.type == FIELD_TYPE.SET:
            labels = tuple(column.set_values or ())
        name = column.name
        if not name:
            raise ServerSettingError(
                f"the binary log does not name the columns of {table.schema}.{table.table}: set "
                "binlog_row_metadata=FULL (a table map written before the setting changed)", "binlog_row_metadata")
        kind = binlog_type(column)
        width = column.max_length if column.type == FIELD_TYPE.STRING and kind.kind == BINARY else 0
        specs.append(ColumnSpec(name, kind, column.type, column.character_set_name, labels,
                                getattr(column, "fsp", 0) or 0, width))
        op, arg = _reader(column)
        readers.append((1 << j, op, arg))
    index = {s.name: j for j, s in enumerate(specs)}
    key_indexes = tuple(index[k] for k in keys if k in index)
    return MappedTable(f"{table.schema}.{table.table}", tuple(specs), key_indexes, readers, index)


# ------------------------------------------------------------------------------------------ row images
@dataclass
class Rows:
    """Decoded rows of one mapped table: raw values per column, and the records' metadata."""

    table: MappedTable
    columns: list[list[Any]]
    ops: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, table: MappedTable) -> Rows:
        return cls(table, [[] for _ in table.columns])

    def __len__(self) -> int:
        return len(self.ops)


def _image(data: bytes, pos: int, readers: list[tuple[int, int, Any]], adds: list[Any], null_bytes: int) -> int:
    """Append one row image's values (raw: ints, floats, bytes; None for null) through ``adds``; return the
    position after it."""
    nulls = int.from_bytes(data[pos : pos + null_bytes], "little")
    pos += null_bytes
    for (mask, op, arg), add in zip(readers, adds, strict=True):
        if nulls & mask:
            add(None)
        elif op == _STRUCT:
            add(arg.unpack_from(data, pos)[0])
            pos += arg.size
        elif op == _RAW:
            end = pos + arg
            add(data[pos:end])
            pos = end
        elif op == _VAR1:
            end = pos + 1 + data[pos]
            add(data[pos + 1 : end])
            pos = end
        elif op == _VAR2:
            end = pos + 2 + (data[pos] | data[pos + 1] << 8)
            add(data[pos + 2 : end])
            pos = end
        elif op == _LENGTH:
            start = pos + arg
            end = start + int.from_bytes(data[pos:start], "little")
            add(data[start:end])
            pos = end
        else:  # _INT24
            add(int.from_bytes(data[pos : pos + 3], "little", signed=arg))
            pos += 3
    return pos


def _length_coded(data: bytes, pos: int) -> tuple[int, int]:
    first = data[pos]
    if first < 251:
        return first, pos + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(data[pos + 1 : pos + 1 + size], "little"), pos + 1 + size


def decode_rows(
    rows: Rows, kind: int, data: bytes, pos: int, end: int, event_position: int, when: int
) -> None:
    """Append the records of one rows event's body (``data[pos:end]``, from its column count on) to ``rows``;
    their positions are ``event_position`` plus their index in the event."""
    table = rows.table
    width, pos = _length_coded(data, pos)
    present = (width + 7) // 8
    full = (1 << width) - 1
    if width != table.width or int.from_bytes(data[pos : pos + present], "little") != full or (
        kind == UPDATE_ROWS and int.from_bytes(data[pos + present : pos + 2 * present], "little") != full
    ):
        raise ServerSettingError(
            f"a rows event of {table.name} at position {event_position} logs only some columns: a session wrote it "
            "with binlog_row_image other than FULL (SET GLOBAL binlog_row_image = 'FULL' and reconnect the clients)",
            "binlog_row_image")
    pos += present * (2 if kind == UPDATE_ROWS else 1)
    readers = table.readers
    columns = rows.columns
    adds = [c.append for c in columns]
    ops, positions, times = rows.ops, rows.positions, rows.times
    n = present  # null bitmap bytes: every column is present
    k = 0
    if kind == WRITE:
        while pos < end:
            pos = _image(data, pos, readers, adds, n)
            k += 1
        ops.extend([INSERT] * k)
    elif kind == DELETE_ROWS:
        first = len(ops)
        while pos < end:
            pos = _image(data, pos, readers, adds, n)
            k += 1
        ops.extend([DELETE] * k)
        keys = table.keys
        for j, column in enumerate(columns):
            if j not in keys:
                column[first:] = [None] * k
    else:
        before: list[list[Any]] = [[] for _ in columns]
        before_adds = [c.append for c in before]
        keys = table.keys
        i = 0
        while pos < end:
            pos = _image(data, pos, readers, before_adds, n)
            pos = _image(data, pos, readers, adds, n)
            if any(before[j][i] != columns[j][-1] for j in keys):  # the key changed: a delete, then an insert
                for j, column in enumerate(columns):
                    column.insert(len(column) - 1, before[j][i] if j in keys else None)
                ops.append(DELETE)
                ops.append(INSERT)
                k += 2
            else:
                ops.append(UPDATE)
                k += 1
            i += 1
    if pos != end:
        raise ValueError(f"the row images run {pos - end} bytes past the event's end")
    positions.extend(range(event_position, event_position + k))
    times.extend([when] * k)


# ------------------------------------------------------------------------------------------------ layouts
def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def json_texts(names: Sequence[str], values: Sequence[Sequence[Any]], key_names: Sequence[str],
               ops: Sequence[str]) -> tuple[list[str], list[str | None]]:
    """The JSON layout's ``_key`` and ``_row`` texts of rows given as column value lists (``_row``: null for a
    delete)."""
    key_index = [list(names).index(k) for k in key_names]
    keys: list[str] = []
    out: list[str | None] = []
    for i, op in enumerate(ops):
        keys.append(json.dumps({k: values[j][i] for k, j in zip(key_names, key_index, strict=True)},
                               default=_json_default, separators=(",", ":"), ensure_ascii=False))
        if op == DELETE:
            out.append(None)
        else:
            out.append(json.dumps({n: values[j][i] for j, n in enumerate(names)}, default=_json_default,
                                  separators=(",", ":"), ensure_ascii=False))
    return keys, out


@dataclass
class Layout:
    """A query's record layout: typed (``tables`` holds one table) or JSON (several)."""

    tables: tuple[TableInfo, ...]

    @property
    def typed(self) -> bool:
        return len(self.tables) == 1

    def table(self, name: str) -> TableInfo | None:
        return next((t for t in self.tables if t.name == name), None)

    def change_schema(self) -> ChangeSchema:
        if self.typed:
            t = self.tables[0]
            return ChangeSchema.of(t.arrow_schema(), t.keys)
        return JSON_SCHEMA

    def arrow_schema(self) -> pa.Schema:
        return self.change_schema().arrow()

    def known_columns(self) -> dict[str, dict[str, ColumnType]]:
        """The columns a read starts knowing, per table (:meth:`check` adds what it sees)."""
        return {t.name: dict(t.columns) for t in self.tables}

    def check(self, table: MappedTable, known: dict[str, dict[str, ColumnType]]) -> None:
        """Refuse a table map whose columns the query cannot follow (see the module); in the JSON layout,
        remember the columns it adds."""
        info = self.table(table.name)
        assert info is not None
        columns = known[table.name]
        names = {s.name for s in table.columns}
        gone = [n for n in columns if n not in names]
        for spec in table.columns:
            was = columns.get(spec.name)
            if was is None:
                if gone:
                    raise SchemaChangedError(
                        f"table {table.name!r}: column {spec.name!r} came in as {gone[0]!r} went out (a rename, or a "
                        "drop with an add): a rename cannot be followed; start a new query (new checkpoint) from a "
                        "position after the change", table.name)
                if self.typed:
                    raise SchemaChangedError(
                        f"table {table.name!r}: column {spec.name!r} was added after the query started: restart the "
                        "query to read the new schema", table.name)
                columns[spec.name] = spec.type
            elif was.arrow() != spec.type.arrow():
                raise SchemaChangedError(
                    f"table {table.name!r}: column {spec.name!r} changed type from {was.describe()} to "
                    f"{spec.type.describe()}: a change of type cannot be followed; start a new query (new "
                    "checkpoint) from a position after the change", table.name)
        missing_keys = [k for k in info.keys if k not in names]
        if missing_keys:
            raise SchemaChangedError(
                f"table {table.name!r}: primary key column {missing_keys[0]!r} is gone (dropped or renamed): start a "
                "new query (new checkpoint) from a position after the change", table.name)

    def keys(self, name: str) -> tuple[str, ...]:
        info = self.table(name)
        return info.keys if info is not None else ()


class BatchBuilder:
    """Records of a read in position order, as Arrow batches of the query's layout."""

    def __init__(self, layout: Layout, channel: str) -> None:
        self.layout = layout
        self.channel = channel
        self.schema = layout.arrow_schema()
        self.pending: list[Rows] = []
        self.records = 0

    def rows(self, table: MappedTable) -> Rows:
        """The :class:`Rows` that the next records of ``table`` go to."""
        if not self.pending or self.pending[-1].table is not table:
            self.pending.append(Rows.of(table))
        return self.pending[-1]

    def count(self) -> int:
        return sum(len(r) for r in self.pending)

    def build(self) -> pa.RecordBatch | None:
        """The pending records as one batch (None when there are none); the builder is empty after."""
        pending = [r for r in self.pending if len(r)]
        self.pending = []
        if not pending:
            return None
        parts = [self._typed(r) if self.layout.typed else self._json(r) for r in pending]
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts, schema=self.schema).combine_chunks().to_batches()[0]

    def _meta(self, rows: Rows) -> dict[str, pa.Array]:
        position = pa.array(rows.positions, pa.int64())
        return {
            "_op": pa.array(rows.ops, pa.string()),
            "_seq": position,
            "_commit_ts": pa.array(rows.times, pa.timestamp("us", tz="UTC")),
            "_channel": pa.repeat(pa.scalar(self.channel, pa.string()), len(rows)),
            "_position": position,
        }

    def _typed(self, rows: Rows) -> pa.RecordBatch:
        cols = self._meta(rows)
        table = rows.table
        for f in self.schema:
            if f.name in cols:
                continue
            j = table.index.get(f.name)
            if j is None:  # a column the table did not have yet when this row was written
                cols[f.name] = pa.nulls(len(rows), f.type)
            else:
                cols[f.name] = convert(table.columns[j], rows.columns[j], f.type)
        return pa.RecordBatch.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)

    def _json(self, rows: Rows) -> pa.RecordBatch:
        cols = self._meta(rows)
        table = rows.table
        names = [s.name for s in table.columns]
        values = [convert(s, rows.columns[j], s.type.arrow()).to_pylist() for j, s in enumerate(table.columns)]
        keys, out = json_texts(names, values, self.layout.keys(table.name), rows.ops)
        cols[JSON_TABLE] = pa.repeat(pa.scalar(table.name, pa.string()), len(rows))
        cols[JSON_KEY] = pa.array(keys, pa.string())
        cols[JSON_ROW] = pa.array(out, pa.string())
        return pa.RecordBatch.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
