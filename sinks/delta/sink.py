"""``DeltaUpsertSink``: applies change records to a Delta table, exactly once per micro-batch."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc.errors import OptionError
from cdc.model import CHANNEL, POSITION
from sinks.delta import maintenance
from sinks.delta.arrow_batch import ArrowBatch
from sinks.delta.commit import Outcome, Tables, apply, committed, open_tables, resolve_mode
from sinks.delta.engine import Engine, FrameEngine, open_engine
from sinks.delta.layout import (
    DEFAULT_DELETE_CONDITION,
    IS_DELETE,
    IS_TRUNCATE,
    MODE_PROPERTY,
    ORDERED,
    SAFE,
    state_path,
)
from sinks.delta.migration import run_migration
from sinks.delta.pipelining import Pipelining
from sinks.delta.sequence import with_sequence_frame
from sinks.delta.session import collect_arrow, query_app_id
from sinks.delta.spec import sink_spec

if TYPE_CHECKING:
    from pyspark.sql import Column

log = logging.getLogger(__name__)

ENGINES = ("auto", "delta-rs", "delta-spark")


class DeltaUpsertSink(Pipelining):
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
        #: apply_as_truncates as given (text or a Column), evaluated by Spark in the foreachBatch wrapper
        self.truncate_condition = apply_as_truncates
        self.spec = sink_spec(
            keys, sequence_by, apply_as_deletes=apply_as_deletes, scd_type=scd_type,
            track_history_column_list=track_history_column_list,
            track_history_except_column_list=track_history_except_column_list,
            track_history_columns=track_history_columns, apply_as_truncates=apply_as_truncates,
            ignore_null_updates=ignore_null_updates, ignore_null_updates_column_list=ignore_null_updates_column_list,
            ignore_null_updates_except_column_list=ignore_null_updates_except_column_list, column_list=column_list,
            except_column_list=except_column_list, except_columns=except_columns,
            tombstone_retention=tombstone_retention, prune_by_key_range=prune_by_key_range,
            bookkeeping_columns=bookkeeping_columns,
        )
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
        self._init_pipelining()

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
        return open_engine(self.engine_name, path, spark, self.storage_options)

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
        return resolve_mode(self.path, self.table_mode(), claim)

    # ------------------------------------------------------------------ foreachBatch
    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` entry point: evaluate the delete condition, collect the batch as Arrow, apply."""
        spark = batch_df.sparkSession
        app_id = self.app_id or query_app_id(spark)
        self.engine(spark)
        self.state_engine(spark)
        if self.pipelined:
            self._recover(app_id)
            if batch_id <= self._submitted:
                log.info("batch %d is already staged for %s; skipping the replay", batch_id, self.path)
                return
        # (With a merge in flight the table is not read here: Spark replays batches only after a restart,
        # and a restart starts with nothing in flight.)
        if self._inflight is not None:
            done = None
        else:
            done = committed(self.engine(), self.state_engine(), self.table_mode(), app_id)
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
        tables = open_tables(self.path, self.engine(), self.state_engine(), self._resolve(claim), app, batch_id)
        if tables is None:
            return False
        now = self.clock()
        return self._done(apply(self.spec, tables, ArrowBatch(self.spec, tables, changes, now), batch_id, app),
                          tables, first, batch_id, now)

    def write_frame(self, batch_df: Any, batch_id: int, app_id: str | None = None, *, claim: str | None = None) -> bool:
        """:meth:`write` for a DataFrame with ``engine='delta-spark'``: prepared, staged and merged inside Spark
        (:mod:`sinks.delta.frame`), never collected to the driver."""
        from sinks.delta.frame import write_frame

        app = app_id or self.app_id
        if not app:
            raise OptionError("option 'app_id' is required to write a batch outside a streaming query", "app_id")
        main, state = self.engine(batch_df.sparkSession), self.state_engine(batch_df.sparkSession)
        if not isinstance(main, FrameEngine) or not isinstance(state, FrameEngine):
            raise OptionError(f"a DataFrame batch is merged by engine='delta-spark'; this sink's engine is "
                              f"{self.engine_name!r}: give engine='delta-spark', or write() an Arrow table", "engine")
        if self.spec.sequence_columns:
            batch_df = with_sequence_frame(self.spec.sequence_columns, batch_df)
        claim = claim if claim is not None else self.claim(batch_df)
        mode = self._resolve(claim)
        tables = open_tables(self.path, main, state, mode, app, batch_id)
        if tables is None:
            return False
        now = self.clock()
        # With no ordered option an ordered claim is the source's mark (see claim()): the batch is one cdc source's
        # output ordered by its own _seq, which no two changes of one key share.
        marked = self.ordered is None and claim == ORDERED
        return self._done(write_frame(self.spec, tables, batch_df, batch_id, app, now, distinct_sequences=marked),
                          tables, batch_id, batch_id, now)

    def _done(self, outcome: Outcome, tables: Tables[Engine], first: int, batch_id: int, now: datetime) -> bool:
        """After the batches ``first`` to ``batch_id``: the new table's mode kept, maintenance when due."""
        if outcome.created:
            self._mode = tables.mode
        if outcome.merged and maintenance.due(self.compact_every, first, batch_id):
            self.maintain(now)
        return outcome.applied

    def migrate(self, mode: str | None = None) -> bool:
        """With the query stopped: ``mode=None`` converts a table of the previous layout; ``"ordered"`` or ``"safe"``
        switches the table's mode (:func:`sinks.delta.migration.migrate_mode`). False when there was nothing to do."""
        self._mode, self._engine, self._state_engine = None, None, None  # (read the table again afterwards)
        return run_migration(self.path, self.spec, mode, self.storage_options, self.clock())

    def maintain(self, now: datetime | None = None) -> None:
        """Purge expired tombstones and compact small files (each one commit; readers are never blocked)."""
        maintenance.maintain(self.spec, self.engine(), self.state_engine(), now or self.clock())

