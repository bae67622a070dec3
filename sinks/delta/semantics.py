"""The engine-independent semantics of the Delta upsert sink: written once, used by every engine.

Everything that decides *what* a batch does to the table lives here, as Arrow computations and as SQL
text; an engine (:mod:`sinks.delta.rs`, :mod:`sinks.delta.spark`) only runs the statements it is given.

Table layout (what a sink-managed Delta table holds)
-----------------------------------------------------
* the key columns and value columns of the changes (minus ``except_columns``);
* the sequence column (``sequence_by``, ``_seq`` by default): the sequence of the last change applied to the
  row. Changes whose sequence is not greater than it are ignored, so out-of-order and replayed deliveries
  are harmless;
* ``_commit_ts`` (when the changes carry it): when the row's last change was committed at the source;
* ``__cdc_deleted_at`` (hidden): null for a live row; for a **tombstone** the wall-clock time the delete
  was applied. A delete does not remove the key's row: it nulls every value column and stamps
  ``__cdc_deleted_at``, keeping key + sequence, so an older insert arriving later cannot resurrect the key.
  SCD type 1 tombstones are purged once older than ``tombstone_retention``. Tombstones live in the same table (not a
  side table) so that a batch is one atomic Delta commit; :func:`sinks.delta.read` hides them, and any other
  reader filters ``__cdc_deleted_at IS NULL``;
* SCD type 2 only: ``_valid_from`` / ``_valid_to`` (the sequences that opened and closed a version;
  ``_valid_to`` is null for the current version; intervals are half-open ``[from, to)``) and ``_is_current``.

The change-record metadata ``_op``, ``_channel`` and ``_position`` are delivery details and are not kept.

Rules
-----
* SCD type 1: within a batch only the latest change per key (largest sequence) applies.
* SCD type 2: every change of a batch (replays dropped) newer than the key's head becomes a version, or
  updates the version before it in place when it changes no tracked column (see :meth:`SinkSpec.stage_scd2`).
  A change older than the key's current version or tombstone is ignored: history is not back-filled.
* Partial changes (``_unchanged``, see :mod:`cdc.model`): a batch holding any is folded per key in sequence
  order by :func:`fold_partial` instead; the merge keeps the target's value of every column no newer change
  of the batch set. A partial update on a missing key or a tombstone creates the row with the unchanged
  columns null; SCD type 2 takes them from the current version. ``_unchanged`` is never stored.
* Across batches a change applies only if its sequence is greater than the key's last applied sequence
  (live row, tombstone or current SCD2 version).
* A change is a delete when ``apply_as_deletes`` (a SQL expression over the change record, default
  ``_op = 'delete'``) holds. The condition is evaluated once per record (by Spark in the ``foreachBatch``
  wrapper, or natively for the default) into the column ``__cdc_is_delete``.
* Schema evolution: a column new to the table is added (nullable) before the merge; a column whose type
  differs from the table's fails the batch with :class:`SchemaEvolutionError` before anything is written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import MalformedRecordError, OptionError, TerminalError
from cdc.model import CHANNEL, COMMIT_TS, OP, POSITION, UNCHANGED, Op

log = logging.getLogger(__name__)

SOURCE_ALIAS = "s"
TARGET_ALIAS = "t"
HIDDEN_PREFIX = "__cdc_"
DELETED_AT = "__cdc_deleted_at"
IS_DELETE = "__cdc_is_delete"
NOW = "__cdc_now"
ACTION = "__cdc_action"
FROM = "__cdc_from"  # SCD type 2 staging: a version's valid-from / valid-to
TO = "__cdc_to"
#: Prefix of the per-column source columns a batch with partial changes carries: ``__cdc_set_<column>`` is
#: the sequence of the change that last set the column in the batch (null: no change of the batch set it).
SET_PREFIX = "__cdc_set_"
VALID_FROM = "_valid_from"
VALID_TO = "_valid_to"
IS_CURRENT = "_is_current"
DEFAULT_DELETE_CONDITION = f"{OP} = '{Op.DELETE.value}'"
DROPPED_METADATA = (OP, CHANNEL, POSITION)
TIMESTAMP = pa.timestamp("us", tz="UTC")

# SCD type 2 staging actions: the first group matches the key's head row, the second group inserts.
MATCHED_ACTIONS = ("close", "closeupd", "inplace", "retomb", "revive")
INSERT_ACTIONS = ("open", "tombstone")


class SchemaEvolutionError(TerminalError):
    """The changes carry a column whose type differs from the Delta table's; nothing was written."""


def quote(name: str) -> str:
    """A SQL identifier quoted for both DataFusion (delta-rs) and Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def col(alias: str, name: str) -> str:
    return f"{alias}.{quote(name)}"


def sql_literal(value: Any) -> str | None:
    """A SQL literal both engines parse identically, or None when the value has no portable literal."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, date) and not isinstance(value, datetime):
        return f"DATE '{value.isoformat()}'"
    return None


def _normalise_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise SchemaEvolutionError("naive timestamps are not supported in Delta tables written by the sink; use UTC")
        return TIMESTAMP
    return t


@dataclass(frozen=True)
class Clause:
    """One WHEN clause of a MERGE: ``kind`` is ``update`` (WHEN MATCHED) or ``insert`` (WHEN NOT MATCHED)."""

    kind: Literal["update", "insert"]
    condition: str | None
    assignments: Mapping[str, str]  # quoted target column -> SQL expression over s / t


@dataclass(frozen=True)
class MergePlan:
    """A MERGE statement: the same text runs on delta-rs and on delta-spark."""

    predicate: str
    clauses: tuple[Clause, ...]
    source_alias: str = SOURCE_ALIAS
    target_alias: str = TARGET_ALIAS


@dataclass(frozen=True)
class SinkSpec:
    """The sink's configuration, validated once. See :class:`sinks.delta.DeltaUpsertSink` for the meaning."""

    keys: tuple[str, ...]
    sequence_by: str = "_seq"
    apply_as_deletes: str = DEFAULT_DELETE_CONDITION
    scd_type: int = 1
    track_history_columns: tuple[str, ...] | None = None
    except_columns: tuple[str, ...] = ()
    tombstone_retention: timedelta = timedelta(days=2)
    prune_by_key_range: bool = True
    reserved: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        if isinstance(self.keys, str) or not self.keys:
            raise OptionError("option 'keys': give one or more key column names, e.g. keys=['order_id']", "keys")
        object.__setattr__(self, "keys", tuple(self.keys))
        if len(set(self.keys)) != len(self.keys):
            raise OptionError(f"option 'keys': duplicate key columns in {list(self.keys)}", "keys")
        if self.scd_type not in (1, 2):
            raise OptionError(f"option 'scd_type': {self.scd_type!r} is not accepted; accepted: 1, 2", "scd_type")
        if not isinstance(self.sequence_by, str) or not self.sequence_by:
            raise OptionError("option 'sequence_by': give the name of the sequence column, e.g. '_seq'", "sequence_by")
        if self.sequence_by in self.keys:
            raise OptionError(f"option 'sequence_by': {self.sequence_by!r} is a key column", "sequence_by")
        if not isinstance(self.apply_as_deletes, str) or not self.apply_as_deletes.strip():
            raise OptionError("option 'apply_as_deletes': give a SQL condition, e.g. \"_op = 'delete'\"", "apply_as_deletes")
        excepted = tuple(self.except_columns)
        object.__setattr__(self, "except_columns", excepted)
        bad = [c for c in excepted if c in self.keys or c == self.sequence_by]
        if bad:
            raise OptionError(f"option 'except_columns': cannot exclude key or sequence columns {bad}", "except_columns")
        if self.track_history_columns is not None:
            if self.scd_type != 2:
                raise OptionError("option 'track_history_columns' applies only to scd_type=2", "track_history_columns")
            tracked = tuple(self.track_history_columns)
            object.__setattr__(self, "track_history_columns", tracked)
            bad = [c for c in tracked if c in self.keys or c in excepted]
            if bad:
                raise OptionError(
                    f"option 'track_history_columns': {bad} are key or excluded columns", "track_history_columns"
                )
        if self.tombstone_retention < timedelta(0):
            raise OptionError("option 'tombstone_retention' must not be negative", "tombstone_retention")
        reserved = [DELETED_AT, IS_DELETE, NOW, ACTION]
        if self.scd_type == 2:
            reserved += [VALID_FROM, VALID_TO, IS_CURRENT]
        object.__setattr__(self, "reserved", tuple(reserved))

    # ------------------------------------------------------------------ batch preparation
    def prepare(self, batch: pa.Table, now: datetime) -> pa.Table:
        """Validate a batch of change records, drop what the table does not keep, keep the latest change per
        key, and add the source-only columns ``__cdc_is_delete`` and ``__cdc_now``."""
        names = batch.column_names
        missing = [c for c in (*self.keys, self.sequence_by) if c not in names]
        if missing:
            raise OptionError(
                f"the changes have no column(s) {missing} named by 'keys'/'sequence_by'; columns: {names}",
                "keys" if set(missing) & set(self.keys) else "sequence_by",
            )
        clash = [c for c in names if c in self.reserved[2:] or (c.startswith(HIDDEN_PREFIX) and c != IS_DELETE)]
        if clash:
            raise OptionError(f"the changes carry columns reserved by the sink: {clash}", "keys")
        seq_type = batch.schema.field(self.sequence_by).type
        if not (pa.types.is_integer(seq_type) or pa.types.is_timestamp(seq_type)):
            raise OptionError(
                f"option 'sequence_by': column {self.sequence_by!r} has type {seq_type}; an integer or "
                "timestamp column is required",
                "sequence_by",
            )
        if IS_DELETE not in names:
            if self.apply_as_deletes.strip() != DEFAULT_DELETE_CONDITION:
                raise OptionError(
                    f"option 'apply_as_deletes' ({self.apply_as_deletes!r}) is a SQL condition evaluated by Spark "
                    f"in the foreachBatch wrapper; a batch applied directly must carry the boolean column {IS_DELETE!r}",
                    "apply_as_deletes",
                )
            if OP not in names:
                raise OptionError(f"the changes have no {OP!r} column to find deletes with", "apply_as_deletes")
            is_delete = pc.fill_null(pc.equal(batch.column(OP), Op.DELETE.value), False)
            batch = batch.append_column(IS_DELETE, is_delete)
        else:
            batch = batch.set_column(
                names.index(IS_DELETE), IS_DELETE, pc.fill_null(batch.column(IS_DELETE).cast(pa.bool_()), False)
            )
        for c in (*self.keys, self.sequence_by):
            nulls = batch.column(c).null_count
            if nulls:
                raise MalformedRecordError(f"{nulls} change record(s) have a null {c!r} ({self._where(batch, c)})")
        drop = [c for c in batch.column_names if c in DROPPED_METADATA or c in self.except_columns]
        batch = batch.drop_columns(drop)
        unchanged = batch.column(UNCHANGED) if UNCHANGED in batch.column_names else None
        if unchanged is not None:
            batch = batch.drop_columns([UNCHANGED])
        batch = batch.cast(pa.schema([pa.field(f.name, _normalise_type(f.type), f.nullable) for f in batch.schema]))
        if unchanged is not None and not pc.max(pc.fill_null(pc.list_value_length(unchanged), 0)).as_py():
            unchanged = None
        values = [c for c in batch.column_names if c not in self.keys and c not in (IS_DELETE, self.sequence_by, COMMIT_TS)]
        if self.scd_type == 2:  # every change becomes a version: keep them all (sorted, replays dropped)
            batch, _ = resolve_rows(batch, unchanged, self.keys, self.sequence_by, values)
        elif unchanged is not None:
            batch = fold_partial(batch, unchanged, self.keys, self.sequence_by, values)
        else:
            batch = latest_per_key(batch, self.keys, self.sequence_by)
        return batch.append_column(NOW, pa.repeat(pa.scalar(now, TIMESTAMP), batch.num_rows))

    @staticmethod
    def _where(batch: pa.Table, column: str) -> str:
        row = batch.filter(pc.is_null(batch.column(column))).slice(0, 1).to_pylist()[0]
        if CHANNEL in row and POSITION in row:
            return f"first at channel {row[CHANNEL]!r} position {row[POSITION]}"
        return f"first: {row}"

    # ------------------------------------------------------------------ schema
    def data_columns(self, prepared: pa.Schema) -> list[pa.Field]:
        """The table columns a prepared batch carries (keys first, then values, sequence, commit time)."""
        out = []
        for name in self.keys:
            out.append(pa.field(name, prepared.field(name).type, nullable=False))
        for f in prepared:
            if f.name in self.keys or f.name in (IS_DELETE, NOW, ACTION) or f.name.startswith(SET_PREFIX):
                continue
            out.append(pa.field(f.name, f.type, nullable=True))
        return out

    def table_schema(self, prepared: pa.Schema) -> pa.Schema:
        """The schema of a new table for the first batch."""
        fields = self.data_columns(prepared)
        if self.scd_type == 2:
            st = prepared.field(self.sequence_by).type
            fields += [pa.field(VALID_FROM, st), pa.field(VALID_TO, st), pa.field(IS_CURRENT, pa.bool_())]
        return pa.schema([*fields, pa.field(DELETED_AT, TIMESTAMP, nullable=True)])

    def new_columns(self, table: pa.Schema, prepared: pa.Schema) -> list[pa.Field]:
        """Columns to add to ``table`` before merging ``prepared``; raises on an incompatible type change."""
        existing = {f.name: f for f in table}
        added: list[pa.Field] = []
        conflicts = []
        for f in self.data_columns(prepared):
            have = existing.get(f.name)
            if have is None:
                if f.name in self.keys or f.name == self.sequence_by:
                    raise SchemaEvolutionError(
                        f"column {f.name!r} is a key or sequence column of the changes but not of the table "
                        f"({table.names}); keys cannot change"
                    )
                added.append(pa.field(f.name, f.type, nullable=True))
            elif not _normalise_type(have.type).equals(f.type):
                conflicts.append(f"{f.name!r}: table has {have.type}, changes have {f.type}")
        if conflicts:
            raise SchemaEvolutionError(
                "incompatible column type change; nothing was written: " + "; ".join(conflicts)
                + ". Rewrite the table with the new type, or exclude the column (except_columns)."
            )
        if self.track_history_columns:
            known = set(existing) | {f.name for f in added}
            unknown = [c for c in self.track_history_columns if c not in known]
            if unknown:  # may appear later (schema evolution); until then they cannot change
                log.warning("track_history_columns %s are not (yet) columns of the table", unknown)
        return added

    # ------------------------------------------------------------------ merge statements
    def key_range(self, source: pa.Table) -> str:
        """A pruning conjunct on the first key column's range in the batch ('' when not applicable)."""
        if not self.prune_by_key_range or source.num_rows == 0:
            return ""
        k = self.keys[0]
        mm = pc.min_max(source.column(k)).as_py()
        lo, hi = sql_literal(mm["min"]), sql_literal(mm["max"])
        if lo is None or hi is None:
            return ""
        return f" AND {col(TARGET_ALIAS, k)} >= {lo} AND {col(TARGET_ALIAS, k)} <= {hi}"

    def _key_match(self) -> str:
        return " AND ".join(f"{col(TARGET_ALIAS, k)} = {col(SOURCE_ALIAS, k)}" for k in self.keys)

    def merge_plan(self, source: pa.Table, table: pa.Schema) -> MergePlan:
        """The MERGE that applies a prepared (SCD1) or staged (SCD2) batch to a table with schema ``table``."""
        s, t = SOURCE_ALIAS, TARGET_ALIAS
        present = set(source.column_names)
        seq = self.sequence_by
        newer = f"{col(s, seq)} > {col(t, seq)}"
        hidden = {DELETED_AT, VALID_FROM, VALID_TO, IS_CURRENT}
        data = [f.name for f in table if f.name not in hidden]
        values = [c for c in data if c not in self.keys]

        def from_source(c: str) -> str:
            return col(s, c) if c in present else "NULL"

        def overlay(c: str) -> str:
            # A partial change (see fold_partial) keeps the target's value unless the batch set the column
            # after the target row's last change.
            if SET_PREFIX + c not in present:
                return from_source(c)
            return f"CASE WHEN {col(s, SET_PREFIX + c)} > {col(t, seq)} THEN {col(s, c)} ELSE {col(t, c)} END"

        def row(
            extra: Mapping[str, str], *, nulls: bool = False, keys: bool = True, over_target: bool = False
        ) -> dict[str, str]:
            out = {quote(k): col(s, k) for k in self.keys} if keys else {}
            for c in values:
                keep = c == seq or c == COMMIT_TS
                if keep or not nulls:
                    out[quote(c)] = overlay(c) if over_target and not keep else from_source(c)
                else:
                    out[quote(c)] = "NULL"
            out.update({quote(k): v for k, v in extra.items()})
            return out

        predicate = self._key_match()
        clauses: tuple[Clause, ...]
        if self.scd_type == 1:
            # The source is staged (stage_scd1): deletes already carry null values and their tombstone time,
            # so two plain clauses do (measured: cheaper than one clause per case).
            deleted_at = {DELETED_AT: col(s, DELETED_AT)}
            clauses = (
                Clause("update", newer, row(deleted_at, keys=False, over_target=True)),
                Clause("insert", None, row(deleted_at)),
            )
        else:
            action = col(s, ACTION)
            matched = ", ".join(f"'{a}'" for a in MATCHED_ACTIONS)
            predicate += (
                f" AND {action} IN ({matched})"
                f" AND ({col(t, IS_CURRENT)} OR {col(t, DELETED_AT)} IS NOT NULL)"
            )
            from_seq, valid_from, valid_to = col(s, seq), col(s, FROM), col(s, TO)
            closed = {VALID_TO: valid_to, IS_CURRENT: "false"}
            clauses = (
                Clause("update", f"{action} = 'close' AND {newer}", {quote(k): v for k, v in closed.items()}),
                Clause("update", f"{action} = 'closeupd' AND {newer}", row(closed, keys=False)),
                Clause("update", f"{action} = 'inplace' AND {newer}", row({}, keys=False)),
                Clause(
                    "update",
                    f"{action} = 'retomb' AND {newer}",
                    row({VALID_FROM: from_seq, VALID_TO: from_seq, DELETED_AT: col(s, NOW)}, nulls=True, keys=False),
                ),
                Clause(
                    "update",
                    f"{action} = 'revive' AND {newer}",
                    row({VALID_FROM: valid_from, VALID_TO: "NULL", IS_CURRENT: "true", DELETED_AT: "NULL"}, keys=False),
                ),
                Clause(
                    "insert",
                    f"{action} = 'open'",
                    row({VALID_FROM: valid_from, VALID_TO: valid_to, IS_CURRENT: f"{valid_to} IS NULL", DELETED_AT: "NULL"}),
                ),
                Clause(
                    "insert",
                    f"{action} = 'tombstone'",
                    row(
                        {VALID_FROM: from_seq, VALID_TO: from_seq, IS_CURRENT: "false", DELETED_AT: col(s, NOW)},
                        nulls=True,
                    ),
                ),
            )
        return MergePlan(predicate + self.key_range(source), clauses)

    # ------------------------------------------------------------------ SCD type 1 staging
    def stage_scd1(self, prepared: pa.Table) -> pa.Table:
        """The SCD type 1 MERGE source: deletes get null values and ``__cdc_deleted_at`` (the tombstone's
        time); other rows a null ``__cdc_deleted_at``."""
        is_delete = prepared.column(IS_DELETE)
        keep = {*self.keys, self.sequence_by, COMMIT_TS, IS_DELETE, NOW}
        out = prepared
        if pc.any(is_delete).as_py():
            for i, f in enumerate(prepared.schema):
                if f.name not in keep and not f.name.startswith(SET_PREFIX):
                    out = out.set_column(i, f, pc.if_else(is_delete, pa.nulls(out.num_rows, f.type), out.column(i)))
        stamp = pc.if_else(is_delete, prepared.column(NOW), pa.nulls(prepared.num_rows, TIMESTAMP))
        return out.append_column(pa.field(DELETED_AT, TIMESTAMP), stamp)

    # ------------------------------------------------------------------ SCD type 2 staging
    def heads_condition(self, prepared: pa.Table) -> tuple[str, Any]:
        """Which target rows are key heads (current version or tombstone) that ``prepared`` may touch: as SQL
        (for engines that read with SQL) and as a pyarrow dataset expression (for engines that read Arrow)."""
        import pyarrow.dataset as ds

        sql = f"({quote(IS_CURRENT)} OR {quote(DELETED_AT)} IS NOT NULL)"
        expr = ds.field(IS_CURRENT) | ~ds.field(DELETED_AT).is_null()
        if prepared.num_rows:
            k = self.keys[0]
            mm = pc.min_max(prepared.column(k)).as_py()
            lo, hi = sql_literal(mm["min"]), sql_literal(mm["max"])
            if lo is not None and hi is not None:
                sql += f" AND {quote(k)} >= {lo} AND {quote(k)} <= {hi}"
                expr = expr & (ds.field(k) >= mm["min"]) & (ds.field(k) <= mm["max"])
        return sql, expr

    def stage_scd2(self, prepared: pa.Table, heads: pa.Table) -> pa.Table:
        """Decide what SCD type 2 does with every change of a prepared batch, given each key's head row in the
        table (its current version or its tombstone). Returns the MERGE source, one row per action.

        ``prepared`` holds every change of the batch, sorted by key and sequence (see :meth:`prepare`).
        Changes not newer than the key's head are dropped (a late change is not back-filled into history).
        Per key, walking the remaining changes in sequence order: a change that alters a tracked column (or
        follows a delete, or has no version before it) opens a version; one that alters no tracked column
        updates the version before it in place; a delete closes the open version. A version is valid from its
        first change's sequence to the next version's (or the delete's); the last one stays current unless
        the key's last change is a delete, which leaves a tombstone as the key's head.

        Actions: at most one per key on the head row (``close``: valid-to set; ``closeupd``: the same after
        in-place changes; ``inplace``; ``retomb``: a newer tombstone; ``revive``: the tombstone becomes the
        key's last version), and inserts (``open``: a version, closed or current; ``tombstone``).
        """
        seq = self.sequence_by
        seq_type = prepared.schema.field(seq).type
        value_cols = [
            c for c in prepared.column_names
            if c not in self.keys and c not in (IS_DELETE, NOW, seq, COMMIT_TS) and not c.startswith(SET_PREFIX)
        ]
        tracked = list(self.track_history_columns) if self.track_history_columns is not None else value_cols
        tracked = [c for c in tracked if c in prepared.column_names]
        on_heads = [c for c in value_cols if c in heads.column_names]
        head_cols = [*on_heads, seq, IS_CURRENT, DELETED_AT]
        heads = heads.select([*self.keys, *head_cols]).rename_columns([*self.keys, *(f"__h_{c}" for c in head_cols)])
        n0 = prepared.num_rows
        tagged = prepared.append_column("__cdc_row", pa.array(np.arange(n0, dtype=np.int64)))
        joined = tagged.join(heads, list(self.keys), join_type="left outer", use_threads=False)
        joined = joined.take(pc.sort_indices(joined.column("__cdc_row")))  # the join does not keep the order
        h_seq = joined.column(f"__h_{seq}").cast(seq_type)
        fresh = pc.fill_null(pc.or_kleene(pc.is_null(h_seq), pc.greater(joined.column(seq), h_seq)), False)
        joined = joined.filter(fresh)
        m = joined.num_rows
        if m == 0:
            return joined.select([c for c in prepared.column_names if not c.startswith(SET_PREFIX)]).append_column(
                ACTION, pa.nulls(0, pa.string())
            ).append_column(FROM, pa.nulls(0, seq_type)).append_column(TO, pa.nulls(0, seq_type))
        h_seq = joined.column(f"__h_{seq}").cast(seq_type)
        for c in on_heads:  # partial changes take the columns no change of theirs set from the head
            if SET_PREFIX + c not in joined.column_names:
                continue
            set_at = joined.column(SET_PREFIX + c)
            newer = pc.fill_null(pc.and_kleene(pc.is_valid(set_at), pc.or_kleene(pc.is_null(h_seq), pc.greater(set_at, h_seq))), False)
            resolved = pc.if_else(newer, joined.column(c), joined.column(f"__h_{c}").cast(joined.schema.field(c).type))
            joined = joined.set_column(joined.column_names.index(c), c, resolved)

        idx = np.arange(m, dtype=np.int64)
        key_start = _key_starts(joined, self.keys)
        starts = np.flatnonzero(key_start)
        ends = np.append(starts[1:], m)  # exclusive
        group = np.cumsum(key_start) - 1
        g_start, g_end = starts[group], ends[group]
        has_head = pc.is_valid(h_seq).to_numpy(zero_copy_only=False)
        head_current = pc.fill_null(joined.column(f"__h_{IS_CURRENT}").cast(pa.bool_()), False).to_numpy(
            zero_copy_only=False
        )
        head_tomb = has_head & ~head_current
        is_del = joined.column(IS_DELETE).to_numpy(zero_copy_only=False).astype(bool)
        first = key_start
        prev = np.maximum(idx - 1, 0)
        # The state before each change: the previous change's, or the head's for a key's first change.
        prev_none = np.where(first, ~head_current, is_del[prev])
        differ = np.zeros(m, dtype=bool)
        for c in tracked:
            mine = joined.column(c).combine_chunks()
            before_row = pc.take(mine, pa.array(prev))
            if f"__h_{c}" in joined.column_names:
                before = pc.if_else(pa.array(first), joined.column(f"__h_{c}").cast(mine.type).combine_chunks(), before_row)
            else:
                before = pc.if_else(pa.array(first), pa.nulls(m, mine.type), before_row)
            ne = pc.fill_null(pc.not_equal(mine, before), True).to_numpy(zero_copy_only=False)
            both_null = (pc.is_null(mine).to_numpy(zero_copy_only=False) & pc.is_null(before).to_numpy(zero_copy_only=False))
            differ |= ne & ~both_null
        new_v = ~is_del & (prev_none | differ)
        boundary = new_v | is_del
        # Per row: the next boundary after it in its key (m: none).
        b_idx = np.where(boundary, idx, m)
        from_here = np.minimum.accumulate(b_idx[::-1])[::-1]
        nxt = np.append(from_here[1:], m)
        nxt = np.where(nxt < g_end, nxt, m)
        first_b = from_here[g_start]  # the key's first boundary (m: none)
        first_b = np.where(first_b < g_end, first_b, m)
        is_last = idx == g_end - 1
        seqs = joined.column(seq).combine_chunks()

        rows: list[np.ndarray] = []  # the row whose values an action carries
        actions: list[str] = []
        froms: list[np.ndarray] = []  # rows whose sequences give valid-from / valid-to (-1: null)
        tos: list[np.ndarray] = []

        def add(mask: np.ndarray, action: str, values_at: np.ndarray, from_at: np.ndarray, to_at: np.ndarray) -> None:
            rows.append(values_at[mask])
            actions.extend([action] * int(mask.sum()))
            froms.append(from_at[mask])
            tos.append(to_at[mask])

        none = np.full(m, -1, dtype=np.int64)
        last_row = g_end - 1
        # Head rows: one action per key (taken at the key's first change).
        head_run_last = np.where(first_b < m, first_b - 1, last_row)  # the last in-place change of the head version
        has_run = head_run_last >= g_start
        to_first_b = np.where(first_b < m, first_b, -1)
        add(first & head_current & (first_b < m) & has_run, "closeupd", head_run_last, none, to_first_b)
        add(first & head_current & (first_b < m) & ~has_run, "close", idx, none, to_first_b)
        add(first & head_current & (first_b == m), "inplace", head_run_last, none, none)
        add(first & head_tomb & is_del[last_row], "retomb", last_row, none, none)
        # A revived tombstone becomes the key's last version; every other version is inserted.
        last_version = np.maximum.accumulate(np.where(new_v, idx, -1))[last_row]
        revived = head_tomb[g_start] & ~is_del[last_row] & (idx == last_version)
        version_end = np.where(nxt < m, nxt, g_end) - 1  # the version's last in-place change
        version_to = np.where(nxt < m, nxt, -1)
        add(revived, "revive", version_end, idx, none)
        add(new_v & ~revived, "open", version_end, idx, version_to)
        add(is_last & is_del & ~head_tomb, "tombstone", idx, none, none)

        take = np.concatenate(rows)
        base = joined.select([c for c in prepared.column_names if not c.startswith(SET_PREFIX)])
        out = base.take(pa.array(take))
        # An action's key and commit time are its row's; a version's sequence is its last change's (the row).
        out = out.append_column(ACTION, pa.array(actions, pa.string()))
        for name, at in ((FROM, np.concatenate(froms)), (TO, np.concatenate(tos))):
            out = out.append_column(pa.field(name, seq_type), pc.take(seqs, pa.array(at, mask=at < 0)))
        return out

    # ------------------------------------------------------------------ maintenance
    def purge_predicate(self, now: datetime) -> str | None:
        """Deletes tombstones older than the retention; None for SCD type 2, whose tombstones are kept with the
        history (a purged SCD2 tombstone would let a late, older change open a version overlapping history)."""
        if self.scd_type == 2:
            return None
        # A string literal with an explicit UTC offset: both engines coerce it to the column's timestamp type
        # (DataFusion rejects a typed TIMESTAMP literal of another precision).
        cutoff = (now - self.tombstone_retention).astimezone(UTC).isoformat()
        return f"{quote(DELETED_AT)} IS NOT NULL AND {quote(DELETED_AT)} < '{cutoff}'"


def latest_per_key(batch: pa.Table, keys: Sequence[str], sequence: str) -> pa.Table:
    """Keep, for each key, the change with the largest sequence (the last one when sequences tie)."""
    if batch.num_rows <= 1:
        return batch
    idx = pa.array(np.arange(batch.num_rows, dtype=np.int64))
    tagged = batch.select([*keys, sequence]).append_column("__cdc_row", idx)
    best = tagged.group_by(list(keys)).aggregate([(sequence, "max")])
    if best.num_rows == batch.num_rows:
        return batch
    best = pa.table({**{k: best.column(k) for k in keys}, sequence: best.column(f"{sequence}_max")})
    winners = tagged.join(best, [*keys, sequence], join_type="inner", use_threads=False)
    # Exact duplicates (replays) tie on (key, sequence): keep one row of each.
    rows = winners.group_by([*keys, sequence]).aggregate([("__cdc_row", "max")]).column("__cdc_row_max")
    return batch.take(pc.take(rows, pc.sort_indices(rows)))


def fold_partial(
    batch: pa.Table, unchanged: pa.ChunkedArray | None, keys: Sequence[str], sequence: str, values: Sequence[str]
) -> pa.Table:
    """Fold each key's changes of a batch that holds partial changes into one change, in sequence order.

    ``unchanged`` is the batch's ``_unchanged`` column (see :mod:`cdc.model`): per record, the value columns
    it leaves as they were (null or empty: the record carries the whole row). A full row or a delete resets
    the key; a partial update overlays the columns it sets. Per key the result is the key's latest change
    (sequence, commit time, delete flag) with, for each value column ``c``, the value of the latest change
    that set ``c`` (a delete sets every column to null) and that change's sequence in ``__cdc_set_<c>``;
    when no change of the batch set ``c`` (a run of partial updates with no full row before it) the value is
    null and ``__cdc_set_<c>`` is null: ``c`` stays unchanged.

    The merge keeps the target's value of ``c`` unless ``__cdc_set_<c>`` is greater than the target row's
    sequence. That makes the result exactly "apply, in sequence order, the batch's changes newer than the
    target row onto it", even when the batch also carries stale changes (re-deliveries) that the fold saw:
    the latest change to set ``c`` is then either newer than the target (and it is the one to keep) or not
    (and then no newer change set ``c``). A partial update on a missing key or on a tombstone creates the
    row with the unchanged columns null (Tablestore's ``UpdateRow``).
    """
    rows, key_start = resolve_rows(batch, unchanged, keys, sequence, values)
    last = np.append(np.flatnonzero(key_start)[1:], rows.num_rows) - 1
    return rows.take(pa.array(last))


def resolve_rows(
    batch: pa.Table, unchanged: pa.ChunkedArray | None, keys: Sequence[str], sequence: str, values: Sequence[str]
) -> tuple[pa.Table, np.ndarray]:
    """The batch sorted by key and sequence, exact duplicates (same key and sequence: replays) dropped, and,
    when ``unchanged`` is given, every row resolved to the key's state after it (see :func:`fold_partial`),
    with the ``__cdc_set_<c>`` columns. Also returns the key-start flags of the rows.

    Vectorised: one sort, then per value column a numpy running maximum of the rows that set it.
    """
    n = batch.num_rows
    order_cols = [*keys, sequence]
    tagged = batch.select(order_cols).append_column("__cdc_row", pa.array(np.arange(n, dtype=np.int64)))
    order = pc.sort_indices(tagged, sort_keys=[(c, "ascending") for c in [*order_cols, "__cdc_row"]])
    batch = batch.take(order)
    if unchanged is not None:
        unchanged = pc.take(unchanged, order)
    # Exact duplicates are adjacent now: keep the first of each.
    key_start = _key_starts(batch, keys)
    if n > 1:
        s = batch.column(sequence).combine_chunks()
        keep = key_start.copy()
        keep[1:] |= pc.not_equal(s.slice(1), s.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        if not keep.all():
            batch = batch.filter(pa.array(keep))
            if unchanged is not None:
                unchanged = unchanged.filter(pa.array(keep))
            key_start = key_start[keep]
    if unchanged is None:
        return batch, key_start
    m = batch.num_rows
    idx = np.arange(m, dtype=np.int64)
    group_start = np.maximum.accumulate(np.where(key_start, idx, 0))
    is_delete = batch.column(IS_DELETE).to_numpy(zero_copy_only=False).astype(bool)
    u = unchanged.combine_chunks() if isinstance(unchanged, pa.ChunkedArray) else unchanged
    if pa.types.is_large_list(u.type):
        u = u.cast(pa.list_(pa.string()))
    partial = pc.fill_null(pc.greater(pc.list_value_length(u), 0), False).to_numpy(zero_copy_only=False) & ~is_delete
    flat = pc.list_flatten(u).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(u).to_numpy(zero_copy_only=False)
    seqs = batch.column(sequence).combine_chunks()
    deletes = pa.array(is_delete)
    out = batch
    for c in values:
        leaves = np.zeros(m, dtype=bool)
        leaves[parents[flat == c]] = True
        # The latest row of the key, up to each row, that set c (full rows and deletes set every column).
        setter = np.maximum.accumulate(np.where(leaves & partial, -1, idx))
        setter = np.where(setter >= group_start, setter, -1)
        take = pa.array(setter, mask=setter < 0)
        column = batch.column(c).combine_chunks()
        value = pc.if_else(deletes, pa.nulls(m, column.type), column)  # a delete nulls every column
        out = out.set_column(out.column_names.index(c), c, pc.take(value, take))
        out = out.append_column(SET_PREFIX + c, pc.take(seqs, take))
    return out, key_start


def _key_starts(batch: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """For a batch sorted by key: True where a row's key differs from the previous row's (and at row 0)."""
    n = batch.num_rows
    out = np.ones(n, dtype=bool)
    if n > 1:
        diff = np.zeros(n - 1, dtype=bool)
        for k in keys:
            c = batch.column(k).combine_chunks()
            diff |= pc.not_equal(c.slice(1), c.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        out[1:] = diff
    return out
