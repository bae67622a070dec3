"""A batch's checks inside its MERGE's plan: in ordered mode, a batch that needs nothing of its data before its
MERGE runs no Spark job of its own.

The checked way (:func:`sinks.delta.frame.check`) runs one aggregation over the batch before its MERGE: null
keys or sequences, unknown ``_op`` values, truncates, partial changes and the key range that prunes the MERGE.
That job costs about as much as a fifth of a 100k-change MERGE. A batch in ordered mode (SCD type 1) with no
column that can mark a partial change or a truncate and no ``ignore_null_updates`` columns needs only to know
that nothing is wrong with it and that it holds no ``_op = 'truncate'``: those checks become a filter of the
MERGE's source which fails the MERGE's first job (Delta reads its whole source before it writes a file) with
:data:`MARK` on the first row that fails one, so nothing is written, and the batch then runs the checked way,
which names what is wrong or applies the truncate.

Such a MERGE is not pruned by the batch's key range (finding the range is that job): Delta reads the key
column of every file of the table to find the matched rows, which grows with the table.
``prune_by_key_range=True`` asks for the range in ordered mode too (one small Spark job per batch); it pays when
keys arrive clustered (increasing ids, time-ordered keys) into a table of many files.
"""

from __future__ import annotations

import functools
from typing import Any

from cdc.errors import OptionError
from cdc.model import OP, UNCHANGED, Op
from sinks.delta.batch import ACCEPTED_OPS, check_columns
from sinks.delta.layout import DEFAULT_DELETE_CONDITION, IS_DELETE, IS_TRUNCATE, ORDERED, quote
from sinks.delta.schema import SchemaEvolutionError
from sinks.delta.sequence import check_type
from sinks.delta.spec import SinkSpec

#: The text of the error that sends a batch from the in-plan checks to the checked way.
MARK = "cdc-tunnel: the batch needs its checks run first"


def prologue(spec: SinkSpec, df: Any) -> Any:
    """The checks that need only the batch's schema, and its delete flag (``__cdc_is_delete``) added."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    names = df.columns
    check_columns(spec, names)
    check_type(spec.sequence_by, to_arrow_schema(T.StructType([df.schema[spec.sequence_by]]), timezone="UTC")[0].type)
    naive = [f.name for f in df.schema.fields if isinstance(f.dataType, T.TimestampNTZType)]
    if naive:
        raise SchemaEvolutionError(f"naive timestamps ({naive}) are not supported in Delta tables written by the sink; use UTC")
    if IS_DELETE in names:
        return df.withColumn(IS_DELETE, F.coalesce(F.col(IS_DELETE).cast("boolean"), F.lit(False)))
    if spec.apply_as_deletes.strip() != DEFAULT_DELETE_CONDITION:
        raise OptionError(
            f"option 'apply_as_deletes' ({spec.apply_as_deletes!r}) needs the boolean column {IS_DELETE!r}",
            "apply_as_deletes",
        )
    if OP not in names:
        raise OptionError(f"the changes have no {OP!r} column to find deletes with", "apply_as_deletes")
    return df.withColumn(IS_DELETE, F.coalesce(F.col(OP) == F.lit(Op.DELETE.value), F.lit(False)))


def null_leaf(column: Any, dtype: Any) -> Any:
    """A Column: the sequence ``column`` (of Spark type ``dtype``) is null, or a field of it is."""
    from pyspark.sql import types as T

    if not isinstance(dtype, T.StructType):
        return column.isNull()
    fields = [null_leaf(column[f.name], f.dataType) for f in dtype.fields]
    return functools.reduce(lambda a, b: a | b, fields, column.isNull())


def eligible(spec: SinkSpec, mode: str, names: list[str]) -> bool:
    """Whether a batch of columns ``names`` can run with its checks in its MERGE's plan."""
    values = [c for c in spec.value_columns(names) if c not in spec.excluded(names)]
    return (mode == ORDERED and spec.scd_type == 1 and spec.prune_by_key_range is None
            and UNCHANGED not in names and IS_TRUNCATE not in names and not spec.null_ignored(values))


def guarded(spec: SinkSpec, df: Any, original: list[str]) -> Any:
    """``df`` (after :func:`prologue`) with the checks as a filter that fails the job with :data:`MARK`;
    ``original`` are the batch's own column names (whether it had ``_op`` and the delete flag)."""
    from pyspark.sql import functions as F

    bad = [F.col(quote(k)).isNull() for k in spec.keys]
    bad.append(null_leaf(F.col(quote(spec.sequence_by)), df.schema[spec.sequence_by].dataType))
    if OP in original:
        op = F.col(OP)
        bad.append(F.coalesce(op.isin(Op.TRUNCATE.value, Op.REFRESH.value), F.lit(False)))
        if IS_DELETE not in original and spec.apply_as_deletes.strip() == DEFAULT_DELETE_CONDITION:
            bad.append(~F.coalesce(op.isin(*ACCEPTED_OPS), F.lit(False)))
    wrong = functools.reduce(lambda a, b: a | b, bad)
    return df.where(F.when(wrong, F.raise_error(F.lit(MARK))).otherwise(F.lit(True)))


def needs_checks(e: BaseException) -> bool:
    """Whether ``e`` is the in-plan checks' failure (the batch must run the checked way)."""
    return MARK in str(e)
