"""The change model: one schema for every change record, whatever the backend.

A change record is one row-level change of a keyed table. Its columns, in this order:

========== ============================ ===================================================================
column     type                         meaning
========== ============================ ===================================================================
``_op``    string, not null             ``insert``, ``update``, ``delete``, or ``snapshot`` (a row read
                                        from a full export; see the full-plus-incremental hand-off);
                                        ``truncate``: the whole table was emptied at the source (its key
                                        and value columns mean nothing; only ``_seq``, ``_commit_ts``,
                                        ``_channel`` and ``_position`` do). Only a Debezium source with
                                        ``debezium.truncate=apply`` sends it;
                                        ``refresh``: the table's re-snapshot (PostgreSQL:
                                        ``cdc postgres resnapshot``) delivered its last row: every row of
                                        the table whose sequence is below this record's ``_seq`` is gone
                                        at the source (its key and value columns mean nothing)
``_seq``   long, not null               orders the records of a channel totally; a child channel's
                                        records have larger sequences than its parents', so per key the
                                        sequence is the order of the changes
``_commit_ts`` timestamp (UTC), not null when the change was committed at the source
``_channel`` string, not null           the channel (partition) the record was read from
``_position`` long, not null            the record's position in its channel (0-based, gap-free in the
                                        local log; backend-defined elsewhere)
key columns the table's types, not null the row's primary key (one or more columns)
other columns the table's types, nullable the row's values after the change; null for a delete
``_unchanged`` array<string>, nullable  only in a *partial* change schema (see below)
``_old_key`` struct of the key columns, only in a schema with *key changes* (see below): on the insert
           nullable                     half of an update that changed the key, the key before it
========== ============================ ===================================================================

Partial changes. Some sources do not send the whole row after an update: a Tablestore ``UpdateRow``
carries only the columns it sets or deletes. A backend whose records may be partial declares a
``ChangeSchema(..., partial=True)``; its records then carry ``_unchanged``, the value columns the change
leaves as they were (their values in the record are null and mean nothing). ``_unchanged`` is null (or
empty) for a record that carries the whole row: every insert, delete and snapshot row, and updates that set
every column. A column that a change sets to null (Tablestore: deletes) is not in ``_unchanged``. Sinks
fold consecutive partial changes of a key in sequence order and keep the target's value for the columns
that stay unchanged (see ``sinks.delta.batch``).

Key changes. Some sources let an update change a row's key (PostgreSQL: ``UPDATE t SET id = 10 WHERE
id = 1``; Debezium sends it as a delete of the old key, a tombstone and a create of the new one). A backend
whose keys can change declares ``ChangeSchema(..., key_changes=True)`` and delivers such an update as two
records, adjacent and in this order: a ``delete`` of the old key, then an ``insert`` of the new key whose
``_old_key`` holds the old key's columns (a struct of the key columns, named and typed as in the table;
``_old_key`` is null on every other record). For a many-table query (one JSON layout for every table, see
the PostgreSQL backend) the key columns are ``_table`` and ``_key``, so ``_old_key`` is
``{_table, _key}`` with the old key's JSON object.

The link matters when the insert is partial. Its ``_unchanged`` columns are values the source did not send
because the update did not touch them (PostgreSQL under ``REPLICA IDENTITY DEFAULT``: unchanged TOASTed
values; Debezium: its ``unavailable.value.placeholder``); they are the old key's values just before the
delete. A consumer must take them from the old key's row, which it holds (as ``sinks.delta`` does, in
:func:`sinks.delta.batch.complete_key_changes`), or fail: the insert is never a row of nulls in those
columns. When the source does send the old values (PostgreSQL under ``REPLICA IDENTITY FULL`` logs the whole
old row), the backend completes the record itself and ``_unchanged`` is empty: every update, key-changing or
not, is then a whole row, which a consumer that keeps no table state can apply as it is (Spark's own
``AUTO CDC`` flows, a plain ``foreachBatch`` upsert). ``_old_key`` stays set on such complete inserts: it
tells any consumer which row moved.

The Arrow schema (:func:`ChangeSchema.arrow`) and the Spark schema (:func:`ChangeSchema.spark`) agree
exactly: ``pyspark``'s ``to_arrow_schema(spark())`` equals ``arrow()``, which is what a Python data source
must yield.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa

from cdc.errors import SchemaError


class Op(StrEnum):
    """The kinds of change."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    SNAPSHOT = "snapshot"
    TRUNCATE = "truncate"
    REFRESH = "refresh"


OP = "_op"
SEQ = "_seq"
COMMIT_TS = "_commit_ts"
CHANNEL = "_channel"
POSITION = "_position"
UNCHANGED = "_unchanged"
OLD_KEY = "_old_key"
#: Spark field metadata on ``_seq`` that ``format("cdc")`` sets when its backend delivers every key's changes in
#: sequence order (:attr:`cdc.backend.Backend.orders_keys`); the value identifies one source instance, so a
#: consumer can tell one source's output from a union of several (see ``sinks.delta``'s ordered mode).
KEY_ORDER_MARK = "cdc.key_order"

METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(OP, pa.string(), nullable=False),
    pa.field(SEQ, pa.int64(), nullable=False),
    pa.field(COMMIT_TS, pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field(CHANNEL, pa.string(), nullable=False),
    pa.field(POSITION, pa.int64(), nullable=False),
)
METADATA_COLUMNS: tuple[str, ...] = tuple(f.name for f in METADATA_FIELDS)
UNCHANGED_FIELD = pa.field(UNCHANGED, pa.list_(pa.string()), nullable=True)
RESERVED_COLUMNS: frozenset[str] = frozenset((*METADATA_COLUMNS, UNCHANGED, OLD_KEY))

# Arrow types that map one-to-one onto Spark SQL types (so the two schemas can agree exactly).
_SUPPORTED = (
    pa.types.is_boolean,
    pa.types.is_int8,
    pa.types.is_int16,
    pa.types.is_int32,
    pa.types.is_int64,
    pa.types.is_float32,
    pa.types.is_float64,
    pa.types.is_string,
    pa.types.is_binary,
    pa.types.is_date32,
    pa.types.is_decimal128,
)


def _check_type(name: str, t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise SchemaError(f"column {name!r}: naive timestamps are not supported; use a UTC timestamp")
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if any(check(t) for check in _SUPPORTED):
        return t
    raise SchemaError(f"column {name!r}: type {t} is not supported by the change model")


@dataclass(frozen=True)
class ChangeSchema:
    """The schema of a keyed table's change records: metadata columns, then the table's columns."""

    table: pa.Schema
    keys: tuple[str, ...]
    partial: bool = False
    key_changes: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise SchemaError("a change schema needs at least one key column")
        names = self.table.names
        for k in self.keys:
            if k not in names:
                raise SchemaError(f"key column {k!r} is not a column of the table ({', '.join(names)})")
        clash = set(names) & RESERVED_COLUMNS
        if clash:
            raise SchemaError(f"table columns {sorted(clash)} collide with the change model's metadata columns")
        fields = []
        for f in self.table:
            fields.append(pa.field(f.name, _check_type(f.name, f.type), nullable=f.name not in self.keys))
        object.__setattr__(self, "table", pa.schema(fields))

    @classmethod
    def of(
        cls,
        table: pa.Schema | Sequence[tuple[str, pa.DataType]],
        keys: Sequence[str],
        *,
        partial: bool = False,
        key_changes: bool = False,
    ) -> ChangeSchema:
        schema = table if isinstance(table, pa.Schema) else pa.schema(list(table))
        return cls(schema, tuple(keys), partial, key_changes)

    @property
    def old_key_type(self) -> pa.StructType:
        """The type of ``_old_key``: a struct of the key columns, as typed in the table."""
        return old_key_type(self.table, self.keys)

    @property
    def metadata_fields(self) -> tuple[pa.Field, ...]:
        """The metadata columns of this schema: the five common ones, plus ``_unchanged`` when partial and
        ``_old_key`` when keys can change."""
        fields = (*METADATA_FIELDS, UNCHANGED_FIELD) if self.partial else METADATA_FIELDS
        if self.key_changes:
            fields = (*fields, pa.field(OLD_KEY, self.old_key_type, nullable=True))
        return fields

    def arrow(self) -> pa.Schema:
        """The Arrow schema of change records, as a Python data source must yield them."""
        return pa.schema(list(self.metadata_fields) + list(self.table))

    def spark(self) -> Any:
        """The Spark ``StructType`` that matches :meth:`arrow` exactly."""
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.arrow())

    @property
    def value_columns(self) -> tuple[str, ...]:
        return tuple(n for n in self.table.names if n not in self.keys)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"keys": list(self.keys), "schema": schema_to_json(self.table)}
        if self.partial:
            out["partial"] = True
        if self.key_changes:
            out["key_changes"] = True
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangeSchema:
        return cls(schema_from_json(data["schema"]), tuple(data["keys"]), bool(data.get("partial", False)),
                   bool(data.get("key_changes", False)))


def old_key_type(table: pa.Schema, keys: Sequence[str]) -> pa.StructType:
    """The type of ``_old_key`` for a table with these key columns (see the module docstring). Its fields are
    nullable as Arrow sees them: a null ``_old_key`` has null children, which Spark's Arrow conversion
    (``toArrow``) refuses to view as non-nullable fields."""
    return pa.struct([pa.field(k, table.field(k).type) for k in keys])


def schema_to_json(schema: pa.Schema) -> str:
    """Serialise an Arrow schema to a string that survives JSON files (base64 of Arrow IPC)."""
    import base64

    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_json(text: str) -> pa.Schema:
    import base64

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
