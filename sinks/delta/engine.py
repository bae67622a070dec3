"""What an engine must do for the sink: run the statements :mod:`sinks.delta.merge` generates.

An engine decides nothing: the sink prepares and stages each batch and builds every MERGE predicate and
clause once, engine-independently (see :mod:`sinks.delta.spec`); an engine only reads the table's schema and
heads and commits.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from sinks.delta.keyrange import Rows
from sinks.delta.merge import MergePlan


class Engine(Protocol):
    """A Delta Lake engine: delta-rs (:class:`sinks.delta.rs.DeltaRsEngine`) or delta-spark."""

    #: The table's location.
    path: str

    name: str
    #: True when the engine itself skips a commit already made under ``(app_id, version)``.
    enforces_transactions: bool
    #: A boolean SQL expression over the MERGE source that fails the MERGE at run time (nothing committed) with
    #: :data:`sinks.delta.layout.TIE_MARK` in its message; evaluated only for a row that ties a stored change.
    tie_fail: str

    def schema(self) -> pa.Schema | None:
        """The table's Arrow schema, or None when no table exists at the path yet."""

    def committed_version(self, app_id: str) -> int | None:
        """The last version committed by the application transaction ``app_id`` (None: none or unknown)."""

    def create(self, schema: pa.Schema, properties: dict[str, str] | None = None) -> None:
        """Create an empty table with table ``properties`` (no-op if a table already exists)."""

    def properties(self) -> dict[str, str]:
        """The table's properties (its metadata's configuration); empty when no table exists."""

    def add_columns(self, fields: list[pa.Field]) -> None:
        """Add nullable columns to the table."""

    def read(self, rows: Rows, keys: pa.Table | None = None) -> pa.Table:
        """The table's ``rows`` (pruned by their key range where the table's statistics allow); ``keys``: only
        the rows of those keys are wanted, which an engine may use to return fewer (the caller matches them)."""

    def merge(self, source: pa.Table, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        """Run ``plan`` with ``source`` as one commit carrying the application transaction."""

    def delete(self, predicate: str) -> None:
        """Delete the rows matching ``predicate`` (one commit)."""

    def compact(self) -> None:
        """Rewrite small files into larger ones (one commit; readers keep their snapshot)."""


@runtime_checkable
class FrameEngine(Engine, Protocol):
    """An engine that also merges a Spark DataFrame where it is (delta-spark,
    :class:`sinks.delta.spark.DeltaSparkEngine`): what :mod:`sinks.delta.frame` needs, so that a batch of
    ``foreachBatch`` never reaches the driver."""

    def rows(self, rows: Rows) -> Any:
        """The table's ``rows`` as a DataFrame (the key range bound as typed literals)."""

    def merge_frame(self, source_df: Any, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        """Run ``plan`` with the DataFrame ``source_df`` as one commit carrying ``(app_id, version)``."""


def open_engine(name: str, path: str, spark: Any = None, storage_options: dict[str, str] | None = None) -> Engine:
    """The engine ``name`` (``delta-rs`` or ``delta-spark``) on the table at ``path``; delta-spark runs in
    ``spark`` (default: the active session)."""
    if name == "delta-rs":
        from sinks.delta.rs import DeltaRsEngine

        return DeltaRsEngine(path, storage_options)
    from sinks.delta.spark import DeltaSparkEngine

    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    return DeltaSparkEngine(spark, path)
