"""Tables as the server describes them, and the one type mapping of ``backend=mysql``.

A column's type is known twice: from ``information_schema`` when the query starts (:func:`describe`) and from
every table map event of the binary log (:func:`binlog_type`, from the column metadata that
``binlog_row_metadata=FULL`` writes). Both become a :class:`ColumnType`, whose :meth:`~ColumnType.arrow` is
the record's type, so a query's schema and the changes it decodes always agree, and a column whose type
changed is seen as one.

Type mapping (MySQL/MariaDB -> Arrow/Spark):

=============================================== ======================================================
``TINYINT``, ``SMALLINT``, ``MEDIUMINT``,       int8, int16, int32, int32, int64
``INT``, ``BIGINT``
the same ``UNSIGNED``                           int16, int32, int32, int64, decimal(20, 0) (never wrapped)
``DECIMAL(p, s)``                               decimal(p, s) for p <= 38, else string (exact text)
``FLOAT``, ``DOUBLE``                           float32, float64
``BIT(1)``; ``BIT(n)``                          bool; binary (big-endian, ceil(n / 8) bytes)
``YEAR``                                        int16 (``0000`` is 0)
``DATE``                                        date32
``DATETIME(fsp)``                               timestamp UTC: the wall-clock value read as UTC
``TIMESTAMP(fsp)``                              timestamp UTC: the instant
``TIME(fsp)``                                   string ``[-]HHH:MM:SS[.ffffff]`` (an interval up to 838 h)
``CHAR``, ``VARCHAR``, ``TEXT`` types, ``ENUM``, string (an ``ENUM``'s label, a ``SET``'s labels joined by
``SET``, ``JSON``                               commas in definition order, JSON text)
``BINARY``, ``VARBINARY``, ``BLOB`` types,      binary (the stored bytes)
spatial types, MariaDB ``UUID``/``INET4``/``INET6``
=============================================== ======================================================

Zero and invalid dates (``0000-00-00``, ``2024-00-10``, a zero ``DATETIME`` or ``TIMESTAMP``) become null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pymysqlreplication.constants import FIELD_TYPE

from cdc.backends.mysql.errors import NoPrimaryKeyError
from cdc.errors import OptionError

INT, DECIMAL, FLOAT, DOUBLE, BIT, YEAR, DATE, DATETIME, TIMESTAMP, TIME, TEXT, BINARY, ENUM, SET, JSON = (
    "int", "decimal", "float", "double", "bit", "year", "date", "datetime", "timestamp", "time", "text", "binary",
    "enum", "set", "json",
)


@dataclass(frozen=True)
class ColumnType:
    """A column's type as far as decoding and the Arrow type need it.

    ``size``: bytes of an integer, bits of a ``BIT``, precision of a ``DECIMAL``; ``scale``: a ``DECIMAL``'s
    scale, a temporal type's fractional digits."""

    kind: str
    size: int = 0
    scale: int = 0
    unsigned: bool = False

    def arrow(self) -> pa.DataType:
        kind = self.kind
        if kind == INT:
            if self.unsigned:
                return {1: pa.int16(), 2: pa.int32(), 3: pa.int32(), 4: pa.int64()}.get(self.size, pa.decimal128(20, 0))
            return {1: pa.int8(), 2: pa.int16(), 3: pa.int32(), 4: pa.int32()}.get(self.size, pa.int64())
        if kind == DECIMAL:
            return pa.decimal128(self.size, self.scale) if 0 < self.size <= 38 else pa.string()
        if kind == BIT:
            return pa.bool_() if self.size == 1 else pa.binary()
        return _ARROW[kind]

    def describe(self) -> str:
        """The type as a message names it (``int(4 bytes) unsigned``, ``decimal(10,2)``)."""
        detail = {INT: f"({self.size} bytes)", DECIMAL: f"({self.size},{self.scale})", BIT: f"({self.size})"}
        return self.kind + detail.get(self.kind, "") + (" unsigned" if self.unsigned else "")


_ARROW: dict[str, pa.DataType] = {
    FLOAT: pa.float32(), DOUBLE: pa.float64(), YEAR: pa.int16(), DATE: pa.date32(),
    DATETIME: pa.timestamp("us", tz="UTC"), TIMESTAMP: pa.timestamp("us", tz="UTC"), TIME: pa.string(),
    TEXT: pa.string(), BINARY: pa.binary(), ENUM: pa.string(), SET: pa.string(), JSON: pa.string(),
}

_INT_BYTES = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "integer": 4, "bigint": 8}
_TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
_SIMPLE = {"float": FLOAT, "double": DOUBLE, "real": DOUBLE, "year": YEAR, "date": DATE, "datetime": DATETIME,
           "timestamp": TIMESTAMP, "time": TIME, "enum": ENUM, "set": SET, "json": JSON}


def catalog_type(data_type: str, column_type: str, precision: Any, scale: Any, datetime_precision: Any,
                 charset: str | None) -> ColumnType:
    """A column's type from its ``information_schema.COLUMNS`` row."""
    data_type = data_type.lower()
    unsigned = "unsigned" in column_type.lower()
    if data_type in _INT_BYTES:
        return ColumnType(INT, _INT_BYTES[data_type], unsigned=unsigned)
    if data_type in ("decimal", "numeric"):
        return ColumnType(DECIMAL, int(precision), int(scale or 0))
    if data_type == "bit":
        return ColumnType(BIT, int(precision))
    if data_type in _TEXT_TYPES:
        return ColumnType(BINARY if charset in (None, "binary") else TEXT)
    if data_type in _SIMPLE:
        kind = _SIMPLE[data_type]
        return ColumnType(kind, scale=int(datetime_precision or 0) if kind in (DATETIME, TIMESTAMP, TIME) else 0)
    return ColumnType(BINARY)  # binary, varbinary, blobs, spatial types, MariaDB's uuid, inet4, inet6


_BINLOG_INT_BYTES = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4,
                     FIELD_TYPE.LONGLONG: 8}
_BINLOG_SIMPLE = {
    FIELD_TYPE.FLOAT: FLOAT, FIELD_TYPE.DOUBLE: DOUBLE, FIELD_TYPE.YEAR: YEAR, FIELD_TYPE.DATE: DATE,
    FIELD_TYPE.NEWDATE: DATE, FIELD_TYPE.DATETIME: DATETIME, FIELD_TYPE.DATETIME2: DATETIME,
    FIELD_TYPE.TIMESTAMP: TIMESTAMP, FIELD_TYPE.TIMESTAMP2: TIMESTAMP, FIELD_TYPE.TIME: TIME,
    FIELD_TYPE.TIME2: TIME, FIELD_TYPE.ENUM: ENUM, FIELD_TYPE.SET: SET, FIELD_TYPE.JSON: JSON,
    FIELD_TYPE.GEOMETRY: BINARY,
}
_BINLOG_STRINGS = frozenset({FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING, FIELD_TYPE.BLOB,
                             FIELD_TYPE.TINY_BLOB, FIELD_TYPE.MEDIUM_BLOB, FIELD_TYPE.LONG_BLOB})


def binlog_type(column: Any) -> ColumnType:
    """A column's type from a table map event (a ``pymysqlreplication`` column with its metadata)."""
    t = column.type
    if t in _BINLOG_INT_BYTES:
        return ColumnType(INT, _BINLOG_INT_BYTES[t], unsigned=bool(column.unsigned))
    if t == FIELD_TYPE.NEWDECIMAL:
        return ColumnType(DECIMAL, column.precision, column.decimals)
    if t == FIELD_TYPE.BIT:
        return ColumnType(BIT, column.bits)
    if t in _BINLOG_STRINGS:
        return ColumnType(BINARY if column.character_set_name == "binary" else TEXT)
    if t in _BINLOG_SIMPLE:
        kind = _BINLOG_SIMPLE[t]
        return ColumnType(kind, scale=getattr(column, "fsp", 0) or 0)
    raise ValueError(f"column {column.name!r} has binary log type {t}, which backend mysql does not decode")


@dataclass(frozen=True)
class TableInfo:
    """A table (``database.table``): its columns in order and its primary key's columns."""

    name: str
    columns: tuple[tuple[str, ColumnType], ...]
    keys: tuple[str, ...]

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(n, t.arrow()) for n, t in self.columns])

    @property
    def database(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]


def describe(conn: Any, table: str) -> TableInfo:
    """``information_schema``'s description of ``table`` (``database.table``); refuses one without a primary
    key, and a view."""
    database, _, name = table.partition(".")
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (database, name))
        row = cur.fetchone()
        if row is None or row[0] != "BASE TABLE":
            what = "does not exist (or the user has no privilege on it)" if row is None else f"is a {row[0].lower()}"
            raise OptionError(f"option 'tables': table {table!r} {what}; name a table the user may SELECT", "tables")
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, "
            "CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "ORDER BY ORDINAL_POSITION",
            (database, name),
        )
        columns = tuple((str(r[0]), catalog_type(str(r[1]), str(r[2]), r[3], r[4], r[5], r[6]))
                        for r in cur.fetchall())
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (database, name),
        )
        keys = tuple(str(r[0]) for r in cur.fetchall())
    if not keys:
        raise NoPrimaryKeyError(
            f"option 'tables': table {table!r} has no primary key; backend mysql needs one to key its changes "
            "(add one with ALTER TABLE ... ADD PRIMARY KEY (...))",
            table,
        )
    return TableInfo(table, columns, keys)
