"""Tables as the catalog describes them: columns, PostgreSQL types, primary keys, and their Arrow form.

Type mapping (PostgreSQL -> Arrow/Spark): ``boolean`` -> bool, ``smallint``/``integer``/``bigint`` ->
int16/int32/int64, ``real``/``double precision`` -> float32/float64, ``numeric(p, s)`` with p <= 38 ->
decimal128(p, s) (other numerics -> string, exact text), ``bytea`` -> binary, ``date`` -> date32,
``timestamptz`` -> timestamp UTC, ``timestamp`` (without time zone) -> timestamp UTC read as UTC (Spark has
no naive timestamp in this model), anything else (text, varchar, uuid, json, arrays, enums...) -> string in
PostgreSQL's text form. Values are parsed by psycopg's own text loaders.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg.pq import Format

from cdc.backends.postgres.errors import NoPrimaryKeyError
from cdc.errors import OptionError

BOOL, INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, BYTEA, DATE, TIMESTAMP, TIMESTAMPTZ = (
    16, 21, 23, 20, 700, 701, 1700, 17, 1082, 1114, 1184,
)
_SIMPLE: dict[int, pa.DataType] = {
    BOOL: pa.bool_(),
    INT2: pa.int16(),
    INT4: pa.int32(),
    INT8: pa.int64(),
    FLOAT4: pa.float32(),
    FLOAT8: pa.float64(),
    BYTEA: pa.binary(),
    DATE: pa.date32(),
    TIMESTAMP: pa.timestamp("us", tz="UTC"),
    TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
}


def arrow_type(type_oid: int, typmod: int) -> pa.DataType:
    if type_oid in _SIMPLE:
        return _SIMPLE[type_oid]
    if type_oid == NUMERIC and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        if 0 < precision <= 38 and scale <= precision:
            return pa.decimal128(precision, scale)
    return pa.string()


class ValueParser:
    """Text-form values of one column type -> Python values for its Arrow type."""

    def __init__(self, type_oid: int, arrow: pa.DataType) -> None:
        self.naive = type_oid == TIMESTAMP
        loader = None if pa.types.is_string(arrow) else psycopg.adapters.get_loader(type_oid, Format.TEXT)
        self._load = None if loader is None else loader(type_oid, None).load

    def __call__(self, raw: bytes) -> Any:
        if self._load is None:
            return raw.decode()
        value = self._load(raw)
        if self.naive and isinstance(value, datetime):
            return value.replace(tzinfo=UTC)
        return value


@dataclass(frozen=True)
class TableInfo:
    """A table's columns (name, type oid, typmod) in order and its primary key columns."""

    name: str
    columns: tuple[tuple[str, int, int], ...]
    keys: tuple[str, ...]

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(n, arrow_type(oid, mod)) for n, oid, mod in self.columns])

    def signature(self) -> tuple[tuple[str, int, int], ...]:
        return self.columns


def describe(conn: psycopg.Connection[Any], table: str) -> TableInfo:
    """The catalog's description of ``table`` (``schema.table``); refuses a table without a primary key."""
    schema, _, name = table.partition(".")
    row = conn.execute(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, name),
    ).fetchone()
    if row is None:
        raise OptionError(f"option 'tables': table {table!r} does not exist (or is not a table)", "tables")
    oid = row[0]
    columns = conn.execute(
        "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        (oid,),
    ).fetchall()
    keys = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary "
        "ORDER BY array_position(i.indkey::int2[], a.attnum)",
        (oid,),
    ).fetchall()
    if not keys:
        raise NoPrimaryKeyError(
            f"option 'tables': table {table!r} has no primary key; backend postgres needs one to key its "
            "changes (add one with ALTER TABLE ... ADD PRIMARY KEY)",
            table,
        )
    return TableInfo(table, tuple((str(n), int(t), int(m)) for n, t, m in columns), tuple(str(k[0]) for k in keys))
