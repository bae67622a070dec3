"""The table's schema: the columns a first batch creates, the columns a later batch adds (schema
evolution), and the Arrow types the sink stores (:func:`normalise_type`).

A column new to the table is added (nullable) before the merge; a column whose type differs from the
table's fails the batch with :class:`SchemaEvolutionError` before anything is written.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from cdc.errors import TerminalError
from sinks.delta.layout import (
    ACTION,
    DELETED_AT,
    IS_CURRENT,
    IS_DELETE,
    NOW,
    SET_PREFIX,
    TIMESTAMP,
    VALID_FROM,
    VALID_TO,
)
from sinks.delta.spec import SinkSpec

log = logging.getLogger(__name__)


class SchemaEvolutionError(TerminalError):
    """The changes carry a column whose type differs from the Delta table's; nothing was written."""


def normalise_type(t: pa.DataType) -> pa.DataType:
    """The type the sink stores for a column of type ``t``: one string, one binary, UTC timestamps."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise SchemaEvolutionError("naive timestamps are not supported in Delta tables written by the sink; use UTC")
        return TIMESTAMP
    return t


def data_columns(spec: SinkSpec, prepared: pa.Schema) -> list[pa.Field]:
    """The table columns a prepared batch carries (keys first, then values, sequence, commit time)."""
    out = []
    for name in spec.keys:
        out.append(pa.field(name, prepared.field(name).type, nullable=False))
    for f in prepared:
        if f.name in spec.keys or f.name in (IS_DELETE, NOW, ACTION, DELETED_AT) or f.name.startswith(SET_PREFIX):
            continue
        if f.name in spec.hidden:
            continue
        out.append(pa.field(f.name, f.type, nullable=True))
    return out


def table_schema(spec: SinkSpec, prepared: pa.Schema) -> pa.Schema:
    """The schema of a new main table for the first batch (no tombstone column: see :mod:`sinks.delta.layout`)."""
    fields = data_columns(spec, prepared)
    if spec.scd_type == 2:
        st = prepared.field(spec.sequence_by).type
        fields += [pa.field(VALID_FROM, st), pa.field(VALID_TO, st)]
        if IS_CURRENT not in spec.hidden:
            fields.append(pa.field(IS_CURRENT, pa.bool_()))
    return pa.schema(fields)


def state_schema(spec: SinkSpec, prepared: pa.Schema) -> pa.Schema:
    """The schema of the state table: key, last applied sequence, tombstone time."""
    keys = [pa.field(k, prepared.field(k).type, nullable=False) for k in spec.keys]
    seq = pa.field(spec.sequence_by, prepared.field(spec.sequence_by).type, nullable=False)
    return pa.schema([*keys, seq, pa.field(DELETED_AT, TIMESTAMP, nullable=True)])


def new_columns(spec: SinkSpec, table: pa.Schema, prepared: pa.Schema) -> list[pa.Field]:
    """Columns to add to ``table`` before merging ``prepared``; raises on an incompatible type change."""
    existing = {f.name: f for f in table}
    added: list[pa.Field] = []
    conflicts = []
    for f in data_columns(spec, prepared):
        have = existing.get(f.name)
        if have is None:
            if f.name in spec.keys:
                raise SchemaEvolutionError(
                    f"column {f.name!r} is a key column of the changes but not of the table "
                    f"({table.names}); keys cannot change"
                )
            added.append(pa.field(f.name, f.type, nullable=True))
        elif not normalise_type(have.type).equals(f.type):
            conflicts.append(f"{f.name!r}: table has {have.type}, changes have {f.type}")
    if conflicts:
        raise SchemaEvolutionError(
            "incompatible column type change; nothing was written: " + "; ".join(conflicts)
            + ". Rewrite the table with the new type, or exclude the column (except_column_list)."
        )
    if spec.track_history_columns:
        known = set(existing) | {f.name for f in added}
        unknown = [c for c in spec.track_history_columns if c not in known]
        if unknown:  # may appear later (schema evolution); until then they cannot change
            log.warning("track_history_columns %s are not (yet) columns of the table", unknown)
    return added
