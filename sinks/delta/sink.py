"""``DeltaUpsertSink``: applies change records to a Delta table, exactly once per micro-batch."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc.errors import OptionError
from cdc.model import CHANNEL, POSITION
from sinks.delta.backfill import late_keys
from sinks.delta.batch import after_last_truncate, check_ops, complete_key_changes, prepare
from sinks.delta.engine import Engine
from sinks.delta.keyrange import KeyRange, Rows
from sinks.delta.layout import (
    DEFAULT_DELETE_CONDITION,
    DELETED_AT,
    IS_DELETE,
    IS_TRUNCATE,
    MODE_PROPERTY,
    ORDERED,
    SAFE,
    LegacyLayoutError,
    ModeMismatchError,
    state_path,
)
from sinks.delta.merge import merge_plan, state_plan
from sinks.delta.migration import run_migration
from sinks.delta.refresh import apply_refresh, without_refreshes
from sinks.delta.scd1 import merge_naming_ties, purge_predicate, stage_scd1
from sinks.delta.scd2 import current_rows, key_heads, main_source, stage_scd2, table_heads
from sinks.delta.schema import new_columns, state_schema, table_schema
from sinks.delta.sequence import with_sequence, with_sequence_frame
from sinks.delta.session import collect_arrow, connect_query_id, is_connect
from sinks.delta.spec import SinkSpec
from sinks.delta.staging import StagingLog
from sinks.delta.state import conform, guard, heads_rows, key_change_source, of_keys, state_source

if TYPE_CHECKING:
    from pyspark.sql import Column

log = logging.getLogger(__name__)

ENGINES = ("auto", "delta-rs", "delta-spark")


class DeltaUpsertSink:
    """Apply a stream of change records to a Delta table, in the spirit of Databricks AUTO CDC.

    Use it as a ``foreachBatch`` function::

        from sinks.delta import DeltaUpsertSink
        sink = DeltaUpsertSink("/lake/orders", keys=["order_id"], sequence_by="_seq")
        changes.writeStream.foreachBatch(sink).option("checkpointLocation", ck).start()

    Parameters
    ----------
    path : the Delta table (created on the first batch): a plain Delta table of live rows; the sink's own
        state (sequences, tombstones, SCD2 key heads) is the Delta table ``<path>/_cdc_state``.
    keys : the key column(s).
    sequence_by : the column that orders a key's changes (``_seq``: the change model's sequence): an integer or
        timestamp column, a struct column of such fields, or a list of such columns. A struct or a list is
        compared lexicographically in the order given: the first column decides, the next breaks its ties, and
        so on. A list becomes the struct column ``_sequence`` (kept in the table as the sequence column, and in
        SCD type 2's ``_valid_from``/``_valid_to``); its columns are kept as they are. A null sequence, or two
        changes of one key with the same sequence and different values (in one batch, or one the table
        applied), fail the batch naming the column and the key; identical changes (a redelivery) count as one. Key changes (``_old_key``) need a
        single sequence column.
    apply_as_deletes : SQL condition over a change record marking it a delete (default ``_op = 'delete'``).
    apply_as_truncates : SQL condition (text, or a pyspark ``Column``) over a change record marking it a
        truncate: the table empties at that change's place in the batch (the batch's changes sequenced
        before it are dropped, those after it applied). SCD type 1 only. Records with ``_op = 'truncate'``
        are truncates whatever this option says.
    ignore_null_updates : a null in a change that is not a delete leaves the stored value of the column (a
        key with no row gets the null); deletes are unaffected. For every value column.
    ignore_null_updates_column_list : ``ignore_null_updates`` for the listed columns only.
    ignore_null_updates_except_column_list : ``ignore_null_updates`` for every value column but the listed
        ones.
    column_list : the value columns the table keeps (keys and ``sequence_by`` always); default all.
    except_column_list : value columns of the changes the table does not keep.
    except_columns : the former name of ``except_column_list`` (deprecated).
    scd_type : 1 (keep the latest row; default) or 2 (keep history rows with ``_valid_from``/``_valid_to``/
        ``_is_current``).
    track_history_column_list : SCD type 2 only: a change to these columns opens a version; a change to
        other columns only updates the version before it in place. Default: every value column.
    track_history_except_column_list : SCD type 2 only: every value column but these opens a version.
    track_history_columns : the former name of ``track_history_column_list`` (deprecated).
    tombstone_retention : how long a delete's tombstone keeps older changes of the key from resurrecting it.
    prune_by_key_range : restrict each MERGE and each read of the tables to the batch's range of every key
        column, so files whose statistics lie outside it are skipped. Default (None): wherever the range costs
        no Spark job of its own, i.e. everywhere but ordered mode on delta-spark; True there too (one small
        job per batch, which pays when keys arrive clustered into a table of many files); False: nowhere.
    compact_every : every this many batches (by batch id), purge expired tombstones and compact small files;
        None disables both.
    app_id : the Delta application-transaction id; default ``cdc-tunnel-<streaming query id>``, which stays
        the same across restarts of the query from its checkpoint.
    bookkeeping_columns : which bookkeeping columns the table shows, any of ``sequence`` (``sequence_by``),
        ``commit_ts`` (``_commit_ts``) and, SCD type 2, ``is_current`` (``_is_current``); default all. A
        hidden column is not stored in the table (the state table keeps what the sink needs); it applies
        when the table is created.
    engine : ``auto`` (default), ``delta-rs`` or ``delta-spark``. ``auto`` picks by where the query runs (see
        :func:`sinks.delta.session.default_engine`): delta-rs under ``local[...]``, delta-spark on a cluster
        when the io.delta jars are on the session (and not ``pipelined``).
    storage_options : passed to delta-rs (object store credentials).
    pipelined : return from ``foreachBatch`` once the batch is durably staged (``staging_dir``), and merge it
        in the background while Spark prepares the next batch (at most one merge in flight). Exactly-once is
        kept: a staged batch whose commit a crash prevented is merged when the sink next starts, before any new
        batch. When the merges fall behind, the batches staged meanwhile are merged together, in one MERGE
        and one commit (at most ``MAX_COALESCED`` batches). The table lags the query by at most one merge in
        flight plus the batches staged meanwhile until :meth:`flush` (or process exit).
    staging_dir : where pipelined mode stages batches (default ``<path>/_cdc_staging``; hidden from Delta).
    ordered : the mode (recorded in the table's properties when the sink creates the table; a query claiming
        the other mode fails naming both). True: **ordered mode**, for changes that reach the query in each
        key's sequence order: a batch is one MERGE into the table, no state table; where the table keeps
        ``sequence_by``, a stale change is still never applied to a live row, but a change older than a delete
        arriving after it would bring the key back. False: **safe mode**, for any source: the state table keeps
        every key's last sequence and its tombstones, so no late change is applied, at the price of a second
        MERGE per batch. None (default): ordered when the batch comes straight from one ``format("cdc")``
        source whose backend orders every key's changes (its ``_seq`` carries that mark and the batch's plan
        reads one source: a union or a join of two streams does not qualify), else safe; SCD type 2 takes
        safe mode unless ``ordered=True`` (ordered, its key heads are the table's current versions, a
        deleted key's its last closed version, and a change not newer than its head is stale: no back-fill).
    clock : returns the current UTC time (tombstone ages); for tests.
    """

    def __init__(
        self,
        path: str,
        keys: Sequence[str],
        sequence_by: str | Sequence[str] = "_seq",
        *,
        apply_as_deletes: str = DEFAULT_DELETE_CONDITION,
        scd_type: int = 1,
        track_history_column_list: Sequence[str] | None = None,
        track_history_except_column_list: Sequence[str] | None = None,
        track_history_columns: Sequence[str] | None = None,
        apply_as_truncates: str | Column | None = None,
        ignore_null_updates: bool = False,
        ignore_null_updates_column_list: Sequence[str] | None = None,
        ignore_null_updates_except_column_list: Sequence[str] | None = None,
        column_list: Sequence[str] | None = None,
        except_column_list: Sequence[str] | None = None,
        except_columns: Sequence[str] | None = None,
        tombstone_retention: timedelta = timedelta(days=2),
        compact_every: int | None = 10,
        prune_by_key_range: bool | None = None,
        bookkeeping_columns: Sequence[str] | None = None,
        app_id: str | None = None,
        engine: str = "auto",
        storage_options: dict[str, str] | None = None,
        pipelined: bool = False,
        staging_dir: str | None = None,
        ordered: bool | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.path = str(path)
        if except_columns is not None:
            if except_column_list is not None:
                raise OptionError("options 'except_columns' and 'except_column_list' were both given; give "
                                  "'except_column_list' (the former's new name)", "except_columns")
            warnings.warn("option 'except_columns' is deprecated; use 'except_column_list' (the same meaning)",
                          DeprecationWarning, stacklevel=2)
            except_column_list = except_columns
        if track_history_columns is not None:
            if track_history_column_list is not None:
                raise OptionError("options 'track_history_columns' and 'track_history_column_list' were both "
                                  "given; give 'track_history_column_list' (the former's new name)",
                                  "track_history_columns")
            warnings.warn("option 'track_history_columns' is deprecated; use 'track_history_column_list' (the same "
                          "meaning)", DeprecationWarning, stacklevel=2)
            track_history_column_list = track_history_columns
        #: apply_as_truncates as given (text or a Column), evaluated by Spark in the foreachBatch wrapper
        self.truncate_condition = apply_as_truncates
        try:
            self.spec = SinkSpec(
                keys=tuple([keys] if isinstance(keys, str) else keys),
                sequence_by=sequence_by,  # type: ignore[arg-type]  # (a list: normalised by SinkSpec)
                apply_as_deletes=apply_as_deletes,
                scd_type=scd_type,
                track_history_columns=track_history_column_list,  # type: ignore[arg-type]
                track_history_except_column_list=track_history_except_column_list,  # type: ignore[arg-type]
                except_column_list=() if except_column_list is None else except_column_list,  # type: ignore[arg-type]
                column_list=None if column_list is None else column_list,  # type: ignore[arg-type]
                ignore_null_updates=ignore_null_updates,
                ignore_null_updates_column_list=ignore_null_updates_column_list,  # type: ignore[arg-type]
                ignore_null_updates_except_column_list=ignore_null_updates_except_column_list,  # type: ignore[arg-type]
                apply_as_truncates=_condition_text(apply_as_truncates),
                tombstone_retention=tombstone_retention,
                prune_by_key_range=prune_by_key_range,
                bookkeeping_columns=None if bookkeeping_columns is None else tuple(bookkeeping_columns),
            )
        except OptionError as e:  # named as the user gave it
            if except_columns is None or e.option != "except_column_list":
                raise
            raise OptionError(str(e).replace("'except_column_list'", "'except_columns' (now 'except_column_list')"),
                              "except_columns") from None
        if compact_every is not None and compact_every < 1:
            raise OptionError("option 'compact_every' must be a positive number of batches, or None", "compact_every")
        if engine not in ENGINES:
            raise OptionError(f"option 'engine': {engine!r} is not accepted; accepted: {', '.join(ENGINES)}", "engine")
        self.compact_every = compact_every
        self.ordered = ordered
        self._mode: str | None = None  # the table's recorded mode, once the table exists
        self._claimed: str | None = None
        self.app_id = app_id
        self.engine_name = engine
        self.storage_options = storage_options
        self.clock = clock or (lambda: datetime.now(UTC))
        self._engine: Engine | None = None
        self._state_engine: Engine | None = None
        self.pipelined = pipelined
        if pipelined and staging_dir is None and "://" in self.path:
            raise OptionError(
                "option 'staging_dir' is required with pipelined=True when the table is not on a local path", "staging_dir"
            )
        if pipelined and engine == "delta-spark":
            raise OptionError(
                "option 'pipelined' applies to engine='delta-rs' (delta-spark merges the batch inside Spark, "
                "with nothing to overlap on the driver); accepted with delta-spark: pipelined=False", "pipelined"
            )
        self.staging_dir = staging_dir or os.path.join(self.path, "_cdc_staging")
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future[None] | None = None
        self._lock = threading.Lock()
        self._waiting: list[tuple[int, pa.Table]] = []  # staged, not yet merged (pipelined mode)
        self._draining = False  # a background merge is running and will take what _waiting holds
        self._submitted = -1
        self._recovered: set[str] = set()

    def __repr__(self) -> str:  # storage_options may hold credentials: never shown
        return f"DeltaUpsertSink({self.path!r}, keys={list(self.spec.keys)}, scd_type={self.spec.scd_type}, engine={self.engine_name!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_engine=None, _state_engine=None, _executor=None, _inflight=None, _waiting=[], _draining=False)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ engines
    def engine(self, spark: Any = None) -> Engine:
        """The engine on the main table."""
        if self._engine is None:
            self._engine = self._new_engine(self.path, spark)
        return self._engine

    def state_engine(self, spark: Any = None) -> Engine:
        """The engine on the state table (see :mod:`sinks.delta.layout`)."""
        if self._state_engine is None:
            self._state_engine = self._new_engine(state_path(self.path), spark)
        return self._state_engine

    def _new_engine(self, path: str, spark: Any) -> Engine:
        if self.engine_name == "auto":
            from sinks.delta.session import default_engine

            self.engine_name = default_engine(spark, pipelined=self.pipelined)
        if self.engine_name == "delta-rs":
            from sinks.delta.rs import DeltaRsEngine

            return DeltaRsEngine(path, self.storage_options)
        from sinks.delta.spark import DeltaSparkEngine

        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
        return DeltaSparkEngine(spark, path)

    def _committed(self, app_id: str) -> int | None:
        """The last batch committed to both tables under ``app_id`` (None: none, or unknown)."""
        main = self.engine().committed_version(app_id)
        if self.table_mode() == ORDERED:
            return main
        state = self.state_engine().committed_version(app_id)
        return None if main is None or state is None else min(main, state)

    # ------------------------------------------------------------------ modes
    def table_mode(self) -> str | None:
        """The mode recorded in the table's properties (``safe`` for a table written before modes existed);
        None while no table exists."""
        if self._mode is None and self.engine().schema() is not None:
            self._mode = self.engine().properties().get(MODE_PROPERTY, SAFE)
        return self._mode

    def claim(self, batch_df: Any = None) -> str | None:
        """The mode this sink asks for: ``ordered`` option, else the source's mark on ``batch_df`` (see
        :func:`sinks.delta.session.ordered_source`); None: no claim (a table's own mode applies)."""
        if self.ordered is not None:
            return ORDERED if self.ordered else SAFE
        if batch_df is None:
            return None
        if self.spec.scd_type == 2:
            return SAFE
        from sinks.delta.session import ordered_source

        return ORDERED if ordered_source(batch_df, self.spec.sequence_by) else SAFE

    def _resolve(self, claim: str | None) -> str:
        """The mode a batch runs in: the table's, which must be the claimed one; a new table's is the claim."""
        mode = self.table_mode()
        if mode is None:
            return claim or SAFE
        if claim is not None and claim != mode:
            raise ModeMismatchError(
                f"{self.path} was created in {mode} mode (table property {MODE_PROPERTY}={mode}) and this query "
                f"asks for {claim} mode; nothing was written. Set ordered={mode == ORDERED} on the sink to keep the "
                f"table's mode, or write to a new table (switching modes silently would let a stale change through)"
            )
        return mode

    # ------------------------------------------------------------------ foreachBatch
    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` entry point: evaluate the delete condition, collect the batch as Arrow, apply."""
        spark = batch_df.sparkSession
        app_id = self.app_id or self._query_app_id(spark)
        self.engine(spark)
        self.state_engine(spark)
        if self.pipelined:
            self._recover(app_id)
            if batch_id <= self._submitted:
                log.info("batch %d is already staged for %s; skipping the replay", batch_id, self.path)
                return
        # (With a merge in flight the table is not read here: Spark replays batches only after a restart,
        # and a restart starts with nothing in flight.)
        done = None if self._inflight is not None else self._committed(app_id)
        if done is not None and done >= batch_id:
            log.info("batch %d already committed to %s by %s (up to %d); skipping the replay", batch_id, self.path, app_id, done)
            return
        if self.spec.apply_as_deletes.strip() != DEFAULT_DELETE_CONDITION:
            from pyspark.sql import functions as F

            batch_df = batch_df.withColumn(IS_DELETE, F.coalesce(F.expr(self.spec.apply_as_deletes), F.lit(False)))
        if self.truncate_condition is not None:
            from pyspark.sql import Column
            from pyspark.sql import functions as F

            condition = self.truncate_condition
            condition = condition if isinstance(condition, Column) else F.expr(condition)
            batch_df = batch_df.withColumn(IS_TRUNCATE, F.coalesce(condition, F.lit(False)))
        if self.spec.sequence_columns:
            batch_df = with_sequence_frame(self.spec.sequence_columns, batch_df)
        self.spec.check_lists(batch_df.columns)
        # Columns the table does not keep are dropped before the collect: fewer columns to convert.
        unused = [c for c in batch_df.columns if c in (CHANNEL, POSITION)] + self.spec.excluded(batch_df.columns)
        if unused:
            batch_df = batch_df.drop(*unused)
        claim = self.claim(batch_df)
        if self.engine_name == "delta-spark":
            self.write_frame(batch_df, batch_id, app_id, claim=claim)
            return
        self._resolve(claim)  # a mismatch fails before the batch is collected or staged
        self._claimed = claim  # (the background merge's claim, pipelined)
        started = time.perf_counter()
        changes = collect_arrow(batch_df)
        collected = time.perf_counter()
        if self.pipelined:
            self._stage_and_submit(changes, batch_id, app_id)
            log.info(
                "batch %d: %d change records collected in %.3f s, staged; merge submitted after %.3f s",
                batch_id, changes.num_rows, collected - started, time.perf_counter() - collected,
            )
            return
        self._apply(changes, batch_id, batch_id, app_id, claim)
        log.info(
            "batch %d: %d change records collected in %.3f s, applied in %.3f s",
            batch_id, changes.num_rows, collected - started, time.perf_counter() - collected,
        )

    # ------------------------------------------------------------------ pipelined mode
    def _recover(self, app_id: str) -> None:
        """Once per process and app id: merge batches a crash left staged but not committed, in order."""
        if app_id in self._recovered:
            return
        staging = StagingLog(self.staging_dir, app_id)
        for batch_id in staging.pending():
            log.warning("merging batch %d of %s left staged by an earlier run", batch_id, app_id)
            # (Staged by __call__: checked, excluded columns dropped, apply_as_truncates evaluated.)
            self._apply(staging.get(batch_id), batch_id, batch_id, app_id, self.claim())
            staging.remove(batch_id)
            self._submitted = max(self._submitted, batch_id)
        self._recovered.add(app_id)

    def _stage_and_submit(self, changes: pa.Table, batch_id: int, app_id: str) -> None:
        """Stage the batch durably, then hand it to the background merge.

        When a merge is still running, the batch waits and the running merge takes every waiting batch in one
        MERGE after its own: a MERGE's cost is mostly the target files it rewrites, which does not grow with
        the number of changes, so when the merges fall behind, merging the waiting batches together catches
        up instead of queueing (measured on the benchmark's 1M-row table: ~0.6x the time per change for two
        batches, ~0.45x for three). Commits stay in batch order, at most one merge runs at a time, and at
        most ``MAX_COALESCED`` batches wait (then ``foreachBatch`` waits for the merge)."""
        if self._inflight is not None and self._inflight.done():
            self.flush()  # surfaces the previous merge's failure before this batch is accepted
        check_ops(self.spec, changes)  # refused before it is staged (a staged batch is merged on every restart)
        staging = StagingLog(self.staging_dir, app_id)
        staging.put(batch_id, changes)  # durable before Spark may record the batch as done
        with self._lock:
            self._waiting.append((batch_id, changes))
            start, self._draining = not self._draining, True
            full = len(self._waiting) >= MAX_COALESCED
        self._submitted = batch_id
        if start:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-sink-merge")
            self._inflight = self._executor.submit(self._drain, staging, app_id)
        elif full:
            self.flush()

    def _drain(self, staging: StagingLog, app_id: str) -> None:
        """The background merge: merge what waits, in batch order, until nothing does."""
        try:
            while True:
                with self._lock:
                    group, self._waiting = self._waiting, []
                    if not group:
                        self._draining = False
                        return
                for run in _same_schema_runs(group):
                    tables = [t for _, t in run]
                    changes = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
                    if len(run) > 1:
                        log.info("batches %d-%d merged together (%d change records): the merges fell behind",
                                 run[0][0], run[-1][0], changes.num_rows)
                    self._apply(changes, run[0][0], run[-1][0], app_id, self._claimed)
                    for batch_id, _ in run:
                        staging.remove(batch_id)
        except BaseException:
            # What waited stays staged, and recovery merges it before the next batch. _draining stays set, so
            # no later batch starts a merge (and commits past the failed one) before flush() reports this.
            with self._lock:
                self._waiting = []
            raise

    def flush(self) -> None:
        """Wait for the background merge (pipelined mode) of every staged batch; re-raise its failure."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            try:
                inflight.result()
            except BaseException:
                # The failed batches stay staged: recover them (and any later one) before the next batch.
                with self._lock:
                    self._waiting, self._draining = [], False
                self._recovered.clear()
                self._submitted = -1
                raise

    @staticmethod
    def _query_app_id(spark: Any) -> str:
        qid = connect_query_id(spark) if is_connect(spark) else spark.sparkContext.getLocalProperty(
            "sql.streaming.queryId")
        if not qid:
            raise OptionError(
                "option 'app_id' is required outside a streaming query (no streaming query id to derive it from)",
                "app_id",
            )
        return f"cdc-tunnel-{qid}"

    # ------------------------------------------------------------------ the core (Arrow in, one commit out)
    def write(self, changes: pa.Table, batch_id: int, app_id: str | None = None) -> bool:
        """Apply one batch of change records; return False when the batch was already committed (a replay).

        ``changes`` holds change records (see :mod:`cdc.model`); a custom ``apply_as_deletes`` requires the
        boolean column ``__cdc_is_delete`` (the ``foreachBatch`` wrapper adds it).
        """
        app = app_id or self.app_id
        if not app:
            raise OptionError("option 'app_id' is required to write a batch outside a streaming query", "app_id")
        if batch_id < 0:
            raise ValueError(f"batch id must be >= 0, got {batch_id}")
        self.spec.check_lists(changes.column_names)
        if self.spec.apply_as_truncates is not None and IS_TRUNCATE not in changes.column_names:
            raise OptionError(
                f"option 'apply_as_truncates' ({self.spec.apply_as_truncates!r}) is a SQL condition evaluated by "
                f"Spark in the foreachBatch wrapper; a batch applied directly must carry the boolean column "
                f"{IS_TRUNCATE!r}", "apply_as_truncates")
        return self._apply(changes, batch_id, batch_id, app, self.claim())

    def _apply(self, changes: pa.Table, first: int, batch_id: int, app: str, claim: str | None = None) -> bool:
        """:meth:`write` of the batches ``first`` to ``batch_id`` together (their change records concatenated):
        one commit per table, recorded as batch ``batch_id``, which marks the earlier ones done too."""
        main, state = self.engine(), self.state_engine()
        ordered = (mode := self._resolve(claim)) == ORDERED
        main_done = main.committed_version(app)
        state_done = batch_id if ordered else state.committed_version(app)  # ordered: no state table
        if main_done is not None and main_done >= batch_id and state_done is not None and state_done >= batch_id:
            log.info("batch %d already committed to %s by %s; skipping the replay", batch_id, self.path, app)
            return False
        now = self.clock()
        spec = self.spec
        changes = with_sequence(spec.sequence_columns, changes)
        check_ops(spec, changes)  # before the truncate: a batch that fails changes nothing
        changes, refreshed = without_refreshes(spec, changes)
        changes, truncated = after_last_truncate(changes, spec.sequence_by)
        if truncated is not None:
            self._truncate(batch_id, truncated, main_done, state_done)
        apply_refresh(spec, main, refreshed, main_done is not None and main_done >= batch_id, batch_id, self.path)
        if main_done is None or main_done < batch_id:  # (the state's commit alone needs no values)
            changes = complete_key_changes(
                spec, changes, lambda keys: key_change_source(spec, main, state, keys), self.path)
        prepared = prepare(spec, changes, now)
        if prepared.num_rows == 0:
            # (A batch that ends with a truncate records no transaction: replaying it empties the tables again,
            # which is what it did; a later batch's commit makes it "already committed".)
            log.debug("batch %d has no changes%s", batch_id, " after its truncate" if truncated is not None else "")
            return truncated is not None or refreshed is not None
        schema = main.schema()
        if schema is None:
            main.create(table_schema(spec, prepared.schema), {MODE_PROPERTY: mode})
            self._mode = mode
            schema = main.schema()
            assert schema is not None
        elif DELETED_AT in schema.names:
            raise LegacyLayoutError(
                f"{self.path} was written by the previous layout of DeltaUpsertSink (tombstones in the table, "
                f"column {DELETED_AT}); nothing was written. Run sink.migrate() once with this sink's options (it "
                "moves the tombstones and sequences to the state table and rewrites the table without them, one "
                "commit each), then restart the query"
            )
        added = new_columns(spec, schema, prepared.schema)  # a type change fails here, before any read or write
        if ordered:
            heads = prepared.select([*spec.keys, spec.sequence_by]).slice(0, 0)  # no heads: the MERGE compares
        else:
            if state.schema() is None:
                state.create(state_schema(spec, prepared.schema))
            heads = conform(state.read(heads_rows(spec, prepared)), prepared.schema)
        fresh: pa.Table | None = None  # the guarded changes, computed once (stage_scd1 is the guard itself)
        if main_done is None or main_done < batch_id:
            # The main table first, computed from the state before the batch: a crash before the state's
            # commit leaves that state as it was, so the replay recomputes the state's commit alone.
            if added:
                log.info("adding columns %s to %s", [f.name for f in added], self.path)
                main.add_columns(added)
                schema = pa.schema([*schema, *added])
            if spec.scd_type == 1:
                source = fresh = stage_scd1(spec, prepared, heads, ordered=ordered)
            else:
                current = conform(main.read(current_rows(spec, prepared)), prepared.schema)
                if ordered:  # the heads are the table's; a change not newer than its head is stale: no back-fill
                    heads = table_heads(spec, main, prepared, current)
                    prepared = guard(spec, prepared, heads)
                late = late_keys(spec, prepared, heads)  # only keys with a late change read their history
                history = of_keys(main, Rows(KeyRange.of(spec.keys, late)), late) if late.num_rows else None
                source = main_source(stage_scd2(spec, prepared, key_heads(spec, heads, current), history))
            plan = merge_plan(spec, source.column_names, schema, KeyRange.of(spec.keys, source), ordered=ordered,
                              tie_fail=main.tie_fail, sequence_type=source.schema.field(spec.sequence_by).type)
            metrics = merge_naming_ties(spec, main, source, plan, app, batch_id, ordered)
            log.info("batch %d: merged %d changes into %s: %s", batch_id, source.num_rows, self.path, metrics)
        if state_done is None or state_done < batch_id:
            heads_after = state_source(spec, guard(spec, prepared, heads) if fresh is None else fresh)
            state.merge(heads_after, state_plan(spec, KeyRange.of(spec.keys, heads_after)), app, batch_id)
        if self.compact_every and (batch_id + 1) // self.compact_every > first // self.compact_every:
            self.maintain(now)  # one of the batches first..batch_id is a multiple of compact_every
        return True

    def _truncate(self, batch_id: int, at: Any, main_done: int | None, state_done: int | None) -> None:
        """Empty the table and the state table (one commit each) for a truncate in batch ``batch_id``.

        Only a table the batch has not yet committed to is emptied, so a replay after a crash between the
        batch's commits never removes the rows the batch itself merged."""
        main, state = self.engine(), self.state_engine()
        for engine, done in ((main, main_done), (state, state_done)):
            if engine.schema() is not None and (done is None or done < batch_id):
                engine.delete("true")
        log.info("batch %d: a truncate (%s %s) emptied %s", batch_id, self.spec.sequence_by, at, self.path)

    def migrate(self, mode: str | None = None) -> bool:
        """With the query stopped: ``mode=None`` converts a table of the previous layout; ``"ordered"`` or ``"safe"``
        switches the table's mode (:func:`sinks.delta.migration.migrate_mode`). False when there was nothing to do."""
        self._mode, self._engine, self._state_engine = None, None, None  # (read the table again afterwards)
        return run_migration(self.path, self.spec, mode, self.storage_options, self.clock())

    def write_frame(self, batch_df: Any, batch_id: int, app_id: str | None = None, *, claim: str | None = None) -> bool:
        """:meth:`write` for a DataFrame with ``engine='delta-spark'``: prepared, staged and merged inside Spark
        (:mod:`sinks.delta.frame`), never collected to the driver."""
        from sinks.delta.frame import Target, write_frame
        from sinks.delta.spark import DeltaSparkEngine

        app = app_id or self.app_id
        if not app:
            raise OptionError("option 'app_id' is required to write a batch outside a streaming query", "app_id")
        main, state = self.engine(batch_df.sparkSession), self.state_engine(batch_df.sparkSession)
        assert isinstance(main, DeltaSparkEngine) and isinstance(state, DeltaSparkEngine)
        if self.spec.sequence_columns:
            batch_df = with_sequence_frame(self.spec.sequence_columns, batch_df)
        mode = self._resolve(claim if claim is not None else self.claim(batch_df))
        main_done = main.committed_version(app)
        state_done = batch_id if mode == ORDERED else state.committed_version(app)
        target = Target(main, state, main_done is not None and main_done >= batch_id,
                        state_done is not None and state_done >= batch_id, mode)
        if target.main_done and target.state_done:
            log.info("batch %d already committed to %s by %s; skipping the replay", batch_id, self.path, app)
            return False
        now = self.clock()
        if not write_frame(self.spec, target, batch_df, batch_id, app, now):
            return False
        self._mode = mode
        if self.compact_every and (batch_id + 1) % self.compact_every == 0:
            self.maintain(now)
        return True

    def maintain(self, now: datetime | None = None) -> None:
        """Purge expired tombstones and compact small files (each one commit; readers are never blocked)."""
        main, state = self.engine(), self.state_engine()
        if state.schema() is not None:
            purge = purge_predicate(self.spec, now or self.clock())
            if purge is not None:
                state.delete(purge)
            state.compact()
        if main.schema() is not None:
            main.compact()


def _condition_text(condition: Any) -> str | None:
    """A condition option (SQL text or a pyspark ``Column``) as text: the text itself, or the Column's."""
    if condition is None or isinstance(condition, str):
        return condition
    from pyspark.sql import Column

    if isinstance(condition, Column):
        return str(condition)
    raise OptionError(f"option 'apply_as_truncates': {condition!r} is neither a SQL condition nor a Column",
                      "apply_as_truncates")


#: Pipelined mode: at most this many staged batches wait for the background merge (then merged as one).
MAX_COALESCED = 4


def _same_schema_runs(group: list[tuple[int, pa.Table]]) -> list[list[tuple[int, pa.Table]]]:
    """Consecutive batches of ``group`` with the same schema (a schema change starts a new MERGE, so that
    schema evolution and its errors see each batch's own columns)."""
    runs: list[list[tuple[int, pa.Table]]] = []
    for item in group:
        if runs and runs[-1][-1][1].schema.equals(item[1].schema):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
