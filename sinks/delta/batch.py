"""Batch preparation: validate a batch of change records and reduce it to what the MERGE applies.

SCD type 1 keeps the latest change per key (:func:`latest_per_key`), or, when the batch holds partial
changes, folds each key's changes in sequence order (:func:`fold_partial`); SCD type 2 keeps every change,
sorted by key and sequence with replays dropped (:func:`resolve_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import MalformedRecordError, OptionError
from cdc.model import CHANNEL, COMMIT_TS, OP, POSITION, UNCHANGED, Op
from sinks.delta.layout import (
    DEFAULT_DELETE_CONDITION,
    DROPPED_METADATA,
    HIDDEN_PREFIX,
    IS_DELETE,
    NOW,
    SET_PREFIX,
    TIMESTAMP,
)
from sinks.delta.schema import normalise_type
from sinks.delta.spec import SinkSpec


def after_last_truncate(batch: pa.Table, sequence_by: str) -> tuple[pa.Table, Any]:
    """(the changes after the batch's last truncate record, that truncate's sequence), or (the batch, None)
    when it has none. A truncate (``_op`` ``truncate``, see :mod:`cdc.model`) empties the whole table, so
    the changes sequenced before it in the batch have nothing left to change."""
    if OP not in batch.column_names or batch.num_rows == 0:
        return batch, None
    is_truncate = pc.fill_null(pc.equal(batch.column(OP), Op.TRUNCATE.value), False)
    if not pc.any(is_truncate).as_py():
        return batch, None
    at = pc.max(batch.filter(is_truncate).column(sequence_by)).as_py()
    later = pc.and_(pc.greater(batch.column(sequence_by), at), pc.invert(is_truncate))
    return batch.filter(later), at


def check_columns(spec: SinkSpec, names: list[str]) -> None:
    """The batch has the key and sequence columns and none the sink reserves (both engines' first check)."""
    missing = [c for c in (*spec.keys, spec.sequence_by) if c not in names]
    if missing:
        raise OptionError(
            f"the changes have no column(s) {missing} named by 'keys'/'sequence_by'; columns: {names}",
            "keys" if set(missing) & set(spec.keys) else "sequence_by",
        )
    clash = [c for c in names if c in spec.reserved[2:] or (c.startswith(HIDDEN_PREFIX) and c != IS_DELETE)]
    if clash:
        raise OptionError(f"the changes carry columns reserved by the sink: {clash}", "keys")


ACCEPTED_OPS: tuple[str, ...] = tuple(o.value for o in Op)


def unknown_ops_error(count: int, values: Sequence[Any], where: str) -> MalformedRecordError:
    """The error for change records whose ``_op`` lies outside the change model (both engines raise it)."""
    shown = ", ".join("null" if v is None else repr(v) for v in values)
    return MalformedRecordError(
        f"{count} change record(s) have an {OP!r} outside the change model: {shown} ({where}); accepted: "
        f"{', '.join(ACCEPTED_OPS)}. Nothing was written: the sink has no quarantine, so the batch fails until "
        f"its records are fixed (or give 'apply_as_deletes' to decide deletes by another condition)"
    )


def check_ops(spec: SinkSpec, batch: pa.Table) -> None:
    """Refuse a batch whose ``_op`` values lie outside the change model (:class:`cdc.model.Op`), as the local
    log does at append: applied as upserts, they would write what no source meant. Checked when the sink
    reads ``_op`` itself (the default ``apply_as_deletes``); with another condition ``_op`` is the user's."""
    if OP not in batch.column_names or IS_DELETE in batch.column_names or batch.num_rows == 0:
        return
    if spec.apply_as_deletes.strip() != DEFAULT_DELETE_CONDITION:
        return
    ops = batch.column(OP)
    known = pc.fill_null(pc.is_in(ops, value_set=pa.array(ACCEPTED_OPS, ops.type)), False)
    if pc.all(known).as_py():
        return
    bad = batch.filter(pc.invert(known))
    values = sorted(bad.column(OP).unique().to_pylist(), key=lambda v: (v is not None, v or ""))
    raise unknown_ops_error(bad.num_rows, values, first_at(bad.slice(0, 1).to_pylist()[0], spec.sequence_by))


def prepare(spec: SinkSpec, batch: pa.Table, now: datetime) -> pa.Table:
    """Validate a batch of change records, drop what the table does not keep, reduce it per key (see the
    module docstring), and add the source-only columns ``__cdc_is_delete`` and ``__cdc_now``."""
    names = batch.column_names
    check_columns(spec, names)
    seq_type = batch.schema.field(spec.sequence_by).type
    if not (pa.types.is_integer(seq_type) or pa.types.is_timestamp(seq_type)):
        raise OptionError(
            f"option 'sequence_by': column {spec.sequence_by!r} has type {seq_type}; an integer or "
            "timestamp column is required",
            "sequence_by",
        )
    if IS_DELETE not in names:
        if spec.apply_as_deletes.strip() != DEFAULT_DELETE_CONDITION:
            raise OptionError(
                f"option 'apply_as_deletes' ({spec.apply_as_deletes!r}) is a SQL condition evaluated by Spark "
                f"in the foreachBatch wrapper; a batch applied directly must carry the boolean column {IS_DELETE!r}",
                "apply_as_deletes",
            )
        if OP not in names:
            raise OptionError(f"the changes have no {OP!r} column to find deletes with", "apply_as_deletes")
        is_delete = pc.fill_null(pc.equal(batch.column(OP), Op.DELETE.value), False)
        batch = batch.append_column(IS_DELETE, is_delete)
    else:
        batch = batch.set_column(
            names.index(IS_DELETE), IS_DELETE, pc.fill_null(batch.column(IS_DELETE).cast(pa.bool_()), False)
        )
    for c in (*spec.keys, spec.sequence_by):
        nulls = batch.column(c).null_count
        if nulls:
            first = batch.filter(pc.is_null(batch.column(c))).slice(0, 1).to_pylist()[0]
            raise MalformedRecordError(f"{nulls} change record(s) have a null {c!r} ({first_at(first)})")
    drop = [c for c in batch.column_names if c in DROPPED_METADATA or c in spec.except_columns]
    batch = batch.drop_columns(drop)
    unchanged = batch.column(UNCHANGED) if UNCHANGED in batch.column_names else None
    if unchanged is not None:
        batch = batch.drop_columns([UNCHANGED])
    batch = batch.cast(pa.schema([pa.field(f.name, normalise_type(f.type), f.nullable) for f in batch.schema]))
    if unchanged is not None and not pc.max(pc.fill_null(pc.list_value_length(unchanged), 0)).as_py():
        unchanged = None
    values = [c for c in batch.column_names if c not in spec.keys and c not in (IS_DELETE, spec.sequence_by, COMMIT_TS)]
    if spec.scd_type == 2:  # every change becomes a version: keep them all (sorted, replays dropped)
        batch, _ = resolve_rows(batch, unchanged, spec.keys, spec.sequence_by, values)
    elif unchanged is not None:
        batch = fold_partial(batch, unchanged, spec.keys, spec.sequence_by, values)
    else:
        batch = latest_per_key(batch, spec.keys, spec.sequence_by)
    return batch.append_column(NOW, pa.repeat(pa.scalar(now, TIMESTAMP), batch.num_rows))


def first_at(row: Mapping[str, Any], sequence_by: str | None = None) -> str:
    """Where the first of some malformed change records is: its channel and position when the batch carries
    them, else its sequence (``sequence_by``) or the whole record."""
    if CHANNEL in row and POSITION in row:
        return f"first at channel {row[CHANNEL]!r} position {row[POSITION]}"
    if sequence_by is not None and row.get(sequence_by) is not None:
        return f"first at {sequence_by} {row[sequence_by]}"
    return f"first: {dict(row)}"


def latest_per_key(batch: pa.Table, keys: Sequence[str], sequence: str) -> pa.Table:
    """Keep, for each key, the change with the largest sequence (the last one when sequences tie)."""
    if batch.num_rows <= 1:
        return batch
    idx = pa.array(np.arange(batch.num_rows, dtype=np.int64))
    tagged = batch.select([*keys, sequence]).append_column("__cdc_row", idx)
    best = tagged.group_by(list(keys)).aggregate([(sequence, "max")])
    if best.num_rows == batch.num_rows:
        return batch
    best = pa.table({**{k: best.column(k) for k in keys}, sequence: best.column(f"{sequence}_max")})
    winners = tagged.join(best, [*keys, sequence], join_type="inner", use_threads=False)
    # Exact duplicates (replays) tie on (key, sequence): keep one row of each.
    rows = winners.group_by([*keys, sequence]).aggregate([("__cdc_row", "max")]).column("__cdc_row_max")
    return batch.take(pc.take(rows, pc.sort_indices(rows)))


def fold_partial(
    batch: pa.Table, unchanged: pa.ChunkedArray | None, keys: Sequence[str], sequence: str, values: Sequence[str]
) -> pa.Table:
    """Fold each key's changes of a batch that holds partial changes into one change, in sequence order.

    ``unchanged`` is the batch's ``_unchanged`` column (see :mod:`cdc.model`): per record, the value columns
    it leaves as they were (null or empty: the record carries the whole row). A full row or a delete resets
    the key; a partial update overlays the columns it sets. Per key the result is the key's latest change
    (sequence, commit time, delete flag) with, for each value column ``c``, the value of the latest change
    that set ``c`` (a delete sets every column to null) and that change's sequence in ``__cdc_set_<c>``;
    when no change of the batch set ``c`` (a run of partial updates with no full row before it) the value is
    null and ``__cdc_set_<c>`` is null: ``c`` stays unchanged.

    The merge keeps the target's value of ``c`` unless ``__cdc_set_<c>`` is greater than the target row's
    sequence. That makes the result exactly "apply, in sequence order, the batch's changes newer than the
    target row onto it", even when the batch also carries stale changes (re-deliveries) that the fold saw:
    the latest change to set ``c`` is then either newer than the target (and it is the one to keep) or not
    (and then no newer change set ``c``). A partial update on a missing key or on a tombstone creates the
    row with the unchanged columns null (Tablestore's ``UpdateRow``).
    """
    rows, key_start = resolve_rows(batch, unchanged, keys, sequence, values)
    last = np.append(np.flatnonzero(key_start)[1:], rows.num_rows) - 1
    return rows.take(pa.array(last))


def resolve_rows(
    batch: pa.Table, unchanged: pa.ChunkedArray | None, keys: Sequence[str], sequence: str, values: Sequence[str]
) -> tuple[pa.Table, np.ndarray]:
    """The batch sorted by key and sequence, exact duplicates (same key and sequence: replays) dropped, and,
    when ``unchanged`` is given, every row resolved to the key's state after it (see :func:`fold_partial`),
    with the ``__cdc_set_<c>`` columns. Also returns the key-start flags of the rows.

    Vectorised: one sort, then per value column a numpy running maximum of the rows that set it.
    """
    n = batch.num_rows
    order_cols = [*keys, sequence]
    tagged = batch.select(order_cols).append_column("__cdc_row", pa.array(np.arange(n, dtype=np.int64)))
    order = pc.sort_indices(tagged, sort_keys=[(c, "ascending") for c in [*order_cols, "__cdc_row"]])
    batch = batch.take(order)
    if unchanged is not None:
        unchanged = pc.take(unchanged, order)
    # Exact duplicates are adjacent now: keep the first of each.
    key_start = key_starts(batch, keys)
    if n > 1:
        s = batch.column(sequence).combine_chunks()
        keep = key_start.copy()
        keep[1:] |= pc.not_equal(s.slice(1), s.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        if not keep.all():
            batch = batch.filter(pa.array(keep))
            if unchanged is not None:
                unchanged = unchanged.filter(pa.array(keep))
            key_start = key_start[keep]
    if unchanged is None:
        return batch, key_start
    m = batch.num_rows
    idx = np.arange(m, dtype=np.int64)
    group_start = np.maximum.accumulate(np.where(key_start, idx, 0))
    is_delete = batch.column(IS_DELETE).to_numpy(zero_copy_only=False).astype(bool)
    u = unchanged.combine_chunks() if isinstance(unchanged, pa.ChunkedArray) else unchanged
    if pa.types.is_large_list(u.type):
        u = u.cast(pa.list_(pa.string()))
    partial = pc.fill_null(pc.greater(pc.list_value_length(u), 0), False).to_numpy(zero_copy_only=False) & ~is_delete
    flat = pc.list_flatten(u).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(u).to_numpy(zero_copy_only=False)
    seqs = batch.column(sequence).combine_chunks()
    deletes = pa.array(is_delete)
    out = batch
    for c in values:
        leaves = np.zeros(m, dtype=bool)
        leaves[parents[flat == c]] = True
        # The latest row of the key, up to each row, that set c (full rows and deletes set every column).
        setter = np.maximum.accumulate(np.where(leaves & partial, -1, idx))
        setter = np.where(setter >= group_start, setter, -1)
        take = pa.array(setter, mask=setter < 0)
        column = batch.column(c).combine_chunks()
        value = pc.if_else(deletes, pa.nulls(m, column.type), column)  # a delete nulls every column
        out = out.set_column(out.column_names.index(c), c, pc.take(value, take))
        out = out.append_column(SET_PREFIX + c, pc.take(seqs, take))
    return out, key_start


def key_starts(batch: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """For a batch sorted by key: True where a row's key differs from the previous row's (and at row 0)."""
    n = batch.num_rows
    out = np.ones(n, dtype=bool)
    if n > 1:
        diff = np.zeros(n - 1, dtype=bool)
        for k in keys:
            c = batch.column(k).combine_chunks()
            diff |= pc.not_equal(c.slice(1), c.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        out[1:] = diff
    return out
