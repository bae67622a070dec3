"""Batch preparation in Spark, for the delta-spark engine: the micro-batch never reaches the driver.

The same rules as :mod:`sinks.delta.batch`, :mod:`sinks.delta.scd1` and :mod:`sinks.delta.scd2`, feeding the
same engine-neutral :func:`sinks.delta.merge.merge_plan`, but on the batch's DataFrame:

* SCD type 1 without partial changes (the common case) runs in the JVM: the latest change per key is one
  hash aggregation (``max(struct(sequence, ...))``), and staging (deletes null their values and carry the
  tombstone time) is a projection.
* Partial changes (``_unchanged``) and SCD type 2 run the sink's own Arrow code (:func:`batch.prepare`, then
  :func:`scd1.stage_scd1` or :func:`scd2.stage_scd2`) on the executors, over buckets of keys
  (``hash(keys) mod n``): every key's changes, and for SCD type 2 its head row read from the table, land in
  one bucket, so the per-key folds and history walks are exactly the ones the delta-rs engine runs.

Only one row reaches the driver per batch: the checks and the first key's range (a single aggregation),
which the MERGE predicate needs for pruning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from cdc.errors import MalformedRecordError, OptionError
from cdc.model import CHANNEL, COMMIT_TS, OP, POSITION, UNCHANGED, Op
from sinks.delta.batch import prepare
from sinks.delta.layout import (
    ACTION,
    DEFAULT_DELETE_CONDITION,
    DELETED_AT,
    DROPPED_METADATA,
    FROM,
    HIDDEN_PREFIX,
    IS_DELETE,
    NOW,
    SET_PREFIX,
    TIMESTAMP,
    TO,
)
from sinks.delta.merge import merge_plan, quote
from sinks.delta.scd1 import stage_scd1
from sinks.delta.scd2 import heads_condition, stage_scd2
from sinks.delta.schema import SchemaEvolutionError, new_columns, normalise_type, table_schema
from sinks.delta.spark import DeltaSparkEngine
from sinks.delta.spec import SinkSpec

log = logging.getLogger(__name__)

BUCKET = "__cdc_bucket"


@dataclass(frozen=True)
class Checked:
    """A validated batch: its columns as the table keeps them, and what the one driver-side row told."""

    df: Any  # the batch with ``__cdc_is_delete``, without the dropped metadata and excluded columns
    rows: int
    partial: bool  # some change leaves columns unchanged
    key_min: Any
    key_max: Any


def check(spec: SinkSpec, df: Any) -> Checked:
    """Validate a batch of change records as :func:`sinks.delta.batch.prepare` does, in one Spark job."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    names = df.columns
    missing = [c for c in (*spec.keys, spec.sequence_by) if c not in names]
    if missing:
        raise OptionError(
            f"the changes have no column(s) {missing} named by 'keys'/'sequence_by'; columns: {names}",
            "keys" if set(missing) & set(spec.keys) else "sequence_by",
        )
    clash = [c for c in names if c in spec.reserved[2:] or (c.startswith(HIDDEN_PREFIX) and c != IS_DELETE)]
    if clash:
        raise OptionError(f"the changes carry columns reserved by the sink: {clash}", "keys")
    seq_type = df.schema[spec.sequence_by].dataType
    if not isinstance(seq_type, T.IntegralType | T.TimestampType):
        raise OptionError(
            f"option 'sequence_by': column {spec.sequence_by!r} has type {seq_type.simpleString()}; an integer "
            "or timestamp column is required",
            "sequence_by",
        )
    naive = [f.name for f in df.schema.fields if isinstance(f.dataType, T.TimestampNTZType)]
    if naive:
        raise SchemaEvolutionError(f"naive timestamps ({naive}) are not supported in Delta tables written by the sink; use UTC")
    if IS_DELETE not in names:
        if spec.apply_as_deletes.strip() != DEFAULT_DELETE_CONDITION:
            raise OptionError(
                f"option 'apply_as_deletes' ({spec.apply_as_deletes!r}) needs the boolean column {IS_DELETE!r}",
                "apply_as_deletes",
            )
        if OP not in names:
            raise OptionError(f"the changes have no {OP!r} column to find deletes with", "apply_as_deletes")
        df = df.withColumn(IS_DELETE, F.coalesce(F.col(OP) == F.lit(Op.DELETE.value), F.lit(False)))
    else:
        df = df.withColumn(IS_DELETE, F.coalesce(F.col(IS_DELETE).cast("boolean"), F.lit(False)))
    guarded = (*spec.keys, spec.sequence_by)
    k = spec.keys[0]
    aggs = [F.count(F.lit(1)).alias("rows"), F.min(quote(k)).alias("lo"), F.max(quote(k)).alias("hi")]
    aggs += [F.count_if(F.col(quote(c)).isNull()).alias(f"null{i}") for i, c in enumerate(guarded)]
    if UNCHANGED in names:
        aggs.append(F.max(F.coalesce(F.size(UNCHANGED), F.lit(0))).alias("partial"))
    if OP in names:  # counted in the same job as the rest
        aggs.append(F.count_if(F.col(OP) == F.lit(Op.TRUNCATE.value)).alias("truncates"))
    summary = df.agg(*aggs).first()
    if OP in names and summary["truncates"]:
        raise OptionError(
            f"the batch holds {summary['truncates']} truncate record(s) (debezium.truncate=apply), which the sink "
            "applies only with engine='delta-rs'; accepted: engine='delta-rs', or debezium.truncate=fail",
            "engine",
        )
    for i, c in enumerate(guarded):
        nulls = summary[f"null{i}"]
        if nulls:
            first = df.where(F.col(quote(c)).isNull()).limit(1).first()
            where = first.asDict() if first is not None else {}
            place = (f"first at channel {where[CHANNEL]!r} position {where[POSITION]}"
                     if CHANNEL in where and POSITION in where else f"first: {where}")
            raise MalformedRecordError(f"{nulls} change record(s) have a null {c!r} ({place})")
    partial = UNCHANGED in names and bool(summary["partial"] and summary["partial"] > 0)
    drop = [c for c in df.columns if c in DROPPED_METADATA or c in spec.except_columns]
    if UNCHANGED in names and not partial:
        drop.append(UNCHANGED)
    return Checked(df.drop(*drop), int(summary["rows"]), partial, summary["lo"], summary["hi"])


def stage_frame(spec: SinkSpec, checked: Checked, now: datetime, heads: Any = None) -> Any:
    """The MERGE source of a checked batch, as a DataFrame (see the module docstring). ``heads``: SCD type 2
    only, the key heads the batch may touch (a DataFrame of the table's rows)."""
    if spec.scd_type == 1 and not checked.partial:
        return _stage_latest(spec, checked.df, now)
    return _stage_in_buckets(spec, checked, now, heads)


def _values(spec: SinkSpec, columns: list[str]) -> list[str]:
    return [c for c in columns if c not in spec.keys and c not in (IS_DELETE, spec.sequence_by, COMMIT_TS, UNCHANGED)]


def _stage_latest(spec: SinkSpec, df: Any, now: datetime) -> Any:
    """SCD type 1: the latest change per key (exact duplicates tie on everything: any one), deletes staged as
    tombstones. The result's columns are those :func:`scd1.stage_scd1` gives after :func:`batch.prepare`."""
    from pyspark.sql import functions as F

    seq = spec.sequence_by
    columns = df.columns
    rest = [c for c in columns if c not in spec.keys and c != seq]
    # max over a struct compares its fields in order: the sequence first.
    latest = df.groupBy(*[quote(k) for k in spec.keys]).agg(
        F.max(F.struct(*[F.col(quote(c)).alias(c) for c in (seq, *rest)])).alias("__cdc_latest")
    )
    latest = latest.select(*[F.col(quote(k)) for k in spec.keys],
                           *[F.col("__cdc_latest")[c].alias(c) for c in (seq, *rest)])
    is_delete = F.col(IS_DELETE)
    staged = [
        F.when(is_delete, F.lit(None).cast(df.schema[c].dataType)).otherwise(F.col(quote(c))).alias(c)
        if c in _values(spec, columns) else F.col(quote(c))
        for c in columns
    ]
    stamp = F.lit(now).cast("timestamp")
    return latest.select(
        *staged, stamp.alias(NOW), F.when(is_delete, stamp).otherwise(F.lit(None).cast("timestamp")).alias(DELETED_AT)
    )


def _output_schema(spec: SinkSpec, checked: Checked) -> Any:
    """The Spark schema of what :func:`batch.prepare` and the staging step return for a checked batch."""
    from pyspark.sql import types as T

    fields = [f for f in checked.df.schema.fields if f.name != UNCHANGED]
    seq_type = checked.df.schema[spec.sequence_by].dataType
    if spec.scd_type == 1:
        fields += [T.StructField(SET_PREFIX + c, seq_type) for c in _values(spec, checked.df.columns)]
        fields += [T.StructField(NOW, T.TimestampType()), T.StructField(DELETED_AT, T.TimestampType())]
    else:
        fields += [T.StructField(NOW, T.TimestampType()), T.StructField(ACTION, T.StringType()),
                   T.StructField(FROM, seq_type), T.StructField(TO, seq_type)]
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in fields])


def _stage_in_buckets(spec: SinkSpec, checked: Checked, now: datetime, heads: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    df = checked.df
    spark = df.sparkSession
    buckets = max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 1))
    schema = _output_schema(spec, checked)
    arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def bucket(frame: Any) -> Any:
        return frame.withColumn(BUCKET, F.pmod(F.hash(*[F.col(quote(k)) for k in spec.keys]), F.lit(buckets)))

    def conform(staged: pa.Table) -> pa.Table:
        # batch.prepare adds __cdc_set_<c> only to buckets holding partial changes; in a bucket without them
        # every change sets every column, which is exactly __cdc_set_<c> = the change's own sequence.
        for f in arrow_schema:
            if f.name not in staged.column_names:
                staged = staged.append_column(f.name, staged.column(spec.sequence_by).cast(f.type))
        return staged.select(arrow_schema.names).cast(arrow_schema)

    def prepared(changes: pa.Table) -> pa.Table:
        return prepare(spec, changes.drop_columns([BUCKET]), now)

    if spec.scd_type == 1:
        def stage1(changes: pa.Table) -> pa.Table:
            return conform(stage_scd1(spec, prepared(changes)))

        return bucket(df).groupBy(BUCKET).applyInArrow(stage1, schema)

    def stage2(changes: pa.Table, head_rows: pa.Table) -> pa.Table:
        if changes.num_rows == 0:
            return arrow_schema.empty_table()
        return conform(stage_scd2(spec, prepared(changes), head_rows.drop_columns([BUCKET])))

    return bucket(df).groupBy(BUCKET).cogroup(bucket(heads).groupBy(BUCKET)).applyInArrow(
        stage2, schema
    )


def heads_sql(spec: SinkSpec, checked: Checked) -> str:
    """The SQL condition on the table's rows that :func:`scd2.heads_condition` gives for this batch."""
    return str(heads_condition(spec, bounds(spec, [spec.keys[0]], checked))[0])


def bounds(spec: SinkSpec, columns: list[str], checked: Checked) -> pa.Table:
    """A two-row stand-in for the MERGE source: :func:`sinks.delta.merge.merge_plan` and
    :func:`sinks.delta.scd2.heads_condition` read only its column names and the first key's range."""
    k = spec.keys[0]
    return pa.table({c: pa.array([checked.key_min, checked.key_max]) if c == k else pa.nulls(2) for c in columns})



def prepared_schema(checked: Checked) -> pa.Schema:
    """The Arrow schema :func:`batch.prepare` gives for this batch (what the table's columns come from)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    kept = StructType([f for f in checked.df.schema.fields if f.name != UNCHANGED])
    fields = [pa.field(f.name, normalise_type(f.type), f.nullable) for f in to_arrow_schema(kept, timezone="UTC")]
    return pa.schema([*fields, pa.field(NOW, TIMESTAMP)])


def write_frame(spec: SinkSpec, engine: DeltaSparkEngine, df: Any, batch_id: int, app_id: str, now: datetime) -> bool:
    """Prepare, stage and merge one batch inside Spark (one commit carrying ``(app_id, batch_id)``); return
    False when the batch holds no changes. The caller has checked that the batch is not a replay."""
    from pyspark import StorageLevel

    # The batch is read twice (the checks, then the MERGE, which materializes its source once): cached, the
    # source (a Python data source, a log read) runs once.
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _write_checked(spec, engine, check(spec, df), batch_id, app_id, now)
    finally:
        df.unpersist()


def _write_checked(spec: SinkSpec, engine: DeltaSparkEngine, checked: Checked, batch_id: int, app_id: str, now: datetime) -> bool:
    if checked.rows == 0:
        log.debug("batch %d has no changes", batch_id)
        return False
    prepared = prepared_schema(checked)
    schema = engine.schema()
    if schema is None:
        engine.create(table_schema(spec, prepared))
        schema = engine.schema()
        assert schema is not None
    added = new_columns(spec, schema, prepared)
    if added:
        log.info("adding columns %s to %s", [f.name for f in added], engine.path)
        engine.add_columns(added)
        schema = pa.schema([*schema, *added])
    heads = engine.frame().where(heads_sql(spec, checked)) if spec.scd_type == 2 else None
    source = stage_frame(spec, checked, now, heads)
    plan = merge_plan(spec, bounds(spec, source.columns, checked), schema)
    engine.merge_frame(source, plan, app_id, batch_id)
    log.info("batch %d: merged %d change records into %s in Spark", batch_id, checked.rows, engine.path)
    return True
