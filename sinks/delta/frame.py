"""Batch preparation in Spark, for the delta-spark engine: the micro-batch never reaches the driver.

The same rules as :mod:`sinks.delta.batch`, :mod:`sinks.delta.scd1` and :mod:`sinks.delta.scd2`, feeding the
same engine-neutral :func:`sinks.delta.merge.merge_plan`, but on the batch's DataFrame:

* SCD type 1 without partial changes (the common case) runs in the JVM: the latest change per key is one
  hash aggregation (``max(struct(sequence, ...))``), and staging (deletes null their values and carry the
  tombstone time) is a projection.
* Partial changes (``_unchanged``) and SCD type 2 run the sink's own Arrow code (:func:`batch.prepare`, then
  :func:`scd1.stage_scd1` or :func:`scd2.stage_scd2`) on the executors, over buckets of keys
  (``hash(keys) mod n``): every key's changes and its head land in one bucket, so the per-key folds and
  history walks are exactly the ones the delta-rs engine runs.

The two-table layout (:mod:`sinks.delta.layout`) as the delta-rs path runs it: the key heads are the state
table's rows in the batch's key range, semi-joined with the batch's keys (SCD type 2: with the values of the
keys' current versions in the main table); changes not newer than their key's head are dropped (a join in
the JVM, or :func:`state.guard` in the buckets); the main table is merged first, then the state table with
each touched key's new head, each commit carrying ``(app_id, batch id)``. Both MERGEs read the state table
as it was before the batch (the state's own MERGE is the only writer of the state), so after a crash between
the two commits the replay merges the state alone from the same heads.

Only one row reaches the driver per batch: the checks and the key columns' range (a single aggregation),
which prunes the reads and the MERGEs (bound as typed literals, see :mod:`sinks.delta.keyrange`).

The commit steps themselves (truncate, create, schema evolution, the two MERGEs) are
:func:`sinks.delta.commit.apply`'s, the same as for an Arrow batch; :class:`FrameBatch` is their preparer.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import MalformedRecordError
from cdc.model import COMMIT_TS, OLD_KEY, OP, UNCHANGED, Op
from sinks.delta.batch import (
    ACCEPTED_OPS,
    complete_key_changes,
    first_at,
    prepare,
    unknown_ops_error,
)
from sinks.delta.commit import Outcome, Tables, apply
from sinks.delta.engine import FrameEngine
from sinks.delta.frame_ties import find_tie, hashable, no_tie, tie_error, tie_message
from sinks.delta.frame_ties import keys as _keys
from sinks.delta.inplan import eligible, guarded, needs_checks, null_leaf, prologue
from sinks.delta.keyrange import KeyRange, Rows, prunable
from sinks.delta.layout import (
    ACTION,
    AT,
    DEFAULT_DELETE_CONDITION,
    DELETED_AT,
    DROPPED_METADATA,
    FROM,
    IS_CURRENT,
    IS_DELETE,
    IS_TRUNCATE,
    NOW,
    SET_PREFIX,
    TIE,
    TIMESTAMP,
    TO,
    VALID_FROM,
    VALID_TO,
    quote,
)
from sinks.delta.merge import MergePlan
from sinks.delta.refresh import refresh_sequence
from sinks.delta.scd1 import is_tie_failure, stage_scd1
from sinks.delta.scd2 import main_source, stage_scd2
from sinks.delta.schema import normalise_type
from sinks.delta.sequence import check_nulls
from sinks.delta.spec import SinkSpec
from sinks.delta.state import HEAD_SEQ, HELD, guard, key_change_source

log = logging.getLogger(__name__)

BUCKET = "__cdc_bucket"


@dataclass(frozen=True)
class Checked:
    """A validated batch: its columns as the table keeps them, and what the one driver-side row told."""

    df: Any  # the batch with ``__cdc_is_delete``, without the dropped metadata and excluded columns
    rows: int
    partial: bool  # some change leaves columns unchanged (or carries a null that ignore_null_updates ignores)
    key_range: KeyRange
    #: inserts that leave columns unchanged (key changes): ``df`` keeps ``_op`` and ``_old_key`` for
    #: :func:`complete_key_changes_in_spark`, which drops them
    key_changes: int = 0
    #: the sequence of the batch's last truncate (``_op`` ``truncate`` or ``apply_as_truncates``); None: none
    truncated_at: Any = None
    #: the sequence of the batch's refresh records (``_op`` ``refresh``, :mod:`sinks.delta.refresh`); None: none
    refreshed_at: int | None = None


def check(spec: SinkSpec, df: Any) -> Checked:
    """Validate a batch of change records as :func:`sinks.delta.batch.prepare` does, in one Spark job."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    names = df.columns
    seq_type = df.schema[spec.sequence_by].dataType
    df = prologue(spec, df)
    guarded = spec.keys
    null_seq = null_leaf(F.col(quote(spec.sequence_by)), seq_type)
    arrow = to_arrow_schema(df.select(*_keys(spec)).schema, timezone="UTC")
    pruned = [k for k in spec.keys if prunable(arrow.field(k).type)]
    aggs = [F.count(F.lit(1)).alias("rows")]
    aggs += [F.min(F.col(quote(k))).alias(f"lo{i}") for i, k in enumerate(pruned)]
    aggs += [F.max(F.col(quote(k))).alias(f"hi{i}") for i, k in enumerate(pruned)]
    aggs += [F.count_if(F.col(quote(c)).isNull()).alias(f"null{i}") for i, c in enumerate(guarded)]
    aggs.append(F.count_if(null_seq).alias("null_seq"))
    if UNCHANGED in names:
        aggs.append(F.max(F.coalesce(F.size(UNCHANGED), F.lit(0))).alias("partial"))
        if OP in names:
            aggs.append(F.count_if(_completes(names)).alias("key_changes"))
    is_truncate = _is_truncate(names)
    if is_truncate is not None:  # counted in the same job as the rest
        aggs.append(F.max(F.when(is_truncate, F.col(quote(spec.sequence_by)))).alias("truncated_at"))
    is_refresh = F.coalesce(F.col(OP) == F.lit(Op.REFRESH.value), F.lit(False)) if OP in names else None
    if is_refresh is not None:
        aggs.append(F.max(F.when(is_refresh, F.col(quote(spec.sequence_by)))).alias("refreshed_at"))
    ignored = spec.null_ignored([c for c in spec.value_columns(names) if c not in spec.excluded(names)])
    if ignored:
        some_null = functools.reduce(lambda a, b: a | b, [F.col(quote(c)).isNull() for c in ignored])
        aggs.append(F.count_if(some_null & ~F.col(IS_DELETE)).alias("null_updates"))
    known = F.col(OP).isin(*ACCEPTED_OPS)  # a null _op is outside the model too
    checks_ops = OP in names and spec.apply_as_deletes.strip() == DEFAULT_DELETE_CONDITION and IS_DELETE not in names
    if checks_ops:
        aggs.append(F.count_if(~F.coalesce(known, F.lit(False))).alias("unknown_ops"))
    summary = df.agg(*aggs).first()
    if checks_ops and summary["unknown_ops"]:
        bad = df.where(~F.coalesce(known, F.lit(False)))
        values = sorted((r[0] for r in bad.select(OP).distinct().limit(20).collect()),
                        key=lambda v: (v is not None, v or ""))
        first = bad.limit(1).first()
        raise unknown_ops_error(int(summary["unknown_ops"]), values,
                                first_at(first.asDict() if first is not None else {}, spec.sequence_by))
    for i, c in enumerate(guarded):
        nulls = summary[f"null{i}"]
        if nulls:
            first = df.where(F.col(quote(c)).isNull()).limit(1).first()
            place = first_at(first.asDict() if first is not None else {})
            raise MalformedRecordError(f"{nulls} change record(s) have a null {c!r} ({place})")
    if summary["null_seq"]:
        check_nulls(spec.keys, spec.sequence_by, spec.sequence_columns, df.where(null_seq).limit(1).toArrow(),
                    int(summary["null_seq"]))
    if is_refresh is not None and summary["refreshed_at"] is not None:  # the rest, checked again (rare)
        at = refresh_sequence(spec, pa.array([summary["refreshed_at"]]))
        return replace(check(spec, df.where(~is_refresh)), refreshed_at=at)
    truncated_at = summary["truncated_at"] if is_truncate is not None else None
    if truncated_at is not None:  # the changes after the last truncate, checked again (a rare, second job)
        later = df.where((F.col(quote(spec.sequence_by)) > _literal(truncated_at, seq_type)) & ~is_truncate)
        after = check(spec, later.drop(IS_TRUNCATE) if IS_TRUNCATE in names else later)
        return Checked(after.df, after.rows, after.partial, after.key_range, after.key_changes, truncated_at)
    partial = UNCHANGED in names and bool(summary["partial"] and summary["partial"] > 0)
    partial = partial or bool(ignored and summary["null_updates"])
    key_changes = int(summary["key_changes"] or 0) if UNCHANGED in names and OP in names else 0
    kept = (OP, OLD_KEY) if key_changes else ()
    drop = [c for c in df.columns if (c in DROPPED_METADATA and c not in kept) or c == IS_TRUNCATE]
    drop += spec.excluded(df.columns)
    if UNCHANGED in names and not partial:
        drop.append(UNCHANGED)
    key_range = KeyRange.of_values(
        spec.keys, arrow, [(k, summary[f"lo{i}"], summary[f"hi{i}"]) for i, k in enumerate(pruned)]
    )
    return Checked(df.drop(*drop), int(summary["rows"]), partial, key_range, key_changes)


def _literal(value: Any, dtype: Any) -> Any:
    """A Spark literal of ``value`` (a sequence, a Row for a struct) typed ``dtype``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return F.struct(*[_literal(value[f.name], f.dataType).alias(f.name) for f in dtype.fields])
    return F.lit(value).cast(dtype)


def _is_truncate(names: list[str]) -> Any:
    """The batch's truncate records (``_op`` ``truncate``, or ``apply_as_truncates``: ``__cdc_is_truncate``)
    as a Column; None when the batch can hold none."""
    from pyspark.sql import functions as F

    flags = []
    if IS_TRUNCATE in names:
        flags.append(F.coalesce(F.col(IS_TRUNCATE).cast("boolean"), F.lit(False)))
    if OP in names:
        flags.append(F.coalesce(F.col(OP) == F.lit(Op.TRUNCATE.value), F.lit(False)))
    return functools.reduce(lambda a, b: a | b, flags) if flags else None


def _completes(names: list[str]) -> Any:
    """The inserts :func:`sinks.delta.batch.complete_key_changes` completes (or refuses): those that leave
    columns unchanged (with or without ``_old_key``)."""
    from pyspark.sql import functions as F

    return (F.col(OP) == F.lit(Op.INSERT.value)) & (F.coalesce(F.size(UNCHANGED), F.lit(0)) > 0) & ~F.col(IS_DELETE)


def complete_key_changes_in_spark(spec: SinkSpec, tables: Tables[FrameEngine], checked: Checked) -> Checked:
    """:func:`sinks.delta.batch.complete_key_changes` for a batch in Spark: the inserts it completes and the
    changes of their old keys (few: key changes are) are collected, completed on the driver by the same
    function as the delta-rs engine's, and put back in place of the inserts."""
    from pyspark.sql import functions as F

    df = checked.df
    keys = list(spec.keys)
    needs = _completes(df.columns)
    olds = df.where(needs & F.col(OLD_KEY).isNotNull()).select(*[F.col(OLD_KEY)[k].alias(k) for k in keys]).distinct()
    flagged = df.join(olds.withColumn("__cdc_old", F.lit(True)), keys, "left")
    subset = flagged.where(F.col("__cdc_old").isNotNull() | needs).drop("__cdc_old").toArrow()
    completed = complete_key_changes(
        spec, subset, lambda k: key_change_source(spec, tables.main, tables.state, k), tables.path)
    marks = pc.and_(pc.equal(subset.column(OP), Op.INSERT.value),
                    pc.greater(pc.fill_null(pc.list_value_length(subset.column(UNCHANGED)), 0), 0))
    replaced = df.sparkSession.createDataFrame(completed.filter(marks).select(df.columns))
    replaced = replaced.select(*[F.col(quote(f.name)).cast(f.dataType).alias(f.name) for f in df.schema.fields])
    whole = df.where(~needs).unionByName(replaced).drop(OP, OLD_KEY)
    return replace(checked, df=whole)


def _values(spec: SinkSpec, columns: list[str]) -> list[str]:
    return [c for c in columns if c not in spec.keys and c not in (IS_DELETE, spec.sequence_by, COMMIT_TS, UNCHANGED)]


def _no_heads(spec: SinkSpec, df: Any) -> Any:
    """An empty frame of key heads (ordered mode), typed as the state table's rows would be."""
    from pyspark.sql import functions as F

    heads = df.select(*_keys(spec), F.col(quote(spec.sequence_by))).where(F.lit(False))
    return heads.withColumn(DELETED_AT, F.lit(None).cast("timestamp"))


def _stage_latest(spec: SinkSpec, df: Any, now: datetime, heads: Any | None, ties: bool = True) -> Any:
    """SCD type 1: the latest change per key (exact duplicates tie on everything: any one), deletes with null
    values, kept only where newer than the key's head. The result's columns are those
    :func:`scd1.stage_scd1` gives after :func:`batch.prepare`. ``ties=False``: the batch's sequences are
    distinct per key (the cdc source's marked ``_seq``), so two changes of one key with one sequence and
    different values are not looked for."""
    from pyspark.sql import functions as F

    seq = spec.sequence_by
    columns = df.columns
    rest = [c for c in columns if c not in spec.keys and c != seq]
    # max over a struct compares its fields in order: the sequence first.
    latest_change = F.max(F.struct(*[F.col(quote(c)).alias(c) for c in (seq, *rest)])).alias("__cdc_latest")
    if ties and rest:
        # The hash of the rest of a change, largest and smallest among the key's changes of the latest
        # sequence: two that differ are two changes of that sequence with different values (see _no_tie).
        digest = F.xxhash64(*[x for c in rest for x in hashable(df, c)])
        latest = df.groupBy(*_keys(spec)).agg(
            latest_change,
            F.max(F.struct(F.col(quote(seq)).alias("s"), digest.alias("h"))).alias("__cdc_tie_hi"),
            F.max(F.struct(F.col(quote(seq)).alias("s"), F.bitwise_not(digest).alias("h"))).alias("__cdc_tie_lo"),
        ).where(no_tie(spec, df, rest))
    else:
        latest = df.groupBy(*_keys(spec)).agg(latest_change)
    latest = latest.select(*_keys(spec), *[F.col("__cdc_latest")[c].alias(c) for c in (seq, *rest)])
    is_delete = F.col(IS_DELETE)
    staged = [
        F.when(is_delete, F.lit(None).cast(df.schema[c].dataType)).otherwise(F.col(quote(c))).alias(c)
        if c in _values(spec, columns) else F.col(quote(c))
        for c in columns
    ]
    latest = latest.select(*staged, F.lit(now).cast("timestamp").alias(NOW))
    return latest if heads is None else _fresh(spec, latest, heads, ties=True)


def _fresh(spec: SinkSpec, changes: Any, heads: Any, ties: bool = False) -> Any:
    """The rows of ``changes`` newer than their key's head (:func:`sinks.delta.state.guard` as a join);
    ``ties``: also those at their head's sequence, marked ``__cdc_tie`` (the MERGE compares them with the stored
    row, see :func:`sinks.delta.merge.merge_plan`), but for the ties :func:`sinks.delta.state.guard` settles
    from the head alone: a delete at a tombstone's sequence is dropped; an upsert at it, or a delete at a live
    head's sequence, fails the job. An in-order batch has no ties."""
    from pyspark.sql import functions as F

    seq = spec.sequence_by
    head = heads.select(*_keys(spec), F.col(quote(seq)).alias(HEAD_SEQ), F.col(DELETED_AT).isNotNull().alias("__cdc_tomb"))
    joined = changes.join(head, list(spec.keys), "left")
    newer = F.col(HEAD_SEQ).isNull() | (F.col(quote(seq)) > F.col(HEAD_SEQ))
    kept = [F.col(quote(c)) for c in changes.columns]
    if not ties:
        return joined.where(newer).select(*kept)
    tie = F.coalesce(F.col(quote(seq)) == F.col(HEAD_SEQ), F.lit(False))
    wrong = F.raise_error(tie_message(spec, F.col(quote(seq)), ["_op"], HELD))
    settled = F.when(tie & (F.col("__cdc_tomb") != F.col(IS_DELETE)), wrong).otherwise(~(tie & F.col(IS_DELETE)))
    return joined.where(newer | (tie & settled)).select(*kept, tie.alias(TIE))


def _output_schema(spec: SinkSpec, checked: Checked, table: pa.Schema | None = None, ordered: bool = False) -> Any:
    """The Spark schema of what :func:`batch.prepare` and the staging step return for a checked batch (SCD
    type 2: with the value columns of the main table, of schema ``table``, the batch does not carry, which
    a version re-inserted by a back-fill keeps)."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    fields = [f for f in checked.df.schema.fields if f.name != UNCHANGED]
    if spec.scd_type == 2 and table is not None:
        bookkeeping = (*spec.keys, VALID_FROM, VALID_TO, IS_CURRENT)
        fields += [T.StructField(f.name, from_arrow_type(normalise_type(f.type))) for f in table
                   if f.name not in checked.df.columns and f.name not in bookkeeping]
    seq_type = checked.df.schema[spec.sequence_by].dataType
    if spec.scd_type == 1:
        fields += [T.StructField(SET_PREFIX + c, seq_type) for c in _values(spec, checked.df.columns)]
        fields += [T.StructField(NOW, T.TimestampType())]
        fields += [] if ordered else [T.StructField(TIE, T.BooleanType())]
    else:
        fields += [T.StructField(NOW, T.TimestampType()), T.StructField(ACTION, T.StringType()),
                   T.StructField(FROM, seq_type), T.StructField(TO, seq_type), T.StructField(AT, seq_type)]
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in fields])


def _stage_in_buckets(spec: SinkSpec, checked: Checked, now: datetime, heads: Any, history: Any = None,
                      table: pa.Schema | None = None, ordered: bool = False) -> Any:
    """The main table's MERGE source from the sink's Arrow staging, run per bucket of keys on the executors,
    each bucket's changes cogrouped with its keys' heads (SCD type 2: and the stored versions of its keys with
    a late change, ``history``, marked ``__cdc_version``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    df = checked.df
    spark = df.sparkSession
    buckets = max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 1))
    schema = _output_schema(spec, checked, table, ordered)
    arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def bucket(frame: Any) -> Any:
        return frame.withColumn(BUCKET, F.pmod(F.hash(*_keys(spec)), F.lit(buckets)))

    def conform(staged: pa.Table) -> pa.Table:
        # batch.prepare adds __cdc_set_<c> only to buckets holding partial changes; in a bucket without them
        # every change sets every column, which is exactly __cdc_set_<c> = the change's own sequence.
        for f in arrow_schema:
            if f.name not in staged.column_names and f.name.startswith(SET_PREFIX):
                staged = staged.append_column(f.name, staged.column(spec.sequence_by).cast(f.type))
            elif f.name not in staged.column_names:  # a table column the batch lacks (SCD type 2): null
                staged = staged.append_column(f.name, pa.nulls(staged.num_rows, f.type))
        return staged.select(arrow_schema.names).cast(arrow_schema)

    def stage(changes: pa.Table, head_rows: pa.Table) -> pa.Table:
        if changes.num_rows == 0:
            return arrow_schema.empty_table()
        prepared = prepare(spec, changes.drop_columns([BUCKET]), now)
        if head_rows.num_rows == 0 and (spec.scd_type == 1 or spec.sequence_by not in head_rows.column_names):
            # (a side without rows may come without columns)
            head_rows = prepared.select([*spec.keys, spec.sequence_by]).slice(0, 0)
            if spec.scd_type == 2:
                head_rows = head_rows.append_column(pa.field(DELETED_AT, TIMESTAMP), pa.nulls(0, TIMESTAMP))
                head_rows = head_rows.append_column(IS_CURRENT, pa.nulls(0, pa.bool_()))
        else:
            head_rows = head_rows.drop_columns([BUCKET])
        if spec.scd_type == 1:
            return conform(stage_scd1(spec, prepared, head_rows, ordered=ordered))
        versions = None
        if VERSION in head_rows.column_names:
            marks = pc.fill_null(head_rows.column(VERSION), False)
            versions = head_rows.filter(marks).drop_columns([VERSION])
            head_rows = head_rows.filter(pc.invert(marks)).drop_columns([VERSION])
        if ordered:  # a change not newer than its head is stale (the source orders each key): no back-fill
            prepared = guard(spec, prepared, head_rows)
        return conform(main_source(stage_scd2(spec, prepared, head_rows, versions)))

    if history is not None:
        from pyspark.sql import functions as F

        heads = heads.withColumn(VERSION, F.lit(False)).unionByName(
            history.withColumn(VERSION, F.lit(True)), allowMissingColumns=True)
    return bucket(df).groupBy(BUCKET).cogroup(bucket(heads).groupBy(BUCKET)).applyInArrow(stage, schema)


#: Marks the stored versions among the rows cogrouped with a bucket's changes (SCD type 2 back-fill).
VERSION = "__cdc_version"


def _history(spec: SinkSpec, main: FrameEngine, checked: Checked, heads: Any) -> Any:
    """The stored versions of the batch's keys with a change not newer than their head
    (:func:`sinks.delta.backfill.late_keys` in Spark): only those keys read their history."""
    from pyspark.sql import functions as F

    keys = list(spec.keys)
    seq = spec.sequence_by
    head = heads.select(*_keys(spec), F.col(quote(seq)).alias(HEAD_SEQ))
    late = checked.df.select(*_keys(spec), F.col(quote(seq))).join(head, keys).where(
        F.col(quote(seq)) <= F.col(HEAD_SEQ)).select(*_keys(spec)).distinct()
    return main.rows(Rows(checked.key_range)).join(late, keys, "left_semi")


def _heads(spec: SinkSpec, state: FrameEngine, main_schema: pa.Schema, main: FrameEngine,
           checked: Checked) -> Any:
    """The heads of the batch's keys: the state table's rows in the batch's key range, semi-joined with the
    batch's keys; SCD type 2 with the values of the keys' current versions (:func:`scd2.key_heads`)."""
    from pyspark.sql import functions as F

    keys = list(spec.keys)
    heads = state.rows(Rows(checked.key_range)).join(checked.df.select(*_keys(spec)).distinct(), keys, "left_semi")
    if spec.scd_type == 1:
        return heads
    heads = heads.select(*_keys(spec), F.col(quote(spec.sequence_by)), F.col(DELETED_AT),
                         F.col(DELETED_AT).isNull().alias(IS_CURRENT))
    bookkeeping = (spec.sequence_by, COMMIT_TS, VALID_FROM, VALID_TO, IS_CURRENT)
    values = [f.name for f in main_schema if f.name not in spec.keys and f.name not in bookkeeping]
    if not values:
        return heads
    current = main.rows(Rows(checked.key_range, current=True))
    return heads.join(current.select(*_keys(spec), *[F.col(quote(c)) for c in values]), keys, "left")


def _table_heads(spec: SinkSpec, main: FrameEngine, main_schema: pa.Schema, checked: Checked,
                 now: datetime) -> Any:
    """Ordered mode, SCD type 2: :func:`_heads` from the main table alone (:func:`scd2.table_heads` in Spark):
    a live key's current version (its sequence: ``sequence_by``, or ``_valid_from`` where hidden), a key of
    the batch without one its last closed version's ``_valid_to`` (a delete) as a tombstone."""
    from pyspark.sql import functions as F

    keys = list(spec.keys)
    seq = spec.sequence_by
    batch_keys = checked.df.select(*_keys(spec)).distinct()
    current = main.rows(Rows(checked.key_range, current=True)).join(batch_keys, keys, "left_semi")
    bookkeeping = (seq, COMMIT_TS, VALID_FROM, VALID_TO, IS_CURRENT)
    values = [F.col(quote(f.name)) for f in main_schema if f.name not in spec.keys and f.name not in bookkeeping]
    at = F.col(quote(seq if seq in main_schema.names else VALID_FROM)).cast(checked.df.schema[seq].dataType)
    live = current.select(*_keys(spec), at.alias(seq), F.lit(None).cast("timestamp").alias(DELETED_AT),
                          F.lit(True).alias(IS_CURRENT), *values)
    missing = batch_keys.join(current.select(*_keys(spec)), keys, "left_anti")
    closed = main.rows(Rows(checked.key_range)).join(missing, keys, "left_semi").groupBy(*_keys(spec)).agg(
        F.max(F.col(VALID_TO)).cast(checked.df.schema[seq].dataType).alias(seq))
    dead = closed.select(*_keys(spec), F.col(quote(seq)), F.lit(now).cast("timestamp").alias(DELETED_AT),
                         F.lit(False).alias(IS_CURRENT))
    return live.unionByName(dead, allowMissingColumns=True)


def _state_source(spec: SinkSpec, checked: Checked, staged: Any | None, heads: Any, now: datetime) -> Any:
    """Each touched key's new head (:func:`sinks.delta.state.state_source`): key, sequence, tombstone time."""
    from pyspark.sql import functions as F

    seq = spec.sequence_by
    if staged is not None:
        last = staged  # SCD type 1 without partial changes: the one guarded change per key
    else:
        # The key's last change of the batch, if newer than its head (the fold of partial changes and the
        # history walk keep the last change's sequence and delete flag); a delete ties after an upsert.
        latest = checked.df.groupBy(*_keys(spec)).agg(
            F.max(F.struct(F.col(quote(seq)).alias(seq), F.col(IS_DELETE).alias(IS_DELETE))).alias("__cdc_last")
        )
        latest = latest.select(*_keys(spec), F.col("__cdc_last")[seq].alias(seq),
                               F.col("__cdc_last")[IS_DELETE].alias(IS_DELETE))
        last = _fresh(spec, latest, heads)
    stamp = F.when(F.col(IS_DELETE), F.lit(now).cast("timestamp")).otherwise(F.lit(None).cast("timestamp"))
    return last.select(*_keys(spec), F.col(quote(seq)), stamp.alias(DELETED_AT))


def prepared_schema(checked: Checked) -> pa.Schema:
    """The Arrow schema :func:`batch.prepare` gives for this batch (what the table's columns come from)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    kept = StructType([f for f in checked.df.schema.fields if f.name != UNCHANGED])
    fields = [pa.field(f.name, normalise_type(f.type), f.nullable) for f in to_arrow_schema(kept, timezone="UTC")]
    return pa.schema([*fields, pa.field(NOW, TIMESTAMP)])


class FrameBatch:
    """A batch of change records as a DataFrame for :func:`sinks.delta.commit.apply`: checked in one Spark job
    (:func:`check`; ``fast``: not at all, the checks run in the MERGE's own plan, see :mod:`sinks.delta.inplan`),
    staged in Spark, merged by :meth:`~sinks.delta.engine.FrameEngine.merge_frame`."""

    def __init__(self, spec: SinkSpec, tables: Tables[FrameEngine], df: Any, now: datetime, fast: bool = False,
                 distinct_sequences: bool = False) -> None:
        self.spec, self.tables, self.df, self.now, self.fast = spec, tables, df, now, fast
        self.distinct_sequences = distinct_sequences  # see write_frame
        self.checked: Checked | None = None
        self._staged: tuple[Any] | None = None  # SCD type 1 without partial changes: the one change per key

    def check(self) -> Any:
        spec, tables, df = self.spec, self.tables, self.df
        if self.fast:
            names = df.columns
            drop = [c for c in names if c in DROPPED_METADATA] + spec.excluded(names)
            self.checked = Checked(guarded(spec, prologue(spec, df), names).drop(*drop), -1, False, KeyRange())
            return None
        checked = check(spec, df)
        if checked.key_changes:
            if tables.main_done:  # the state's commit alone needs no values
                checked = replace(checked, df=checked.df.drop(OP, OLD_KEY))
            else:
                checked = complete_key_changes_in_spark(spec, tables, checked)
        self.checked = checked
        return checked.truncated_at

    def refreshed(self) -> int | None:
        return self._checked().refreshed_at

    def _checked(self) -> Checked:
        assert self.checked is not None, "check() comes first"
        return self.checked

    def reduce(self) -> int:
        return self._checked().rows

    def schema(self) -> pa.Schema:
        return prepared_schema(self._checked())

    def heads(self, table: pa.Schema) -> Any:
        spec, tables, checked = self.spec, self.tables, self._checked()
        if tables.ordered and spec.scd_type == 2:  # no state table: the heads are the table's current versions
            return _table_heads(spec, tables.main, table, checked, self.now)
        if tables.ordered:  # no state table: the MERGE itself compares sequences
            return _no_heads(spec, checked.df)
        return _heads(spec, tables.state, table, tables.main, checked)

    def _latest(self, heads: Any) -> Any:
        """SCD type 1 without partial changes: the latest change per key, guarded (None: the other cases)."""
        if self._staged is None:
            checked, ordered = self._checked(), self.tables.ordered
            latest = self.spec.scd_type == 1 and not checked.partial
            self._staged = (_stage_latest(self.spec, checked.df, self.now, None if ordered else heads,
                                          ties=not self.distinct_sequences) if latest else None,)
        return self._staged[0]

    def main_source(self, heads: Any, table: pa.Schema) -> Any:
        spec, tables, checked = self.spec, self.tables, self._checked()
        staged = self._latest(heads)
        if staged is not None:
            return staged
        history = _history(spec, tables.main, checked, heads) if spec.scd_type == 2 and not tables.ordered else None
        return _stage_in_buckets(spec, checked, self.now, heads, history, table, tables.ordered)

    def state_source(self, heads: Any) -> Any:
        return _state_source(self.spec, self._checked(), self._latest(heads), heads, self.now)

    def columns(self, source: Any) -> list[str]:
        return list(source.columns)

    def key_range(self, source: Any) -> KeyRange:
        return self._checked().key_range

    def sequence_type(self, source: Any) -> pa.DataType:
        return self.schema().field(self.spec.sequence_by).type

    def size(self, source: Any) -> Any:
        rows = self._checked().rows
        return rows if rows >= 0 else "its"

    def merge_main(self, source: Any, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        return self.tables.main.merge_frame(source, plan, app_id, version)

    def merge_state(self, source: Any, plan: MergePlan, app_id: str, version: int) -> None:
        self.tables.state.merge_frame(source, plan, app_id, version)

    def tie(self, e: Exception, plan: MergePlan, source: Any) -> MalformedRecordError | None:
        found = tie_error(e)
        if found is None and is_tie_failure(e):
            found = find_tie(self.spec, plan, source, self.tables.main, self.tables.ordered)
        return found


def write_frame(spec: SinkSpec, tables: Tables[FrameEngine], df: Any, batch_id: int, app_id: str,
                now: datetime, distinct_sequences: bool = False) -> Outcome:
    """Prepare, stage and merge one batch inside Spark (:func:`sinks.delta.commit.apply`). Ordered mode tries
    the batch with its checks in the MERGE's own plan first (:mod:`sinks.delta.inplan`).
    ``distinct_sequences``: no two changes of one key in the batch share a sequence (the batch is one cdc
    source's output, whose backend orders every key's changes by a ``_seq`` that orders each channel totally:
    :data:`cdc.model.KEY_ORDER_MARK`), so the reduction to each key's latest change does not look for ties."""
    from pyspark import StorageLevel

    if eligible(spec, tables.mode, df.columns):  # ordered: the checks run in the MERGE's own plan
        try:
            return apply(spec, tables, FrameBatch(spec, tables, df, now, fast=True,
                                                  distinct_sequences=distinct_sequences), batch_id, app_id)
        except Exception as e:
            if not needs_checks(e):
                raise
            log.info("batch %d: its in-plan checks failed; nothing was written, running them first", batch_id)
    # The batch is read several times (the checks, each MERGE's source): cached, the source (a Python data
    # source, a log read) runs once.
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return apply(spec, tables, FrameBatch(spec, tables, df, now, distinct_sequences=distinct_sequences),
                     batch_id, app_id)
    finally:
        df.unpersist()
