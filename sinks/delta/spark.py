"""The delta-spark engine: ``DeltaTable.forPath(...).merge`` inside Spark, with the io.delta jars that
``make delta-spark`` resolves (see :mod:`sinks.delta.session`).

It runs exactly the statements :mod:`sinks.delta.merge` generates for delta-rs (same predicate, same
WHEN clauses, same staging), with the batch's key range added to the MERGE condition as ``Column``
literals (typed values, never SQL text). From ``foreachBatch`` the batch stays a DataFrame (:meth:`merge_frame`, fed by
:mod:`sinks.delta.frame`); :meth:`merge` takes an Arrow batch (the sink's ``write``). Exactly-once uses
Delta's idempotent writes: the session confs ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``
make Delta skip a commit already made under that application transaction, and the sink reads the last
committed version from the table's log first, so a replay costs no Spark job.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from cdc.errors import TerminalError
from sinks.delta.keyrange import Rows
from sinks.delta.layout import TIE_MARK, quote
from sinks.delta.merge import MergePlan
from sinks.delta.session import UNAVAILABLE, delta_jars_available, is_connect

log = logging.getLogger(__name__)

class DeltaSparkEngine:
    name = "delta-spark"
    enforces_transactions = True
    tie_fail = f"CAST(raise_error('{TIE_MARK}') AS BOOLEAN)"

    def __init__(self, spark: Any, path: str) -> None:
        # Under Spark Connect the server's classpath cannot be asked (no ``_jvm``): delta-spark's Python
        # DeltaTable sends its calls through Delta's Connect plugin, which the server must load.
        if not is_connect(spark) and not delta_jars_available(spark):
            raise TerminalError(UNAVAILABLE)
        try:
            from delta.tables import DeltaTable  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise TerminalError("the delta-spark engine needs the Python package: pip install delta-spark") from None
        self.spark, self.path, self._DeltaTable = spark, path, DeltaTable

    def _forpath(self) -> Any:
        return self._DeltaTable.forPath(self.spark, self.path)

    def schema(self) -> pa.Schema | None:
        from deltalake import DeltaTable as LogReader
        from pyspark.sql.pandas.types import to_arrow_schema

        # Not DeltaTable.isDeltaTable: it is true for any folder inside a Delta table (it looks for the table
        # root upwards), so the state table at <path>/_cdc_state would pass for the main table before it exists.
        if not LogReader.is_deltatable(self.path):
            return None
        return to_arrow_schema(self._forpath().toDF().schema, timezone="UTC")

    def committed_version(self, app_id: str) -> int | None:
        # The log's txn actions, read by delta-rs on the driver: no Spark job, and the same answer Delta's
        # own check gives (which still guards the commit itself: enforces_transactions).
        from deltalake import DeltaTable as LogReader
        from deltalake.exceptions import TableNotFoundError

        try:
            version = LogReader(self.path).transaction_version(app_id)
        except TableNotFoundError:
            return None
        return None if version is None else int(version)

    def frame(self) -> Any:
        """The table as a DataFrame (Delta's reader)."""
        return self._forpath().toDF()

    def create(self, schema: pa.Schema, properties: dict[str, str] | None = None) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        builder = self._DeltaTable.createIfNotExists(self.spark).location(self.path)
        for key, value in (properties or {}).items():
            builder = builder.property(key, value)
        builder.addColumns(from_arrow_schema(schema)).execute()

    def properties(self) -> dict[str, str]:
        # Read from the log by delta-rs on the driver, as committed_version: no Spark job.
        from deltalake import DeltaTable as LogReader
        from deltalake.exceptions import TableNotFoundError

        try:
            configuration = LogReader(self.path).metadata().configuration
        except TableNotFoundError:
            return {}
        return {k: str(v) for k, v in configuration.items() if v is not None}

    def add_columns(self, fields: list[pa.Field]) -> None:
        from pyspark.sql.pandas.types import from_arrow_type

        cols = ", ".join(f"{quote(f.name)} {from_arrow_type(f.type).simpleString()}" for f in fields)
        self.spark.sql(f"ALTER TABLE delta.{quote(self.path)} ADD COLUMNS ({cols})")

    def read(self, rows: Rows, keys: pa.Table | None = None) -> pa.Table:
        read = self.rows(rows)
        if keys is not None:  # matched in Spark: only the keys' rows reach the driver
            read = read.join(self.spark.createDataFrame(keys), list(keys.column_names), "left_semi")
        return read.toArrow()

    def rows(self, rows: Rows) -> Any:
        """The table's ``rows`` as a DataFrame (the key range bound as typed literals)."""
        df = self._forpath().toDF()
        where = rows.spark()
        return df if where is None else df.where(where)

    def merge(self, source: pa.Table, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        return self.merge_frame(self.spark.createDataFrame(source), plan, app_id, version)

    def merge_frame(self, source_df: Any, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        """Run ``plan`` with the DataFrame ``source_df`` as one commit carrying ``(app_id, version)``."""
        from pyspark.sql import functions as F

        conf = self.spark.conf
        condition = F.expr(plan.predicate)
        in_range = plan.key_range.spark(plan.target_alias)  # typed literals: Delta prunes the target's files by them
        if in_range is not None:
            condition = condition & in_range
        merger = self._forpath().alias(plan.target_alias).merge(source_df.alias(plan.source_alias), condition)
        for clause in plan.clauses:
            if clause.kind == "update":
                merger = merger.whenMatchedUpdate(condition=clause.condition, set=dict(clause.assignments))
            elif clause.kind == "delete":
                merger = merger.whenMatchedDelete(condition=clause.condition)
            else:
                merger = merger.whenNotMatchedInsert(condition=clause.condition, values=dict(clause.assignments))
        conf.set("spark.databricks.delta.write.txnAppId", app_id)
        conf.set("spark.databricks.delta.write.txnVersion", str(version))
        try:
            merger.execute()
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")
        return {}

    def delete(self, predicate: str) -> None:
        self._forpath().delete(predicate)

    def compact(self) -> None:
        self._forpath().optimize().executeCompaction()
