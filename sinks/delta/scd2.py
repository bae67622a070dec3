"""SCD type 2: which key heads a batch may touch, and what the batch does to each key's history.

Every change of a batch (replays dropped) newer than the key's head becomes a version, or updates the
version before it in place when it changes no tracked column; a key with a change not newer than its head
is back-filled instead (:mod:`sinks.delta.backfill`: the late change placed into the key's stored history). :func:`stage_scd2` turns a prepared batch
and the key heads (:func:`key_heads`: the state table's rows with the current versions' values) into one
row per action; :func:`main_source` keeps those that touch the main table, and
:func:`sinks.delta.merge.merge_plan` turns them into WHEN clauses.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.model import COMMIT_TS
from sinks.delta.backfill import late_mask, stage_late
from sinks.delta.batch import join_left, key_starts
from sinks.delta.engine import Engine
from sinks.delta.keyrange import KeyRange, Rows
from sinks.delta.layout import (
    ACTION,
    AT,
    DELETED_AT,
    FROM,
    IS_CURRENT,
    IS_DELETE,
    NOW,
    SET_PREFIX,
    TO,
    VALID_FROM,
    VALID_TO,
)
from sinks.delta.schema import normalise_type
from sinks.delta.sequence import greater
from sinks.delta.spec import SinkSpec
from sinks.delta.state import conform, of_keys, version_heads


def current_rows(spec: SinkSpec, prepared: pa.Table) -> Rows:
    """The main table's rows a batch reads: the current versions in the batch's key range."""
    return Rows(KeyRange.of(spec.keys, prepared), current=True)


def table_heads(spec: SinkSpec, main: Engine, prepared: pa.Table, current: pa.Table) -> pa.Table:
    """Ordered mode (no state table): the key heads of the batch's keys as the state table would hold them
    (:func:`sinks.delta.state.version_heads`), from the batch's keys' ``current`` versions and, for the keys of
    the batch without one, their history: only those keys (new ones, whose range has no rows yet, and deleted
    ones) read it."""
    keys = list(spec.keys)
    batch_keys = prepared.select(keys).group_by(keys).aggregate([])
    missing = batch_keys.join(current.select(keys), keys, join_type="left anti", use_threads=False)
    versions = current
    if missing.num_rows:
        closed = conform(of_keys(main, Rows(KeyRange.of(spec.keys, missing)), missing), prepared.schema)
        versions = pa.concat_tables([current, closed.select(current.column_names)], promote_options="permissive")
    return version_heads(spec, versions, prepared.schema.field(spec.sequence_by).type)


def key_heads(spec: SinkSpec, state: pa.Table, current: pa.Table) -> pa.Table:
    """The key heads :func:`stage_scd2` works from: the state table's rows (sequence, tombstone time) with
    the values of the key's current version in the main table (none for a tombstone)."""
    value_cols = [
        c for c in current.column_names
        if c not in spec.keys and c not in (spec.sequence_by, COMMIT_TS, VALID_FROM, VALID_TO, IS_CURRENT)
    ]
    heads = state.select([*spec.keys, spec.sequence_by, DELETED_AT])
    heads = heads.append_column(IS_CURRENT, pc.is_null(heads.column(DELETED_AT)))
    if not value_cols:
        return heads
    return join_left(heads, current.select([*spec.keys, *value_cols]), spec.keys)


def main_source(staged: pa.Table) -> pa.Table:
    """The actions of :func:`stage_scd2` that touch the main table: tombstones live in the state table only,
    and a revived tombstone opens a version (the key has no row in the main table to revive)."""
    action = staged.column(ACTION)
    out = staged.filter(pc.invert(pc.is_in(action, pa.array(["retomb", "tombstone"]))))
    opened = pc.if_else(pc.equal(out.column(ACTION), "revive"), "open", out.column(ACTION))
    return out.set_column(out.column_names.index(ACTION), ACTION, opened)


def stage_scd2(spec: SinkSpec, prepared: pa.Table, heads: pa.Table, history: pa.Table | None = None) -> pa.Table:
    """Decide what SCD type 2 does with every change of a prepared batch, given each key's head row (its
    current version or its tombstone) and, for the keys with a change not newer than their head
    (:func:`sinks.delta.backfill.late_keys`), ``history``: their stored versions in the main table. Those
    keys are back-filled by :func:`sinks.delta.backfill.stage_late`; the others walked by
    :func:`_stage_fresh`. Returns the MERGE source, one row per action, with ``__cdc_at`` (the stored
    valid-from of a version a back-fill changes; null for every other action)."""
    late = late_mask(spec, prepared, heads)
    if not pc.any(late).as_py():
        out = _stage_fresh(spec, prepared, heads)
        return out.append_column(pa.field(AT, out.schema.field(FROM).type), pa.nulls(out.num_rows, out.schema.field(FROM).type))
    if history is None:
        raise ValueError("stage_scd2: the batch has late changes and no history of their keys was read")
    out = _stage_fresh(spec, prepared.filter(pc.invert(late)), heads)
    history = conform(history, prepared.schema)
    # The table's columns this batch does not carry: a version the back-fill re-inserts keeps its stored values.
    bookkeeping = (*spec.keys, VALID_FROM, VALID_TO, IS_CURRENT)
    for f in history.schema:
        if f.name not in out.column_names and f.name not in bookkeeping:
            t = normalise_type(f.type)
            history = history.set_column(history.column_names.index(f.name), f.name, history.column(f.name).cast(t))
            out = out.append_column(pa.field(f.name, t), pa.nulls(out.num_rows, t))
    # Tracked: every value column of the table or the batch (a column the batch lacks is null in its changes).
    value_cols = [c for c in out.column_names
                  if c not in spec.keys and c not in (IS_DELETE, NOW, spec.sequence_by, COMMIT_TS, ACTION, FROM, TO)]
    tracked = [c for c in spec.tracked(value_cols) if c in value_cols]
    back = stage_late(spec, prepared.filter(late), heads, history, tracked, out.schema)
    out = out.append_column(back.schema.field(AT), pa.nulls(out.num_rows, back.schema.field(AT).type))
    return pa.concat_tables([out, back])


def _stage_fresh(spec: SinkSpec, prepared: pa.Table, heads: pa.Table) -> pa.Table:
    """Decide what SCD type 2 does with every change of a prepared batch, given each key's head row in the
    table (its current version or its tombstone). Returns the MERGE source, one row per action.

    ``prepared`` holds every change of the batch, sorted by key and sequence (see
    :func:`sinks.delta.batch.prepare`), of keys with no late change. Per key, walking the remaining changes in sequence order: a change that alters a tracked column (or
    follows a delete, or has no version before it) opens a version; one that alters no tracked column
    updates the version before it in place; a delete closes the open version. A version is valid from its
    first change's sequence to the next version's (or the delete's); the last one stays current unless
    the key's last change is a delete, which leaves a tombstone as the key's head.

    Actions: at most one per key on the head row (``close``: valid-to set; ``closeupd``: the same after
    in-place changes; ``inplace``; ``retomb``: a newer tombstone; ``revive``: the tombstone becomes the
    key's last version), and inserts (``open``: a version, closed or current; ``tombstone``).
    """
    seq = spec.sequence_by
    seq_type = prepared.schema.field(seq).type
    value_cols = [
        c for c in prepared.column_names
        if c not in spec.keys and c not in (IS_DELETE, NOW, seq, COMMIT_TS) and not c.startswith(SET_PREFIX)
    ]
    tracked = [c for c in spec.tracked(value_cols) if c in prepared.column_names]
    on_heads = [c for c in value_cols if c in heads.column_names]
    head_cols = [*on_heads, seq, IS_CURRENT, DELETED_AT]
    heads = heads.select([*spec.keys, *head_cols]).rename_columns([*spec.keys, *(f"__h_{c}" for c in head_cols)])
    joined = join_left(prepared, heads, spec.keys)
    h_seq = joined.column(f"__h_{seq}").cast(seq_type)
    fresh = pc.fill_null(pc.or_kleene(pc.is_null(h_seq), greater(joined.column(seq), h_seq)), False)
    joined = joined.filter(fresh)
    m = joined.num_rows
    if m == 0:
        return joined.select([c for c in prepared.column_names if not c.startswith(SET_PREFIX)]).append_column(
            ACTION, pa.nulls(0, pa.string())
        ).append_column(FROM, pa.nulls(0, seq_type)).append_column(TO, pa.nulls(0, seq_type))
    h_seq = joined.column(f"__h_{seq}").cast(seq_type)
    for c in on_heads:  # partial changes take the columns no change of theirs set from the head
        if SET_PREFIX + c not in joined.column_names:
            continue
        set_at = joined.column(SET_PREFIX + c)
        newer = pc.fill_null(pc.and_kleene(pc.is_valid(set_at), pc.or_kleene(pc.is_null(h_seq), greater(set_at, h_seq))),
                             False)
        resolved = pc.if_else(newer, joined.column(c), joined.column(f"__h_{c}").cast(joined.schema.field(c).type))
        joined = joined.set_column(joined.column_names.index(c), c, resolved)

    idx = np.arange(m, dtype=np.int64)
    key_start = key_starts(joined, spec.keys)
    starts = np.flatnonzero(key_start)
    ends = np.append(starts[1:], m)  # exclusive
    group = np.cumsum(key_start) - 1
    g_start, g_end = starts[group], ends[group]
    has_head = pc.is_valid(h_seq).to_numpy(zero_copy_only=False)
    head_current = pc.fill_null(joined.column(f"__h_{IS_CURRENT}").cast(pa.bool_()), False).to_numpy(
        zero_copy_only=False
    )
    head_tomb = has_head & ~head_current
    is_del = joined.column(IS_DELETE).to_numpy(zero_copy_only=False).astype(bool)
    first = key_start
    prev = np.maximum(idx - 1, 0)
    # The state before each change: the previous change's, or the head's for a key's first change.
    prev_none = np.where(first, ~head_current, is_del[prev])
    differ = np.zeros(m, dtype=bool)
    for c in tracked:
        mine = joined.column(c).combine_chunks()
        before_row = pc.take(mine, pa.array(prev))
        if f"__h_{c}" in joined.column_names:
            before = pc.if_else(pa.array(first), joined.column(f"__h_{c}").cast(mine.type).combine_chunks(), before_row)
        else:
            before = pc.if_else(pa.array(first), pa.nulls(m, mine.type), before_row)
        ne = pc.fill_null(pc.not_equal(mine, before), True).to_numpy(zero_copy_only=False)
        both_null = (pc.is_null(mine).to_numpy(zero_copy_only=False) & pc.is_null(before).to_numpy(zero_copy_only=False))
        differ |= ne & ~both_null
    new_v = ~is_del & (prev_none | differ)
    boundary = new_v | is_del
    # Per row: the next boundary after it in its key (m: none).
    b_idx = np.where(boundary, idx, m)
    from_here = np.minimum.accumulate(b_idx[::-1])[::-1]
    nxt = np.append(from_here[1:], m)
    nxt = np.where(nxt < g_end, nxt, m)
    first_b = from_here[g_start]  # the key's first boundary (m: none)
    first_b = np.where(first_b < g_end, first_b, m)
    is_last = idx == g_end - 1
    seqs = joined.column(seq).combine_chunks()

    rows: list[np.ndarray] = []  # the row whose values an action carries
    actions: list[str] = []
    froms: list[np.ndarray] = []  # rows whose sequences give valid-from / valid-to (-1: null)
    tos: list[np.ndarray] = []

    def add(mask: np.ndarray, action: str, values_at: np.ndarray, from_at: np.ndarray, to_at: np.ndarray) -> None:
        rows.append(values_at[mask])
        actions.extend([action] * int(mask.sum()))
        froms.append(from_at[mask])
        tos.append(to_at[mask])

    none = np.full(m, -1, dtype=np.int64)
    last_row = g_end - 1
    # Head rows: one action per key (taken at the key's first change).
    head_run_last = np.where(first_b < m, first_b - 1, last_row)  # the last in-place change of the head version
    has_run = head_run_last >= g_start
    to_first_b = np.where(first_b < m, first_b, -1)
    add(first & head_current & (first_b < m) & has_run, "closeupd", head_run_last, none, to_first_b)
    add(first & head_current & (first_b < m) & ~has_run, "close", idx, none, to_first_b)
    add(first & head_current & (first_b == m), "inplace", head_run_last, none, none)
    add(first & head_tomb & is_del[last_row], "retomb", last_row, none, none)
    # A revived tombstone becomes the key's last version; every other version is inserted.
    last_version = np.maximum.accumulate(np.where(new_v, idx, -1))[last_row]
    revived = head_tomb[g_start] & ~is_del[last_row] & (idx == last_version)
    version_end = np.where(nxt < m, nxt, g_end) - 1  # the version's last in-place change
    version_to = np.where(nxt < m, nxt, -1)
    add(revived, "revive", version_end, idx, none)
    add(new_v & ~revived, "open", version_end, idx, version_to)
    add(is_last & is_del & ~head_tomb, "tombstone", idx, none, none)

    take = np.concatenate(rows)
    base = joined.select([c for c in prepared.column_names if not c.startswith(SET_PREFIX)])
    out = base.take(pa.array(take))
    # An action's key and commit time are its row's; a version's sequence is its last change's (the row).
    out = out.append_column(ACTION, pa.array(actions, pa.string()))
    for name, at in ((FROM, np.concatenate(froms)), (TO, np.concatenate(tos))):
        out = out.append_column(pa.field(name, seq_type), pc.take(seqs, pa.array(at, mask=at < 0)))
    return out
