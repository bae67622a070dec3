"""Ties in the DataFrame path (:mod:`sinks.delta.frame`): two changes of one key with one sequence and different
values, found inside Spark (a filter that fails the job, nothing written) and named for the user (only the first
conflict's rows reach the driver). :mod:`sinks.delta.sequence` holds the rules and the Arrow path's checks.
"""

from __future__ import annotations

from typing import Any

from cdc.errors import MalformedRecordError
from sinks.delta.engine import FrameEngine
from sinks.delta.keyrange import Rows
from sinks.delta.layout import SOURCE_ALIAS, TARGET_ALIAS, quote
from sinks.delta.scd1 import tie_conflict
from sinks.delta.spec import SinkSpec


def keys(spec: SinkSpec) -> list[Any]:
    """The key columns as Spark Columns (quoted)."""
    from pyspark.sql import functions as F

    return [F.col(quote(k)) for k in spec.keys]


def hashable(df: Any, c: str) -> list[Any]:
    """A column as xxhash64 takes it, with its null flag (xxhash64 skips a null, so (null, 1) and (1, null)
    would hash alike); a map (which it does not hash) as JSON."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    column = F.col(quote(c))
    shown = F.to_json(column) if isinstance(df.schema[c].dataType, T.MapType) else column
    return [shown, column.isNull()]


#: The text every error about two changes of one key with one sequence and different values holds.
TIE_TEXT = "have the same sequence"


def no_tie(spec: SinkSpec, df: Any, rest: list[str]) -> Any:
    """A filter over the latest-change aggregation that fails the job (nothing written) when a key's latest
    sequence holds changes with different values (:func:`sinks.delta.sequence.check_ties` for the batch's
    reduction in Spark; identical changes hash alike and pass)."""
    from pyspark.sql import functions as F

    tie = F.col("__cdc_tie_hi")["h"] != F.bitwise_not(F.col("__cdc_tie_lo")["h"])
    return F.when(tie, F.raise_error(tie_message(spec, F.col("__cdc_tie_hi")["s"]))).otherwise(F.lit(True))


def tie_message(spec: SinkSpec, sequence: Any, differ: list[str] | None = None, held: str = "") -> Any:
    """:func:`sinks.delta.sequence.tie_error`'s message as a Spark Column (the key and the sequence as JSON)."""
    from pyspark.sql import functions as F

    columns = f" in column(s) {differ}" if differ else ""
    return F.concat(
        F.lit("two changes of key "), F.to_json(F.struct(*keys(spec))), F.lit(f" {TIE_TEXT} ({spec.sequence_by} "),
        F.to_json(F.struct(sequence.alias(spec.sequence_by))),
        F.lit(f") and different values{columns}: {held + ', and ' if held else ''}which one is the later cannot be "
              "told, so nothing was written. Give sequence_by a column (or several) that orders every key's changes; "
              "identical changes (redeliveries) are fine"),
    )


def tie_error(e: Exception) -> MalformedRecordError | None:
    """The sink's error for a tie that failed a Spark job (the Arrow steps' raised on an executor, or
    :func:`_no_tie`'s), or None for any other failure."""
    text = str(e)
    start = text.find("two changes of key ")
    if start < 0 or TIE_TEXT not in text:
        return None
    end = text.find("are fine", start)
    return MalformedRecordError(text[start: end + len("are fine")] if end > 0 else text[start:].splitlines()[0])


def find_tie(spec: SinkSpec, plan: Any, source: Any, main: FrameEngine, ordered: bool) -> Any:
    """After the MERGE of ``source`` failed on a tie: the error naming the first conflict, found by a join of
    the tied changes with the table in Spark (only the first conflict's two rows reach the driver)."""
    from pyspark.sql import functions as F

    target = main.rows(Rows(plan.key_range))
    pairs = source.alias(SOURCE_ALIAS).join(target.alias(TARGET_ALIAS), F.expr(plan.predicate), "left")
    named = [F.col(f"{SOURCE_ALIAS}.{quote(c)}").alias(f"s{i}") for i, c in enumerate(source.columns)]
    named += [F.col(f"{TARGET_ALIAS}.{quote(c)}").alias(f"t{i}") for i, c in enumerate(target.columns)]
    first = pairs.where(F.expr(plan.ties)).select(*named).limit(1).collect()
    if not first:
        return None
    row = first[0].asDict(recursive=True)
    change = {c: row[f"s{i}"] for i, c in enumerate(source.columns)}
    stored = {c: row[f"t{i}"] for i, c in enumerate(target.columns)}
    return tie_conflict(spec, plan, change, None if stored[spec.keys[0]] is None else stored, ordered)
