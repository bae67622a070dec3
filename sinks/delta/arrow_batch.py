"""The Arrow preparer of :mod:`sinks.delta.commit`: a batch of change records as an Arrow table, prepared on
the driver (:mod:`sinks.delta.batch`) and staged by :mod:`sinks.delta.scd1` or :mod:`sinks.delta.scd2`, for
either engine (delta-spark merges the staged table as a DataFrame)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa

from cdc.errors import MalformedRecordError
from sinks.delta.backfill import late_keys
from sinks.delta.batch import after_last_truncate, check_ops, complete_key_changes, prepare
from sinks.delta.commit import Tables
from sinks.delta.engine import Engine
from sinks.delta.keyrange import KeyRange, Rows
from sinks.delta.merge import MergePlan
from sinks.delta.refresh import without_refreshes
from sinks.delta.scd1 import find_tie, is_tie_failure, stage_scd1
from sinks.delta.scd2 import current_rows, key_heads, main_source, stage_scd2, table_heads
from sinks.delta.sequence import with_sequence
from sinks.delta.spec import SinkSpec
from sinks.delta.state import conform, guard, heads_rows, key_change_source, of_keys, state_source


class ArrowBatch:
    """A batch of change records (an Arrow table) for :func:`sinks.delta.commit.apply`."""

    def __init__(self, spec: SinkSpec, tables: Tables[Engine], changes: pa.Table, now: datetime) -> None:
        self.spec, self.tables, self.changes, self.now = spec, tables, changes, now
        self.prepared: pa.Table | None = None
        self.refresh_at: int | None = None
        self.fresh: pa.Table | None = None  # SCD type 1: the guarded changes (stage_scd1 is the guard itself)

    def check(self) -> Any:
        spec = self.spec
        changes = with_sequence(spec.sequence_columns, self.changes)
        check_ops(spec, changes)  # before the truncate: a batch that fails changes nothing
        changes, self.refresh_at = without_refreshes(spec, changes)
        self.changes, at = after_last_truncate(changes, spec.sequence_by)
        return at

    def refreshed(self) -> int | None:
        return self.refresh_at

    def reduce(self) -> int:
        spec, tables, changes = self.spec, self.tables, self.changes
        if not tables.main_done:  # (the state's commit alone needs no values)
            changes = complete_key_changes(
                spec, changes, lambda keys: key_change_source(spec, tables.main, tables.state, keys), tables.path)
        self.prepared = prepare(spec, changes, self.now)
        return int(self.prepared.num_rows)

    def _prepared(self) -> pa.Table:
        assert self.prepared is not None, "reduce() comes first"
        return self.prepared

    def schema(self) -> pa.Schema:
        return self._prepared().schema

    def heads(self, table: pa.Schema) -> pa.Table:
        spec, prepared = self.spec, self._prepared()
        if self.tables.ordered:  # no heads: the MERGE compares (SCD type 2: the table's, see main_source)
            return prepared.select([*spec.keys, spec.sequence_by]).slice(0, 0)
        return conform(self.tables.state.read(heads_rows(spec, prepared)), prepared.schema)

    def main_source(self, heads: pa.Table, table: pa.Schema) -> pa.Table:
        spec, prepared, main, ordered = self.spec, self._prepared(), self.tables.main, self.tables.ordered
        if spec.scd_type == 1:
            self.fresh = stage_scd1(spec, prepared, heads, ordered=ordered)
            return self.fresh
        current = conform(main.read(current_rows(spec, prepared)), prepared.schema)
        if ordered:  # the heads are the table's; a change not newer than its head is stale: no back-fill
            heads = table_heads(spec, main, prepared, current)
            prepared = guard(spec, prepared, heads)
        late = late_keys(spec, prepared, heads)  # only keys with a late change read their history
        history = of_keys(main, Rows(KeyRange.of(spec.keys, late)), late) if late.num_rows else None
        return main_source(stage_scd2(spec, prepared, key_heads(spec, heads, current), history))

    def state_source(self, heads: pa.Table) -> pa.Table:
        fresh = guard(self.spec, self._prepared(), heads) if self.fresh is None else self.fresh
        return state_source(self.spec, fresh)

    def columns(self, source: pa.Table) -> list[str]:
        return list(source.column_names)

    def key_range(self, source: pa.Table) -> KeyRange:
        return KeyRange.of(self.spec.keys, source)

    def sequence_type(self, source: pa.Table) -> pa.DataType:
        return source.schema.field(self.spec.sequence_by).type

    def size(self, source: pa.Table) -> int:
        return int(source.num_rows)

    def merge_main(self, source: pa.Table, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        return self.tables.main.merge(source, plan, app_id, version)

    def merge_state(self, source: pa.Table, plan: MergePlan, app_id: str, version: int) -> None:
        self.tables.state.merge(source, plan, app_id, version)

    def tie(self, e: Exception, plan: MergePlan, source: pa.Table) -> MalformedRecordError | None:
        if plan.ties is None or not is_tie_failure(e):
            return None
        return find_tie(self.spec, plan, source, self.tables.main, self.tables.ordered)
