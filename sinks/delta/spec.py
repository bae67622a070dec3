"""The sink's configuration (:class:`SinkSpec`), validated once, and the rules it selects.

Everything that decides *what* a batch does to the table is engine-independent, as Arrow computations and
as SQL text; an engine (:mod:`sinks.delta.rs`, :mod:`sinks.delta.spark`) only runs the statements it is
given. The steps, in the order :meth:`sinks.delta.DeltaUpsertSink.write` runs them: :mod:`sinks.delta.batch`
(validate a batch, reduce or fold it per key), :mod:`sinks.delta.schema` (create or evolve the table),
:mod:`sinks.delta.scd1` or :mod:`sinks.delta.scd2` (stage the MERGE source), :mod:`sinks.delta.merge` (the
MERGE statement). The table they write is described in :mod:`sinks.delta.layout`.

Rules
-----
* SCD type 1: within a batch only the latest change per key (largest sequence) applies.
* SCD type 2: every change of a batch (replays dropped) newer than the key's head becomes a version, or
  updates the version before it in place when it changes no tracked column (see
  :func:`sinks.delta.scd2.stage_scd2`). A change older than the key's current version or tombstone is
  ignored: history is not back-filled.
* Partial changes (``_unchanged``, see :mod:`cdc.model`): a batch holding any is folded per key in sequence
  order by :func:`sinks.delta.batch.fold_partial` instead; the merge keeps the target's value of every column
  no newer change of the batch set. A partial update on a missing key or a tombstone creates the row with the
  unchanged columns null; SCD type 2 takes them from the current version. ``_unchanged`` is never stored.
* Across batches a change applies only if its sequence is greater than the key's last applied sequence
  as kept in the state table (live key or tombstone; see :mod:`sinks.delta.layout`), checked in Arrow
  before the MERGE of the main table.
* A change is a delete when ``apply_as_deletes`` (a SQL expression over the change record, default
  ``_op = 'delete'``) holds. The condition is evaluated once per record (by Spark in the ``foreachBatch``
  wrapper, or natively for the default) into the column ``__cdc_is_delete``.
* Schema evolution: a column new to the table is added (nullable) before the merge; a column whose type
  differs from the table's fails the batch with :class:`sinks.delta.schema.SchemaEvolutionError` before
  anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from cdc.errors import OptionError
from sinks.delta.layout import (
    ACTION,
    BOOKKEEPING,
    DEFAULT_DELETE_CONDITION,
    DELETED_AT,
    IS_CURRENT,
    IS_DELETE,
    NOW,
    VALID_FROM,
    VALID_TO,
    hidden_columns,
)


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
    #: Which bookkeeping columns the main table shows (see :mod:`sinks.delta.layout`); None: all.
    bookkeeping_columns: tuple[str, ...] | None = None
    hidden: frozenset[str] = field(default=frozenset(), init=False)
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
        accepted = BOOKKEEPING if self.scd_type == 2 else BOOKKEEPING[:2]
        if self.bookkeeping_columns is None:
            visible = frozenset(accepted)
        else:
            if isinstance(self.bookkeeping_columns, str):
                object.__setattr__(self, "bookkeeping_columns", (self.bookkeeping_columns,))
            bad = [c for c in self.bookkeeping_columns if c not in accepted]
            if bad:
                raise OptionError(
                    f"option 'bookkeeping_columns': {bad} not accepted for scd_type={self.scd_type}; accepted: "
                    f"any of {', '.join(accepted)} (SCD type 2's _valid_from/_valid_to are always shown)",
                    "bookkeeping_columns",
                )
            visible = frozenset(self.bookkeeping_columns)
        object.__setattr__(self, "hidden", hidden_columns(visible, self.sequence_by, self.scd_type))
        reserved = [DELETED_AT, IS_DELETE, NOW, ACTION]
        if self.scd_type == 2:
            reserved += [VALID_FROM, VALID_TO, IS_CURRENT]
        object.__setattr__(self, "reserved", tuple(reserved))
