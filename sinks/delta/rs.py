"""The delta-rs engine (``deltalake``): the default, and the one that runs on every machine.

The micro-batch is collected to the driver as Arrow (``batch_df.toArrow()``) and merged there by delta-rs.

Pruning (see :mod:`sinks.delta.keyrange`): a read selects the files whose statistics overlap the key range
from the table's log, then filters their rows in memory; a MERGE lets delta-rs derive each key column's
range from the source (``t.k BETWEEN min(s.k) AND max(s.k)``, typed values, no SQL text), which it does when
the source is not streamed (``streamed_exec=False``; the source is an in-memory Arrow table anyway).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Field, Transaction
from deltalake.exceptions import TableNotFoundError

from sinks.delta.keyrange import Rows
from sinks.delta.layout import IS_DELETE, SOURCE_ALIAS, TIE_MARK
from sinks.delta.merge import MergePlan

log = logging.getLogger(__name__)


class DeltaRsEngine:
    name = "delta-rs"
    enforces_transactions = False
    # DataFusion has no raise_error: a cast that cannot succeed (over a source column, so never folded at planning).
    tie_fail = f"CAST(concat('{TIE_MARK} ', CAST({SOURCE_ALIAS}.`{IS_DELETE}` AS VARCHAR)) AS BOOLEAN)"

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

    def create(self, schema: pa.Schema, properties: dict[str, str] | None = None) -> None:
        DeltaTable.create(self.path, schema, mode="ignore", storage_options=self.storage_options)
        self._table = None
        if properties:
            # delta-rs refuses keys outside its own table properties at creation; setting them is allowed.
            dt = self._dt()
            assert dt is not None
            dt.alter.set_table_properties(dict(properties), raise_if_not_exists=False)

    def properties(self) -> dict[str, str]:
        dt = self._dt()
        return {} if dt is None else {k: str(v) for k, v in dt.metadata().configuration.items() if v is not None}

    def add_columns(self, fields: list[pa.Field]) -> None:
        dt = self._dt()
        assert dt is not None
        dt.alter.add_columns([Field.from_arrow(f) for f in fields])

    def read(self, rows: Rows, keys: pa.Table | None = None) -> pa.Table:
        dt = self._dt()
        assert dt is not None
        dataset = dt.to_pyarrow_dataset()
        where = rows.arrow(dataset.schema)
        if where is None:
            return dataset.to_table()
        # The files are selected by the statistics in the log (the fragments' expressions, typed like the
        # dataset's schema) and read whole, and the rows filtered in memory: a filter pushed into the Parquet
        # scan would also meet the row groups' statistics, typed as the file was written (delta-rs writes
        # text as string_view), and Arrow has no kernel comparing the two (string vs string_view).
        try:
            files = list(dataset.get_fragments(filter=where))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            log.warning("reading %s unpruned: its file statistics cannot be compared with the key range (%s)",
                        self.path, e)
            files = list(dataset.get_fragments())
        table = ds.FileSystemDataset(files, dataset.schema, dataset.format, dataset.filesystem).to_table()
        try:
            return table.filter(where)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            log.warning("rows of %s read unfiltered (%s)", self.path, e)  # the sink joins them with the batch's keys
            return table

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
            # Not streamed: delta-rs then prunes the target by the source's range of each key column.
            streamed_exec=not plan.key_range.complete,
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
