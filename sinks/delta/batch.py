"""Batch preparation: validate a batch of change records and reduce it to what the MERGE applies.

SCD type 1 keeps the latest change per key (:func:`latest_per_key`), or, when the batch holds partial
changes, folds each key's changes in sequence order (:func:`fold_partial`); SCD type 2 keeps every change,
sorted by key and sequence with replays dropped (:func:`resolve_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import MalformedRecordError, OptionError, TerminalError
from cdc.model import CHANNEL, COMMIT_TS, OLD_KEY, OP, POSITION, UNCHANGED, Op
from sinks.delta.layout import (
    DEFAULT_DELETE_CONDITION,
    DELETED_AT,
    DROPPED_METADATA,
    HIDDEN_PREFIX,
    IS_CURRENT,
    IS_DELETE,
    IS_TRUNCATE,
    NOW,
    SET_PREFIX,
    TIMESTAMP,
    VALID_FROM,
    VALID_TO,
)
from sinks.delta.schema import normalise_type
from sinks.delta.sequence import check_nulls, check_ties, check_type, order_key
from sinks.delta.spec import SinkSpec


def after_last_truncate(batch: pa.Table, sequence_by: str) -> tuple[pa.Table, Any]:
    """(the changes after the batch's last truncate record, that truncate's sequence), or (the batch, None)
    when it has none. A truncate (``_op`` ``truncate``, see :mod:`cdc.model`, or a record for which
    ``apply_as_truncates`` holds: the column ``__cdc_is_truncate``) empties the whole table, so the changes
    sequenced before it in the batch have nothing left to change. The result has no ``__cdc_is_truncate``."""
    flags = []
    if IS_TRUNCATE in batch.column_names:
        flags.append(pc.fill_null(batch.column(IS_TRUNCATE).cast(pa.bool_()), False))
        batch = batch.drop_columns([IS_TRUNCATE])
    if OP in batch.column_names:
        flags.append(pc.fill_null(pc.equal(batch.column(OP), Op.TRUNCATE.value), False))
    if not flags or batch.num_rows == 0:
        return batch, None
    is_truncate = flags[0] if len(flags) == 1 else pc.or_(flags[0], flags[1])
    if not pc.any(is_truncate).as_py():
        return batch, None
    truncates = batch.filter(is_truncate).column(sequence_by)
    last = pc.max(order_key(truncates))
    at = truncates[pc.index(order_key(truncates), last).as_py()].as_py()
    later = pc.and_(pc.greater(order_key(batch.column(sequence_by)), last), pc.invert(is_truncate))
    return batch.filter(later), at


def check_columns(spec: SinkSpec, names: list[str]) -> None:
    """The batch has the key and sequence columns and none the sink reserves (both engines' first check)."""
    missing = [c for c in (*spec.keys, spec.sequence_by) if c not in names]
    if missing:
        raise OptionError(
            f"the changes have no column(s) {missing} named by 'keys'/'sequence_by'; columns: {names}",
            "keys" if set(missing) & set(spec.keys) else "sequence_by",
        )
    clash = [c for c in names
             if c in spec.reserved[2:] or (c.startswith(HIDDEN_PREFIX) and c not in (IS_DELETE, IS_TRUNCATE))]
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
    check_type(spec.sequence_by, batch.schema.field(spec.sequence_by).type)
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
    for c in spec.keys:
        nulls = batch.column(c).null_count
        if nulls:
            first = batch.filter(pc.is_null(batch.column(c))).slice(0, 1).to_pylist()[0]
            raise MalformedRecordError(f"{nulls} change record(s) have a null {c!r} ({first_at(first)})")
    check_nulls(spec.keys, spec.sequence_by, spec.sequence_columns, batch)
    check_ties(spec.keys, spec.sequence_by, batch, ignore=(*DROPPED_METADATA, IS_TRUNCATE))
    drop = [c for c in batch.column_names if c in DROPPED_METADATA or c == IS_TRUNCATE]
    batch = batch.drop_columns([*drop, *spec.excluded(batch.column_names)])
    unchanged = batch.column(UNCHANGED) if UNCHANGED in batch.column_names else None
    if unchanged is not None:
        batch = batch.drop_columns([UNCHANGED])
    unchanged = null_updates_unchanged(spec, batch, unchanged)
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


def null_updates_unchanged(spec: SinkSpec, batch: pa.Table, unchanged: pa.ChunkedArray | None) -> Any:
    """``ignore_null_updates`` (and its column lists): the batch's ``_unchanged`` column with, for every
    change that is not a delete, the ignored columns it carries as null added to the columns it leaves
    unchanged. The change is then applied as a partial change (see :func:`fold_partial`): the stored value
    stays, and a key without a row gets the null. Returns ``unchanged`` itself when nothing is added."""
    ignored = spec.null_ignored(spec.value_columns(batch.column_names))
    if not ignored or batch.num_rows == 0:
        return unchanged
    n = batch.num_rows
    upserts = ~batch.column(IS_DELETE).to_numpy(zero_copy_only=False).astype(bool)
    rows, names = [], []
    if unchanged is not None:
        u = unchanged.combine_chunks() if isinstance(unchanged, pa.ChunkedArray) else unchanged
        if pa.types.is_large_list(u.type):
            u = u.cast(pa.list_(pa.string()))
        rows.append(pc.list_parent_indices(u).to_numpy(zero_copy_only=False).astype(np.int64))
        names.append(pc.list_flatten(u).cast(pa.string()).to_numpy(zero_copy_only=False).astype(object))
    added = 0
    for c in ignored:
        at = np.flatnonzero(pc.is_null(batch.column(c)).to_numpy(zero_copy_only=False) & upserts)
        added += len(at)
        rows.append(at.astype(np.int64))
        names.append(np.full(len(at), c, dtype=object))
    if not added:
        return unchanged
    all_rows, all_names = np.concatenate(rows), np.concatenate(names)
    order = np.argsort(all_rows, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(all_rows, minlength=n))]).astype(np.int32)
    return pa.chunked_array([pa.ListArray.from_arrays(pa.array(offsets), pa.array(all_names[order], pa.string()))])


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
    seq = "__cdc_seq_key"  # the sequence as Arrow compares it (see sinks.delta.sequence)
    tagged = batch.select(list(keys)).append_column(seq, order_key(batch.column(sequence))).append_column("__cdc_row", idx)
    best = tagged.group_by(list(keys)).aggregate([(seq, "max")])
    if best.num_rows == batch.num_rows:
        return batch
    best = pa.table({**{k: best.column(k) for k in keys}, seq: best.column(f"{seq}_max")})
    winners = tagged.join(best, [*keys, seq], join_type="inner", use_threads=False)
    # Exact duplicates (replays) tie on (key, sequence): keep one row of each.
    rows = winners.group_by([*keys, seq]).aggregate([("__cdc_row", "max")]).column("__cdc_row_max")
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
    order_cols = [*keys, "__cdc_seq_key"]
    tagged = batch.select(list(keys)).append_column("__cdc_seq_key", order_key(batch.column(sequence)))
    tagged = tagged.append_column("__cdc_row", pa.array(np.arange(n, dtype=np.int64)))
    order = pc.sort_indices(tagged, sort_keys=[(c, "ascending") for c in [*order_cols, "__cdc_row"]])
    batch = batch.take(order)
    if unchanged is not None:
        unchanged = pc.take(unchanged, order)
    # Exact duplicates are adjacent now: keep the first of each.
    key_start = key_starts(batch, keys)
    if n > 1:
        s = order_key(batch.column(sequence).combine_chunks())
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


def join_left(left: pa.Table, right: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``left`` (its order kept) with the columns of ``right`` but ``keys`` from the row of ``right`` with the
    same keys (at most one per key; nulls where none). Only keys and row numbers go through Arrow's join, so the
    columns may be of any type (Acero's join carries no struct or list column)."""
    keys = list(keys)
    at = "__cdc_left_row"
    lt = left.select(keys).append_column(at, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    rt = right.select(keys).append_column("__cdc_right_row", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = lt.join(rt, keys, join_type="left outer", use_threads=False)
    joined = joined.take(pc.sort_indices(joined.column(at)))
    take = joined.column("__cdc_right_row")
    out = left
    for name in right.column_names:
        if name not in keys:
            out = out.append_column(right.schema.field(name), right.column(name).take(take))
    return out


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


# ------------------------------------------------------------------ key changes (see cdc.model, "Key changes")
class UnknownValueError(TerminalError):
    """A change leaves a column unchanged whose value the sink cannot know: it is neither in the change nor
    in the old row of a key change (the old key's row is not in the table). Nothing of the batch is written."""


#: The fix named by :class:`UnknownValueError`: the source then sends whole rows.
REPLICA_IDENTITY_FIX = (
    "PostgreSQL sends the values an update does not touch only under REPLICA IDENTITY FULL: run ALTER TABLE "
    "<the source table> REPLICA IDENTITY FULL, then rebuild this table from a snapshot (startingOffsets=snapshot "
    "into a new path); Debezium sources also need the create to follow its delete in one batch "
    "(debezium.transactionTopic)"
)


def key_change_rows(spec: SinkSpec, heads: pa.Table, rows: pa.Table) -> pa.Table:
    """What the table knows of some keys, as rows :func:`complete_key_changes` walks back through: per key
    its state at its head's sequence (live: the row, or SCD type 2 the current version; a tombstone: a
    delete), and for an SCD type 2 tombstone also its last version's values at that version's start.

    ``heads`` are the keys' state-table rows (keys, sequence, ``__cdc_deleted_at``); ``rows`` their rows in
    the main table (SCD type 2: every version, with ``_valid_from``). Returns keys, the sequence, the delete
    flag and the value columns of ``rows``."""
    seq = spec.sequence_by
    keys = list(spec.keys)
    values = [c for c in rows.column_names if c not in keys and c not in (seq, COMMIT_TS, VALID_FROM, VALID_TO,
                                                                          IS_CURRENT)]
    seq_type = heads.schema.field(seq).type
    head = heads.select([*keys, seq]).append_column(IS_DELETE, pc.is_valid(heads.column(DELETED_AT)))
    if spec.scd_type == 2 and rows.num_rows:  # the latest version of each key
        rows = rows.take(pc.sort_indices(rows, sort_keys=[*((k, "ascending") for k in keys), (VALID_FROM, "descending")]))
        rows = rows.filter(pa.array(key_starts(rows, keys)))
    rows = rows.select([*keys, *values, *([VALID_FROM] if spec.scd_type == 2 else [])])
    out = head.join(rows, keys, join_type="left outer", use_threads=False)
    dead = out.column(IS_DELETE).combine_chunks()
    parts = []
    if spec.scd_type == 2:  # the version a tombstone closed: its values, at its start
        closed = out.filter(pc.and_(dead, pc.is_valid(out.column(VALID_FROM))))
        closed = closed.set_column(closed.column_names.index(seq), seq, closed.column(VALID_FROM).cast(seq_type))
        closed = closed.set_column(closed.column_names.index(IS_DELETE), IS_DELETE,
                                   pa.repeat(pa.scalar(False), closed.num_rows))
        parts.append(closed.drop_columns([VALID_FROM]))
        out = out.drop_columns([VALID_FROM])
    for c in values:  # a tombstone's own row holds nothing
        column = out.column(c)
        out = out.set_column(out.column_names.index(c), c, pc.if_else(dead, pa.nulls(len(column), column.type), column))
    return pa.concat_tables([out, *parts])


def complete_key_changes(
    spec: SinkSpec, changes: pa.Table, table_rows: Callable[[pa.Table], pa.Table], where: str
) -> pa.Table:
    """Complete the insert halves of key changes: every column a key change leaves unchanged takes the old
    key's value just before the change (see ``_old_key`` in :mod:`cdc.model`). The one place the rule lives,
    for both engines and both SCD types.

    ``changes`` are change records (``_op`` or ``__cdc_is_delete``, ``_unchanged``, ``_old_key``); a record
    completed here has every value and ``_unchanged`` null, so the rest of the batch's preparation applies it
    as a whole row. ``table_rows(keys)`` returns what the table holds of those keys, shaped by
    :func:`key_change_rows`; it is called once, with the old keys and the new keys of the batch's key changes.

    The old key's value is found by walking back from the insert through the old key's changes: the delete
    half (the old key's last change before the insert) is stepped over; then the old key's latest change that
    set the column (a whole row, a partial change that set it, or an earlier key change that moved a row
    there, itself completed first: re-keys twice and swaps in one transaction chain that way), in the batch or,
    before the batch, the table's row. A change of the batch not newer than the key's head in the table is
    already in that row, so it is not walked. When the walk ends without a value (the old key is not in the
    table, e.g. the table was created after the old row was last written, or SCD type 1 deleted it in an
    earlier batch) the batch fails with :class:`UnknownValueError` naming the table, the keys and the column:
    the sink never writes a null the source did not send (it has no quarantine). Insert halves whose new key's
    head is not older than them are stale (they will not be applied) and are left as they are.

    An insert that leaves columns unchanged without naming an old key has no row to keep them from, and fails
    the same way (a Debezium create cut off from its delete).
    """
    # Keys taken out of the nullable _old_key struct, the table's rows and joins are nullable Arrow fields: the
    # batch's key columns are viewed the same way here (Spark hands them non-nullable when the source declares
    # them so), and given back as they came.
    relaxed = pa.schema([f.with_nullable(True) if f.name in spec.keys else f for f in changes.schema])
    if relaxed == changes.schema:
        return _complete_key_changes(spec, changes, table_rows, where)
    return _complete_key_changes(spec, changes.cast(relaxed), table_rows, where).cast(changes.schema)


def _complete_key_changes(
    spec: SinkSpec, changes: pa.Table, table_rows: Callable[[pa.Table], pa.Table], where: str
) -> pa.Table:
    names = changes.column_names
    if UNCHANGED not in names or changes.num_rows == 0:
        return changes
    n = changes.num_rows
    keys = list(spec.keys)
    seq = spec.sequence_by
    unchanged = changes.column(UNCHANGED).combine_chunks()
    if pa.types.is_large_list(unchanged.type):
        unchanged = unchanged.cast(pa.list_(pa.string()))
    partial = pc.fill_null(pc.greater(pc.list_value_length(unchanged), 0), False).to_numpy(zero_copy_only=False)
    if not partial.any():
        return changes
    if IS_DELETE in names:
        is_delete = pc.fill_null(changes.column(IS_DELETE).cast(pa.bool_()), False)
    elif OP in names:
        is_delete = pc.fill_null(pc.equal(changes.column(OP), Op.DELETE.value), False)
    else:
        return changes
    deletes = is_delete.to_numpy(zero_copy_only=False).astype(bool)
    linked = (pc.is_valid(changes.column(OLD_KEY)).to_numpy(zero_copy_only=False) if OLD_KEY in names
              else np.zeros(n, dtype=bool))
    inserts = ~deletes
    if OP in names:  # the insert half carries the link (see cdc.model)
        inserts = pc.fill_null(pc.equal(changes.column(OP), Op.INSERT.value), False).to_numpy(zero_copy_only=False)
        orphans = np.flatnonzero(inserts & partial & ~linked & ~deletes)
        if len(orphans):
            row = changes.slice(int(orphans[0]), 1).to_pylist()[0]
            raise UnknownValueError(
                f"{where}: {len(orphans)} insert(s) leave columns unchanged but name no old key, so their values "
                f"cannot be known (first: key {_key_text(row, keys)}, {seq} {row[seq]}, columns {row[UNCHANGED]}); "
                f"nothing was written and this sink has no quarantine. {REPLICA_IDENTITY_FIX}"
            )
    rekey = linked & partial & inserts & ~deletes
    if not rekey.any():
        return changes
    old_struct = changes.column(OLD_KEY).combine_chunks()
    fields = [old_struct.type.field(i).name for i in range(old_struct.type.num_fields)]
    if sorted(fields) != sorted(keys):
        raise OptionError(f"option 'keys': the changes' {OLD_KEY} holds {fields}, the sink's keys are {keys}", "keys")
    q_rows = np.flatnonzero(rekey)
    q_old = pa.table({k: pc.struct_field(old_struct, k).take(pa.array(q_rows)).cast(changes.schema.field(k).type)
                      for k in keys})
    q_new = changes.select(keys).take(pa.array(q_rows))
    wanted = pa.concat_tables([q_old, q_new]).group_by(keys).aggregate([])
    known = table_rows(wanted)
    known = known.select([c for c in known.column_names if c in (*keys, seq, IS_DELETE) or c in names])
    known = known.cast(pa.schema([changes.schema.field(c) if c in names else known.schema.field(c)
                                  for c in known.column_names]))
    seqs = _as_int64(changes.column(seq))
    # The table's head sequence of each key: changes not newer than it are already in the table's row.
    head_seq = known.group_by(keys).aggregate([(seq, "max")]) if known.num_rows else None

    def head_of(table: pa.Table) -> np.ndarray:
        if head_seq is None:
            return np.full(table.num_rows, _NONE, dtype=np.int64)
        tagged = table.select(keys).append_column("__cdc_at", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        joined = tagged.join(head_seq, keys, join_type="left outer", use_threads=False)
        return _as_int64(joined.take(pc.sort_indices(joined.column("__cdc_at"))).column(f"{seq}_max"))

    fresh = seqs[q_rows] > head_of(q_new)
    q_rows, q_old = q_rows[fresh], q_old.filter(pa.array(fresh))
    if len(q_rows) == 0:
        return changes
    # The walk's history H: the old keys' changes in the batch (newer than their head) and the table's rows.
    old_keys = q_old.group_by(keys).aggregate([])
    tagged = changes.select(keys).append_column("__cdc_at", pa.array(np.arange(n, dtype=np.int64)))
    in_batch = tagged.join(old_keys, keys, join_type="inner", use_threads=False).column("__cdc_at")
    batch_rows = np.sort(in_batch.to_numpy(zero_copy_only=False)) if len(in_batch) else np.zeros(0, np.int64)
    batch_rows = batch_rows[seqs[batch_rows] > head_of(changes.select(keys).take(pa.array(batch_rows)))]
    known = known.join(old_keys, keys, join_type="inner", use_threads=False)
    m_b, m_t = len(batch_rows), known.num_rows
    history = pa.concat_tables([
        changes.select(keys).take(pa.array(batch_rows)).append_column("__cdc_seq", pa.array(seqs[batch_rows])),
        known.select(keys).append_column("__cdc_seq", pa.array(_as_int64(known.column(seq)))),
    ])
    # H index i < m_b: batch row batch_rows[i]; i >= m_b: table row i - m_b.
    h_delete = np.concatenate([deletes[batch_rows], known.column(IS_DELETE).to_numpy(zero_copy_only=False).astype(bool)])
    order = pc.sort_indices(history, sort_keys=[*((k, "ascending") for k in keys), ("__cdc_seq", "ascending")])
    order_np = order.to_numpy(zero_copy_only=False)
    history = history.take(order)
    starts = key_starts(history, keys)
    gid = np.cumsum(starts) - 1
    h_seq = history.column("__cdc_seq").to_numpy(zero_copy_only=False)
    groups = history.filter(pa.array(starts)).select(keys).append_column("__cdc_gid", pa.array(gid[starts]))
    q_tag = q_old.append_column("__cdc_at", pa.array(np.arange(len(q_rows), dtype=np.int64)))
    q_join = q_tag.join(groups, keys, join_type="left outer", use_threads=False)
    q_join = q_join.take(pc.sort_indices(q_join.column("__cdc_at")))
    q_gid = pc.fill_null(q_join.column("__cdc_gid"), -1).to_numpy(zero_copy_only=False)
    # (group, sequence) as one orderable number: the sequence's dense rank among the sequences in play.
    both = np.concatenate([h_seq, seqs[q_rows]])
    ranks = pc.rank(pa.array(both), sort_keys="ascending", tiebreaker="dense").to_numpy(zero_copy_only=False)
    width = int(ranks.max()) + 1 if len(ranks) else 1
    h_comb = gid * width + ranks[: len(h_seq)].astype(np.int64)
    q_comb = q_gid * width + ranks[len(h_seq) :].astype(np.int64)
    h_delete = h_delete[order_np]
    h_batch = np.full(len(order_np), -1, dtype=np.int64)  # the batch row of a history entry (-1: the table's)
    h_batch[order_np < m_b] = batch_rows[order_np[order_np < m_b]]
    row_query = np.full(n, -1, dtype=np.int64)
    row_query[q_rows] = np.arange(len(q_rows))
    flat = pc.list_flatten(unchanged)
    parents = pc.list_parent_indices(unchanged).to_numpy(zero_copy_only=False)
    needed = sorted(str(c) for c in pc.unique(pc.list_flatten(unchanged.take(pa.array(q_rows)))).to_pylist())
    out = changes
    for c in needed:
        if c not in names:
            continue
        leaves = np.zeros(n, dtype=bool)
        leaves[parents[pc.equal(flat, c).to_numpy(zero_copy_only=False)]] = True
        h_leaves = np.where(h_batch >= 0, leaves[np.maximum(h_batch, 0)], False)
        h_pending = h_leaves & (h_batch >= 0) & rekey[np.maximum(h_batch, 0)]
        # Candidates: what sets c (whole rows, deletes, the table's rows), and key changes still to complete.
        cand = np.flatnonzero(~h_leaves | h_delete | h_pending)
        asks = np.flatnonzero(leaves[q_rows])
        found = _latest_before(h_comb[cand], q_comb[asks], gid[cand], q_gid[asks])
        first = np.where(found >= 0, cand[np.maximum(found, 0)], -1)
        # Step over the delete half once: the old key's state is the one before it.
        at_delete = (first >= 0) & h_delete[np.maximum(first, 0)]
        again = _latest_before(h_comb[cand], h_comb[np.maximum(first, 0)], gid[cand], q_gid[asks])
        second = np.where(again >= 0, cand[np.maximum(again, 0)], -1)
        src = np.where(at_delete, second, first)
        src = np.where((src >= 0) & h_delete[np.maximum(src, 0)], -1, src)
        # A source that is itself a key change leaving c unchanged takes that change's completed value (a
        # chain: each step moves one link back; links only point to earlier changes, so it ends).
        ask_of = np.full(len(q_rows), -1, dtype=np.int64)
        ask_of[asks] = np.arange(len(asks))
        final = src.copy()
        for _ in range(len(asks) + 1):
            waiting = (final >= 0) & h_pending[np.maximum(final, 0)]
            if not waiting.any():
                break
            on = row_query[h_batch[final[waiting]]]
            dep = np.where(on >= 0, ask_of[np.maximum(on, 0)], -1)
            final[waiting] = np.where(dep >= 0, final[np.maximum(dep, 0)], -1)
        missing = np.flatnonzero((final < 0) | h_pending[np.maximum(final, 0)])
        if len(missing):
            r = int(q_rows[asks[missing[0]]])
            row = changes.slice(r, 1).to_pylist()[0]
            raise UnknownValueError(
                f"{where}: the insert of key {_key_text(row, keys)} ({seq} {row[seq]}) ends an update that changed "
                f"the key from {_key_text(row[OLD_KEY], keys)} and leaves column {c!r} unchanged, but the old key's "
                f"row is not in the table, so its value cannot be known ({len(missing)} such insert(s) in the batch); "
                f"nothing was written and this sink has no quarantine. {REPLICA_IDENTITY_FIX}"
            )
        src_rows = np.where(h_batch[final] >= 0, h_batch[final], n + (order_np[final] - m_b))
        values = changes.column(c).combine_chunks()
        if c in known.column_names:
            values = pa.concat_arrays([values, known.column(c).combine_chunks().cast(values.type)])
        else:  # the table has no such column yet: the old row's value is null
            values = pa.concat_arrays([values, pa.nulls(m_t, values.type)])
        take = np.arange(n, dtype=np.int64)
        take[q_rows[asks]] = src_rows
        out = out.set_column(out.column_names.index(c), c, values.take(pa.array(take)))
    completed = np.zeros(n, dtype=bool)
    completed[q_rows] = True
    cleared = pc.if_else(pa.array(completed), pa.nulls(n, unchanged.type), unchanged)
    return out.set_column(out.column_names.index(UNCHANGED), UNCHANGED, cleared)


def _latest_before(sorted_comb: np.ndarray, at: np.ndarray, groups: np.ndarray, group: np.ndarray) -> np.ndarray:
    """For each ``at``: the index in ``sorted_comb`` of the last entry below it in the same group, or -1."""
    i = np.searchsorted(sorted_comb, at, side="left") - 1
    ok = (i >= 0) & (group >= 0) & (groups[np.maximum(i, 0)] == group) if len(sorted_comb) else np.zeros(len(at), bool)
    return np.where(ok, i, -1)


_NONE = np.iinfo(np.int64).min  # below every sequence


def _as_int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A sequence column (integers or timestamps) as int64 values, nulls as :data:`_NONE`."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_struct(arr.type):
        raise OptionError(
            "option 'sequence_by': a key change (a change carrying _old_key that leaves columns unchanged) needs a "
            "single sequence column, not several or a struct: give sequence_by='_seq'", "sequence_by")
    return np.asarray(pc.fill_null(arr.cast(pa.int64()), _NONE).to_numpy(zero_copy_only=False), dtype=np.int64)


def _key_text(row: Any, keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={row[k]!r}" for k in keys) if isinstance(row, dict) else repr(row)
