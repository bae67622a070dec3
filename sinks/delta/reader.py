"""Read a sink-managed Delta table into Spark: with Delta's own reader when the io.delta jars are on the
session's classpath, else from exactly the table's current data files (listed by delta-rs).

The table is a plain Delta table of live rows (see :mod:`sinks.delta.layout`), so either is a plain read; the
filter on ``__cdc_deleted_at`` is kept only for tables of the previous layout.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from cdc.errors import TerminalError
from sinks.delta.layout import DELETED_AT, HIDDEN_PREFIX, IS_CURRENT

# Reader features that make the data files alone an incorrect view of the table.
_UNSUPPORTED = {"deletionVectors", "columnMapping"}


def read(spark: Any, path: str, *, current_only: bool = False, storage_options: dict[str, str] | None = None) -> Any:
    """The table at ``path`` as a Spark DataFrame (its rows are the live rows).

    With the io.delta jars (``make delta-spark``) it is ``spark.read.format("delta")``; without them it reads
    exactly the table's current data files (``DeltaTable.file_uris()``), never the folder, so files that
    merges replaced are not read. For an SCD type 2 table every version is returned unless
    ``current_only``.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    if _delta_reader(spark):
        return _visible(spark.read.format("delta").load(path), current_only)
    dt = DeltaTable(path, storage_options=storage_options)
    features = set(dt.protocol().reader_features or ())
    if features & _UNSUPPORTED:
        raise TerminalError(
            f"{path}: reader features {sorted(features & _UNSUPPORTED)} need a Delta reader; the data files alone "
            "would be read wrongly"
        )
    schema = pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in pa.schema(dt.schema().to_arrow())])
    spark_schema = from_arrow_schema(schema)
    uris = dt.file_uris()
    df = spark.read.schema(spark_schema).parquet(*uris) if uris else spark.createDataFrame([], spark_schema)
    return _visible(df, current_only)


def _delta_reader(spark: Any) -> bool:
    from sinks.delta.session import delta_jars_available

    try:
        return delta_jars_available(spark)
    except Exception:  # a session without a JVM gateway to ask: the delta-rs file listing still works
        return False


def _visible(df: Any, current_only: bool) -> Any:
    """The live rows: tombstones and the sink's hidden columns dropped (SCD2: current versions if asked)."""
    from pyspark.sql import functions as F

    names = df.columns
    if DELETED_AT in names:
        df = df.where(F.col(DELETED_AT).isNull())
    if current_only and IS_CURRENT in names:
        df = df.where(F.col(IS_CURRENT))
    return df.drop(*[n for n in names if n.startswith(HIDDEN_PREFIX)])


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t
