"""The delta-rs engine (``deltalake``): the default, and the one that runs on every machine.

The micro-batch is collected to the driver as Arrow (``batch_df.toArrow()``) and merged there by delta-rs.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Transaction
from deltalake.exceptions import TableNotFoundError

from sinks.delta.merge import MergePlan

log = logging.getLogger(__name__)


class DeltaRsEngine:
    name = "delta-rs"
    enforces_transactions = False

    def __init__(self, path: str, storage_options: dict[str, str] | None = None) -> None:
        self.path = path
        self.storage_options = storage_options
        self._table: DeltaTable | None = None

    def _dt(self) -> DeltaTable | None:
        if self._table is None:
            try:
                self._table = DeltaTable(self.path, storage_options=self.storage_options)
            except TableNotFoundError:
                return None
        else:
            self._table.update_incremental()
        return self._table

    def schema(self) -> pa.Schema | None:
        dt = self._dt()
        return None if dt is None else pa.schema(dt.schema().to_arrow())

    def committed_version(self, app_id: str) -> int | None:
        dt = self._dt()
        return None if dt is None else dt.transaction_version(app_id)

    def create(self, schema: pa.Schema) -> None:
        DeltaTable.create(self.path, schema, mode="ignore", storage_options=self.storage_options)
        self._table = None

    def add_columns(self, fields: list[pa.Field]) -> None:
        dt = self._dt()
        assert dt is not None
        dt.alter.add_columns([Field.from_arrow(f) for f in fields])

    def read(self, sql: str, expr: Any) -> pa.Table:
        dt = self._dt()
        assert dt is not None
        return dt.to_pyarrow_dataset().to_table(filter=expr)

    def merge(self, source: pa.Table, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        dt = self._dt()
        assert dt is not None
        before = dt.version()
        commit = CommitProperties(app_transactions=[Transaction(app_id, version)])
        merger = dt.merge(
            source,
            plan.predicate,
            source_alias=plan.source_alias,
            target_alias=plan.target_alias,
            commit_properties=commit,
        )
        for clause in plan.clauses:
            updates = dict(clause.assignments)
            if clause.kind == "update":
                merger = merger.when_matched_update(updates, clause.condition)
            elif clause.kind == "delete":
                merger = merger.when_matched_delete(clause.condition)
            else:
                merger = merger.when_not_matched_insert(updates, clause.condition)
        metrics = dict(merger.execute())
        dt.update_incremental()
        if dt.version() == before:
            # delta-rs makes no commit for a merge that changes nothing (every change stale); the batch must
            # still be recorded as done, so commit an empty transaction carrying (app_id, version).
            dt.create_write_transaction([], "append", dt.schema(), commit_properties=commit)
        return metrics

    def delete(self, predicate: str) -> None:
        dt = self._dt()
        assert dt is not None
        dt.delete(predicate)

    def compact(self) -> None:
        dt = self._dt()
        assert dt is not None
        metrics = dt.optimize.compact()
        log.info("compacted %s: %s files removed, %s added", self.path, metrics.get("numFilesRemoved"),
                 metrics.get("numFilesAdded"))
