"""One batch's commits to the sink's tables (:mod:`sinks.delta.layout`): the same steps whatever form the batch
comes in, each written once here.

A batch comes as an Arrow table (:meth:`DeltaUpsertSink.write`, and ``foreachBatch`` with delta-rs: prepared
on the driver by :class:`sinks.delta.arrow_batch.ArrowBatch`) or as a Spark DataFrame (``foreachBatch`` with
delta-spark: prepared on the executors by :class:`sinks.delta.frame.FrameBatch`). What differs between the
two is a :class:`Preparer`; the steps are :func:`open_tables` (which tables already hold the batch), then
:func:`apply`:

1. the batch's checks, and its last truncate, which empties the tables the batch has not committed to
   (:func:`truncate`), then its ``refresh`` (a re-snapshot's end: the main table's rows below its sequence
   deleted, :func:`sinks.delta.refresh.apply_refresh`);
2. the batch reduced to what the MERGEs apply (nothing left: no commit);
3. the main table created with the mode in its properties, or a table of the previous layout refused
   (:class:`~sinks.delta.layout.LegacyLayoutError`);
4. schema evolution: the batch's new columns (:func:`sinks.delta.schema.new_columns`; a type change fails
   here, before anything is written);
5. the key heads (safe mode: the state table's, which is created first; ordered mode: none, the MERGE
   compares, or SCD type 2 the table's current versions);
6. the main table's MERGE (:func:`sinks.delta.merge.merge_plan`), a conflicting tie named for the user;
7. the state table's MERGE (:func:`sinks.delta.merge.state_plan`).

Each commit carries the application transaction ``(app_id, batch id)``. The main table commits first, computed
from the state as it was before the batch, so after a crash between the two commits the replay recomputes and
commits the state alone. Maintenance follows when :func:`sinks.delta.maintenance.due` says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from cdc.errors import MalformedRecordError
from sinks.delta.engine import Engine
from sinks.delta.keyrange import KeyRange
from sinks.delta.layout import DELETED_AT, MODE_PROPERTY, ORDERED, SAFE, LegacyLayoutError, ModeMismatchError
from sinks.delta.merge import MergePlan, merge_plan, state_plan
from sinks.delta.refresh import apply_refresh
from sinks.delta.schema import new_columns, state_schema, table_schema
from sinks.delta.spec import SinkSpec

log = logging.getLogger(__name__)

E_co = TypeVar("E_co", bound=Engine, covariant=True)
E = TypeVar("E", bound=Engine)


@dataclass(frozen=True)
class Tables(Generic[E_co]):
    """The two tables of a sink (:mod:`sinks.delta.layout`), the batch's mode, and which tables already hold
    the batch (their application transaction's version is the batch id or later)."""

    path: str
    main: E_co
    state: E_co
    mode: str  # ordered: one MERGE into the main table, no state table (see DeltaUpsertSink's ``ordered``)
    main_done: bool
    state_done: bool

    @property
    def ordered(self) -> bool:
        return self.mode == ORDERED


@dataclass(frozen=True)
class Outcome:
    """What :func:`apply` did: ``applied`` (False: the batch held no changes and no truncate), ``merged`` (the
    MERGEs ran), ``created`` (the main table was created, with the batch's mode)."""

    applied: bool
    merged: bool = False
    created: bool = False


class Preparer(Protocol):
    """What differs between an Arrow batch and a DataFrame batch; :func:`apply` calls it in this order.

    A ``source`` is the preparer's own: an Arrow table or a DataFrame."""

    def check(self) -> Any:
        """Validate the batch; return the sequence of its last truncate (the batch keeps only the changes after
        it), or None when it has none."""

    def refreshed(self) -> int | None:
        """The sequence of the batch's ``refresh`` records (a re-snapshot's end, :mod:`sinks.delta.refresh`),
        which :meth:`check` took out of the batch; None when it has none."""

    def reduce(self) -> int:
        """Reduce the batch to what the MERGEs apply (key changes completed where the main table still needs
        their values); return its number of change records (0: nothing to apply; -1: not counted)."""

    def schema(self) -> pa.Schema:
        """The Arrow schema of the reduced batch (what the table's columns come from)."""

    def heads(self, table: pa.Schema) -> Any:
        """The key heads the MERGE sources are computed from (``table``: the main table's schema)."""

    def main_source(self, heads: Any, table: pa.Schema) -> Any:
        """The main table's MERGE source (``table``: its schema, with the batch's new columns)."""

    def state_source(self, heads: Any) -> Any:
        """The state table's MERGE source: each touched key's new head."""

    def columns(self, source: Any) -> list[str]:
        """The columns of a source."""

    def key_range(self, source: Any) -> KeyRange:
        """The key range a MERGE of ``source`` is restricted to."""

    def sequence_type(self, source: Any) -> pa.DataType:
        """The sequence column's type in ``source``."""

    def size(self, source: Any) -> Any:
        """How many change records the main MERGE applied (for the log)."""

    def merge_main(self, source: Any, plan: MergePlan, app_id: str, version: int) -> dict[str, Any]:
        """The main table's MERGE, one commit carrying ``(app_id, version)``."""

    def merge_state(self, source: Any, plan: MergePlan, app_id: str, version: int) -> None:
        """The state table's MERGE, one commit carrying ``(app_id, version)``."""

    def tie(self, e: Exception, plan: MergePlan, source: Any) -> MalformedRecordError | None:
        """The error naming the conflicting tie that failed the main MERGE with ``e``; None when ``e`` is not
        one."""


def resolve_mode(path: str, recorded: str | None, claim: str | None) -> str:
    """The mode a batch runs in: the table's (``recorded``), which must be the claimed one; a new table's is the
    claim (safe when there is none)."""
    if recorded is None:
        return claim or SAFE
    if claim is not None and claim != recorded:
        raise ModeMismatchError(
            f"{path} was created in {recorded} mode (table property {MODE_PROPERTY}={recorded}) and this query asks "
            f"for {claim} mode; nothing was written. Set ordered={recorded == ORDERED} on the sink to keep the "
            f"table's mode, switch the table with sink.migrate(mode={claim!r}) while the query is stopped, or write to "
            "a new table (switching modes silently would let a stale change through)"
        )
    return recorded


def committed(main: Engine, state: Engine, mode: str | None, app_id: str) -> int | None:
    """The last batch committed to both tables under ``app_id`` (None: none, or unknown); ``mode``: the table's
    (ordered mode has no state table)."""
    done = main.committed_version(app_id)
    if mode == ORDERED:
        return done
    state_done = state.committed_version(app_id)
    return None if done is None or state_done is None else min(done, state_done)


def open_tables(path: str, main: E, state: E, mode: str, app_id: str, batch_id: int) -> Tables[E] | None:
    """The tables and which of them hold batch ``batch_id`` under ``app_id`` already; None when both do (a
    replay: nothing to do). Ordered mode has no state table."""
    main_done = main.committed_version(app_id)
    state_done = batch_id if mode == ORDERED else state.committed_version(app_id)
    tables = Tables(path, main, state, mode, main_done is not None and main_done >= batch_id,
                    state_done is not None and state_done >= batch_id)
    if tables.main_done and tables.state_done:
        log.info("batch %d already committed to %s by %s; skipping the replay", batch_id, path, app_id)
        return None
    return tables


def truncate(tables: Tables[Engine], at: Any, batch_id: int, sequence_by: str) -> None:
    """Empty the tables the batch has not yet committed to (one commit each), for its truncate at sequence
    ``at``: a replay after a crash between the batch's commits never removes the rows the batch itself merged."""
    for engine, done in ((tables.main, tables.main_done), (tables.state, tables.state_done)):
        if not done and engine.schema() is not None:
            engine.delete("true")
    log.info("batch %d: a truncate (%s %s) emptied %s", batch_id, sequence_by, at, tables.path)


def apply(spec: SinkSpec, tables: Tables[Engine], batch: Preparer, batch_id: int, app_id: str) -> Outcome:
    """Apply one prepared batch to the tables that do not hold it yet (see the module docstring)."""
    at = batch.check()
    if at is not None:
        truncate(tables, at, batch_id, spec.sequence_by)
    refreshed = batch.refreshed()
    apply_refresh(spec, tables.main, refreshed, tables.main_done, batch_id, tables.path)
    if batch.reduce() == 0:
        # (A batch that ends with a truncate or a refresh records no transaction: replaying it deletes the same
        # rows again, which is what it did; a later batch's commit makes it "already committed".)
        log.debug("batch %d has no changes%s", batch_id, " after its truncate" if at is not None else "")
        return Outcome(applied=at is not None or refreshed is not None)
    main, state = tables.main, tables.state
    prepared = batch.schema()
    schema = main.schema()
    created = schema is None
    if schema is None:
        main.create(table_schema(spec, prepared), {MODE_PROPERTY: tables.mode})
        schema = main.schema()
        assert schema is not None
    elif DELETED_AT in schema.names:
        raise LegacyLayoutError(
            f"{tables.path} was written by the previous layout of DeltaUpsertSink (tombstones in the table, "
            f"column {DELETED_AT}); nothing was written. Run sink.migrate() once with this sink's options (it "
            "moves the tombstones and sequences to the state table and rewrites the table without them, one "
            "commit each), then restart the query"
        )
    added = new_columns(spec, schema, prepared)  # a type change fails here, before any read or write
    if not tables.ordered and state.schema() is None:
        state.create(state_schema(spec, prepared))
    heads = batch.heads(schema)
    if not tables.main_done:
        # The main table first, computed from the state before the batch: a crash before the state's
        # commit leaves that state as it was, so the replay recomputes the state's commit alone.
        if added:
            log.info("adding columns %s to %s", [f.name for f in added], tables.path)
            main.add_columns(added)
            schema = pa.schema([*schema, *added])
        source = batch.main_source(heads, schema)
        plan = merge_plan(spec, batch.columns(source), schema, batch.key_range(source), ordered=tables.ordered,
                          tie_fail=main.tie_fail, sequence_type=batch.sequence_type(source))
        try:
            metrics = batch.merge_main(source, plan, app_id, batch_id)
        except Exception as e:
            tie = batch.tie(e, plan, source)
            if tie is None:
                raise
            raise tie from e
        log.info("batch %d: merged %s changes into %s: %s", batch_id, batch.size(source), tables.path, metrics)
    if not tables.state_done:
        source = batch.state_source(heads)
        batch.merge_state(source, state_plan(spec, batch.key_range(source)), app_id, batch_id)
    return Outcome(applied=True, merged=True, created=created)
