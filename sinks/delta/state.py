"""The state table (see :mod:`sinks.delta.layout`): reading a batch's key heads, the sequence guard, and the
rows a batch writes back.

Per key the state table holds the sequence of the key's last applied change and, for a deleted key, the
tombstone's time. A batch reads the heads of its key range once (:func:`heads_rows`), drops every
change not newer than its key's head (:func:`guard`), and after the main table's commit records each
touched key's new head (:func:`state_source`, merged by :func:`sinks.delta.merge.state_plan`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.delta.batch import join_left, key_change_rows, key_starts
from sinks.delta.engine import Engine
from sinks.delta.keyrange import KeyRange, Rows
from sinks.delta.layout import DELETED_AT, IS_DELETE, NOW, SET_PREFIX, TIE, TIMESTAMP, VALID_FROM, VALID_TO
from sinks.delta.sequence import order_key, tie_error
from sinks.delta.spec import SinkSpec

HEAD_SEQ = "__cdc_head_seq"


def heads_rows(spec: SinkSpec, prepared: pa.Table) -> Rows:
    """The state table's rows a batch reads: those in the batch's key range."""
    return Rows(KeyRange.of(spec.keys, prepared))


def conform(read: pa.Table, schema: pa.Schema) -> pa.Table:
    """``read`` (rows read back from a table) with each column that ``schema`` also has cast to its type
    there: the type of the batch, whatever type the engine read the files as (delta-rs reads text that it
    wrote as ``string_view``), so that the joins with the batch compare one type."""
    for i, f in enumerate(read.schema):
        if f.name in schema.names and not f.type.equals(want := schema.field(f.name).type):
            read = read.set_column(i, f.name, read.column(i).cast(want))
    return read


def key_change_source(spec: SinkSpec, main: Engine, state: Engine, keys: pa.Table) -> pa.Table:
    """What the two tables hold of ``keys`` (old and new keys of a batch's key changes), shaped by
    :func:`sinks.delta.batch.key_change_rows` for :func:`sinks.delta.batch.complete_key_changes`."""
    seq = spec.sequence_by
    if main.schema() is None:  # a new table holds nothing
        none = keys.select(list(spec.keys)).slice(0, 0)
        return none.append_column(seq, pa.array([], pa.int64())).append_column(IS_DELETE, pa.array([], pa.bool_()))
    wanted = Rows(KeyRange.of(spec.keys, keys))
    rows = of_keys(main, wanted, keys)
    if state.schema() is None and spec.scd_type == 2:  # ordered mode: the heads are the keys' versions'
        return key_change_rows(spec, version_heads(spec, rows, rows.schema.field(VALID_FROM).type), rows)
    if state.schema() is None:  # ordered mode: the table's live rows are the heads (a deleted key has none)
        heads = rows.select(list(spec.keys))
        at = rows.column(seq) if seq in rows.column_names else pa.repeat(pa.scalar(_EARLIEST), rows.num_rows)
        heads = heads.append_column(seq, at).append_column(pa.field(DELETED_AT, TIMESTAMP), pa.nulls(rows.num_rows, TIMESTAMP))
        return key_change_rows(spec, heads, rows)
    return key_change_rows(spec, of_keys(state, wanted, keys), rows)


#: Ordered mode with the sequence column hidden: the sequence a live row's head is taken at (any change of
#: an ordered batch is newer than what the table holds).
_EARLIEST = -(1 << 63)


def of_keys(engine: Engine, wanted: Rows, keys: pa.Table) -> pa.Table:
    """The table's rows of exactly ``keys`` (read by their key range, then matched)."""
    table = conform(engine.read(wanted, keys), keys.schema)
    # Only the keys and a row number go through Acero's join (it carries no struct or list column).
    tagged = table.select(list(keys.column_names)).append_column(
        "__cdc_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    kept = tagged.join(keys, list(keys.column_names), join_type="left semi", use_threads=False)
    return table.take(kept.column("__cdc_row"))


def version_heads(spec: SinkSpec, versions: pa.Table, seq_type: pa.DataType) -> pa.Table:
    """SCD type 2, ordered mode (no state table): the heads the state table would hold (key, sequence,
    ``__cdc_deleted_at``) of the keys of ``versions`` (rows of the main table): a key's current version at its
    ``sequence_by`` (``_valid_from`` where the table hides it); a key without one, deleted, at its last
    closed version's ``_valid_to`` (the delete's sequence), as a tombstone."""
    seq = spec.sequence_by
    keys = list(spec.keys)
    open_ = pc.is_null(versions.column(VALID_TO))
    current = versions.filter(open_)
    live = current.select(keys).append_column(
        pa.field(seq, seq_type), current.column(seq if seq in current.column_names else VALID_FROM).cast(seq_type))
    live = live.append_column(pa.field(DELETED_AT, TIMESTAMP), pa.nulls(live.num_rows, TIMESTAMP))
    closed = versions.filter(pc.invert(open_)).join(current.select(keys), keys, join_type="left anti", use_threads=False)
    if closed.num_rows == 0:
        return live
    # each deleted key's last closed version: sorted by key, then latest valid-to first
    order = closed.select(keys).append_column("__cdc_to", order_key(closed.column(VALID_TO)))
    closed = closed.take(pc.sort_indices(order, sort_keys=[*((k, "ascending") for k in keys), ("__cdc_to", "descending")]))
    last = closed.filter(pa.array(key_starts(closed, keys)))
    dead = last.select(keys).append_column(pa.field(seq, seq_type), last.column(VALID_TO).cast(seq_type))
    dead = dead.append_column(pa.field(DELETED_AT, TIMESTAMP), pa.repeat(pa.scalar(0, pa.int64()), dead.num_rows).cast(TIMESTAMP))
    return pa.concat_tables([live, dead], promote_options="permissive")


def with_head_seq(spec: SinkSpec, prepared: pa.Table, heads: pa.Table) -> pa.Table:
    """``prepared`` (order kept) with its key's head sequence in ``__cdc_head_seq`` (null: key never seen), as
    :func:`sinks.delta.sequence.order_key` gives it (compare it with the order key of a sequence)."""
    seq = spec.sequence_by
    seq_type = prepared.schema.field(seq).type
    h = heads.select(list(spec.keys)).append_column(HEAD_SEQ, order_key(heads.column(seq).cast(seq_type)))
    tagged = prepared.select(list(spec.keys)).append_column(
        "__cdc_row", pa.array(np.arange(prepared.num_rows, dtype=np.int64))
    )
    # Only the keys and a row number go through the join, and the batch is its right side: Acero builds its
    # hash table on the right, so it hashes the batch's keys and probes the heads (the whole key range, often
    # ~10x the batch) instead of the reverse. Measured on a 100k batch against 1.1M heads: 0.08 s instead of
    # 0.38 s (the batch's value columns carried through the join made up the rest).
    joined = h.join(tagged, list(spec.keys), join_type="right outer", use_threads=False)
    joined = joined.take(pc.sort_indices(joined.column("__cdc_row")))  # the join does not keep the order
    return prepared.append_column(HEAD_SEQ, joined.column(HEAD_SEQ))


def guard(spec: SinkSpec, prepared: pa.Table, heads: pa.Table, *, ties: bool = False) -> pa.Table:
    """The changes of ``prepared`` newer than their key's head. A partial change's per-column setters
    (``__cdc_set_<c>``) not newer than the head are nulled with their values: such a column keeps the main
    table's value, or is null when the key has no row (a tombstone's values are null).

    ``ties`` (SCD type 1): also keep the changes whose sequence equals their key's head, marked ``__cdc_tie``
    (with the setters of the columns they set themselves): the MERGE compares them with the stored row (see
    :func:`sinks.delta.merge.merge_plan`). Only they cost anything: an in-order batch has none."""
    joined = with_head_seq(spec, prepared, heads)
    h_seq = joined.column(HEAD_SEQ)
    seq = order_key(joined.column(spec.sequence_by))
    fresh = pc.fill_null(pc.or_kleene(pc.is_null(h_seq), pc.greater(seq, h_seq)), False)
    if ties:
        tie = pc.fill_null(pc.equal(seq, h_seq), False)
        if pc.any(tie).as_py():
            tie = _tombstone_ties(spec, joined, tie, heads)
        joined = joined.append_column(TIE, tie)
        fresh = pc.or_(fresh, tie)
    out = joined.filter(fresh)
    h_seq = out.column(HEAD_SEQ)
    for name in [c for c in out.column_names if c.startswith(SET_PREFIX)]:
        c = name[len(SET_PREFIX):]
        setter = out.column(name)
        newer = pc.fill_null(pc.or_kleene(pc.is_null(h_seq), pc.greater(order_key(setter), h_seq)), False)
        if ties:  # a tied change's own columns: set at its sequence, the head's
            newer = pc.or_(newer, pc.and_(out.column(TIE), pc.fill_null(pc.equal(order_key(setter), h_seq), False)))
        out = out.set_column(out.column_names.index(name), name, pc.if_else(newer, setter, pa.nulls(len(out), setter.type)))
        values = out.column(c)
        out = out.set_column(out.column_names.index(c), c, pc.if_else(newer, values, pa.nulls(len(out), values.type)))
    return out.drop_columns([HEAD_SEQ])


#: Where the other change of a tie across batches is (see :func:`sinks.delta.sequence.tie_error`).
HELD = "the table holds a change at that sequence"


def _tombstone_ties(spec: SinkSpec, joined: pa.Table, tie: pa.Array, heads: pa.Table) -> pa.Array:
    """The ties (``tie``: per row of ``joined``, its sequence is its head's) the MERGE is to compare with the
    stored row: a delete at a tombstone's sequence is the delete again (dropped); an upsert at a tombstone's
    sequence, or a delete at a live head's, fails the batch."""
    tied = joined.filter(tie)
    dead = join_left(tied.select(list(spec.keys)), heads.select([*spec.keys, DELETED_AT]), spec.keys)
    tomb = pc.is_valid(dead.column(DELETED_AT))
    wrong = pc.not_equal(tomb, tied.column(IS_DELETE))
    if pc.any(wrong).as_py():
        raise tie_error(tied.filter(wrong).slice(0, 1).to_pylist()[0], spec.keys, spec.sequence_by, ["_op"], HELD)
    redelivered = pc.and_(tie, pc.fill_null(joined.column(IS_DELETE), False))  # (a delete ties only a tombstone now)
    return pc.and_(tie, pc.invert(redelivered))


def state_source(spec: SinkSpec, fresh: pa.Table) -> pa.Table:
    """Each key's new head after the batch: the last of its guarded changes (``fresh`` sorted by key and
    sequence for SCD type 2; one change per key for type 1): key, sequence, tombstone time (null: live)."""
    if spec.scd_type == 2 and fresh.num_rows:
        starts = key_starts(fresh, spec.keys)
        last = np.append(np.flatnonzero(starts)[1:], fresh.num_rows) - 1
        fresh = fresh.take(pa.array(last))
    stamp = pc.if_else(fresh.column(IS_DELETE), fresh.column(NOW), pa.nulls(fresh.num_rows, TIMESTAMP))
    out = fresh.select([*spec.keys, spec.sequence_by])
    return out.append_column(pa.field(DELETED_AT, TIMESTAMP), stamp)
