"""The sink's configuration (:class:`SinkSpec`), validated once, and the rules it selects.

Everything that decides *what* a batch does to the table is engine-independent, as Arrow computations and
as SQL text; an engine (:mod:`sinks.delta.rs`, :mod:`sinks.delta.spark`) only runs the statements it is
given. The steps, in the order :func:`sinks.delta.commit.apply` runs them: :mod:`sinks.delta.batch`
(validate a batch, reduce or fold it per key), :mod:`sinks.delta.schema` (create or evolve the table),
:mod:`sinks.delta.scd1` or :mod:`sinks.delta.scd2` (stage the MERGE source), :mod:`sinks.delta.merge` (the
MERGE statement). The table they write is described in :mod:`sinks.delta.layout`.

Rules
-----
* ``sequence_by``: one column, a struct, or a list (the struct ``_sequence``), compared field by field in
  the order given (see :mod:`sinks.delta.sequence`). A null sequence, or two changes of a key with one
  sequence and different values in a batch, fail the batch; identical changes count once.
* SCD type 1: within a batch only the latest change per key (largest sequence) applies.
* SCD type 2: every change of a batch (replays dropped) newer than the key's head becomes a version, or
  updates the version before it in place when it changes no tracked column (see
  :func:`sinks.delta.scd2.stage_scd2`). A change not newer than the key's head is back-filled into
  the key's history at its sequence (see :mod:`sinks.delta.backfill`).
* Partial changes (``_unchanged``, see :mod:`cdc.model`): a batch holding any is folded per key in sequence
  order by :func:`sinks.delta.batch.fold_partial` instead; the merge keeps the target's value of every column
  no newer change of the batch set. A partial update on a missing key or a tombstone creates the row with the
  unchanged columns null; SCD type 2 takes them from the current version. ``_unchanged`` is never stored.
* Across batches a change applies only if its sequence is greater than the key's last applied sequence
  as kept in the state table (live key or tombstone; see :mod:`sinks.delta.layout`), checked in Arrow
  before the MERGE of the main table.
* ``ignore_null_updates`` (or its column lists): a null in a non-delete change of such a column means "left
  as it was": the change is applied as a partial change leaving that column unchanged (see above), so the
  stored value stays, and a key with no row gets the null. Deletes are unaffected.
* ``column_list`` / ``except_column_list``: the value columns the table keeps (keys and ``sequence_by``
  always); a name the batch does not carry fails the batch naming the option and the column.
* ``apply_as_truncates`` (SCD type 1): a change for which it holds empties the table at its place in the
  batch: the batch's changes sequenced before it are dropped, those after it applied to the empty table.
* A change is a delete when ``apply_as_deletes`` (a SQL expression over the change record, default
  ``_op = 'delete'``) holds. The condition is evaluated once per record (by Spark in the ``foreachBatch``
  wrapper, or natively for the default) into the column ``__cdc_is_delete``.
* Schema evolution: a column new to the table is added (nullable) before the merge; a column whose type
  differs from the table's fails the batch with :class:`sinks.delta.schema.SchemaEvolutionError` before
  anything is written.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cdc.errors import OptionError
from cdc.model import COMMIT_TS, UNCHANGED
from sinks.delta.layout import (
    ACTION,
    BOOKKEEPING,
    DEFAULT_DELETE_CONDITION,
    DELETED_AT,
    DROPPED_METADATA,
    HIDDEN_PREFIX,
    IS_CURRENT,
    IS_DELETE,
    NOW,
    VALID_FROM,
    VALID_TO,
    hidden_columns,
)
from sinks.delta.sequence import SEQUENCE


@dataclass(frozen=True)
class SinkSpec:
    """The sink's configuration, validated once. See :class:`sinks.delta.DeltaUpsertSink` for the meaning."""

    keys: tuple[str, ...]
    #: The sequence column (given a list of columns: :data:`sinks.delta.sequence.SEQUENCE`, their struct).
    sequence_by: str = "_seq"
    apply_as_deletes: str = DEFAULT_DELETE_CONDITION
    scd_type: int = 1
    #: SCD type 2: the columns whose change opens a version (``track_history_column_list``; None: see below).
    track_history_columns: tuple[str, ...] | None = None
    #: SCD type 2: every value column but these opens a version (``track_history_except_column_list``).
    track_history_except_column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] = ()
    #: The value columns the table keeps (None: every one but ``except_column_list``).
    column_list: tuple[str, ...] | None = None
    ignore_null_updates: bool = False
    ignore_null_updates_column_list: tuple[str, ...] | None = None
    ignore_null_updates_except_column_list: tuple[str, ...] | None = None
    #: The truncate condition as the user gave it (text; a Column's text), None: only ``_op = 'truncate'``.
    apply_as_truncates: str | None = None
    tombstone_retention: timedelta = timedelta(days=2)
    #: None: prune where the range costs no Spark job of its own (see :mod:`sinks.delta.inplan`).
    prune_by_key_range: bool | None = None
    #: Which bookkeeping columns the main table shows (see :mod:`sinks.delta.layout`); None: all.
    bookkeeping_columns: tuple[str, ...] | None = None
    #: A list ``sequence_by``: the columns compared in turn (see :mod:`sinks.delta.sequence`); else empty.
    sequence_columns: tuple[str, ...] = field(default=(), init=False)
    hidden: frozenset[str] = field(default=frozenset(), init=False)
    reserved: tuple[str, ...] = field(default=(), init=False)

    def tracked(self, value_columns: list[str]) -> list[str]:
        """SCD type 2: the columns among ``value_columns`` whose change opens a version."""
        if self.track_history_columns is not None:
            return list(self.track_history_columns)
        if self.track_history_except_column_list is not None:
            return [c for c in value_columns if c not in self.track_history_except_column_list]
        return value_columns

    def __post_init__(self) -> None:
        if isinstance(self.keys, str) or not self.keys:
            raise OptionError("option 'keys': give one or more key column names, e.g. keys=['order_id']", "keys")
        object.__setattr__(self, "keys", tuple(self.keys))
        if len(set(self.keys)) != len(self.keys):
            raise OptionError(f"option 'keys': duplicate key columns in {list(self.keys)}", "keys")
        if self.scd_type not in (1, 2):
            raise OptionError(f"option 'scd_type': {self.scd_type!r} is not accepted; accepted: 1, 2", "scd_type")
        seq: object = self.sequence_by
        if isinstance(seq, list | tuple) and len(seq) == 1:
            seq = seq[0]
        if isinstance(seq, list | tuple) and seq and all(isinstance(c, str) and c for c in seq):
            if len(set(seq)) != len(seq):
                raise OptionError(f"option 'sequence_by': duplicate columns in {list(seq)}", "sequence_by")
            object.__setattr__(self, "sequence_columns", tuple(seq))
            object.__setattr__(self, "sequence_by", SEQUENCE)
        elif not isinstance(seq, str) or not seq:
            raise OptionError("option 'sequence_by': give the name of the sequence column, e.g. '_seq', or a list "
                              "of columns compared in turn, e.g. ['version', 'offset']", "sequence_by")
        else:
            object.__setattr__(self, "sequence_by", seq)
        clash = [c for c in (self.sequence_by, *self.sequence_columns) if c in self.keys]
        if clash:
            raise OptionError(f"option 'sequence_by': {clash[0]!r} is a key column", "sequence_by")
        if not isinstance(self.apply_as_deletes, str) or not self.apply_as_deletes.strip():
            raise OptionError("option 'apply_as_deletes': give a SQL condition, e.g. \"_op = 'delete'\"", "apply_as_deletes")
        for name in ("except_column_list", "column_list", "ignore_null_updates_column_list",
                     "ignore_null_updates_except_column_list"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str):
                raise OptionError(f"option {name!r}: give a list of column names, e.g. [{value!r}]", name)
            object.__setattr__(self, name, tuple(value))
            bad = [c for c in getattr(self, name)
                   if c in self.keys or c == self.sequence_by or c in self.sequence_columns]
            if bad:
                raise OptionError(f"option {name!r}: cannot name key or sequence columns {bad}", name)
        excepted = self.except_column_list
        if self.column_list is not None and excepted:
            raise OptionError(
                "options 'column_list' and 'except_column_list' were both given; give one of them", "column_list"
            )
        given = [n for n, v in (("ignore_null_updates", self.ignore_null_updates or None),
                                ("ignore_null_updates_column_list", self.ignore_null_updates_column_list),
                                ("ignore_null_updates_except_column_list", self.ignore_null_updates_except_column_list))
                 if v is not None]
        if len(given) > 1:
            raise OptionError(f"options {' and '.join(repr(g) for g in given)} were both given; give one of them",
                              given[0])
        if self.apply_as_truncates is not None:
            if self.scd_type != 1:
                raise OptionError("option 'apply_as_truncates' applies only to scd_type=1 (a truncate would end "
                                  "every key's history at once)", "apply_as_truncates")
            if not isinstance(self.apply_as_truncates, str) or not self.apply_as_truncates.strip():
                raise OptionError("option 'apply_as_truncates': give a SQL condition or a Column, e.g. "
                                  "\"_op = 'truncate'\"", "apply_as_truncates")
        for name in ("track_history_columns", "track_history_except_column_list"):
            listed = getattr(self, name)
            if listed is None:
                continue
            option = "track_history_column_list" if name == "track_history_columns" else name
            if self.scd_type != 2:
                raise OptionError(f"option {option!r} applies only to scd_type=2", option)
            if isinstance(listed, str):
                raise OptionError(f"option {option!r}: give a list of column names, not one name", option)
            listed = tuple(listed)
            object.__setattr__(self, name, listed)
            bad = [c for c in listed if c in self.keys or (name == "track_history_columns" and c in excepted)]
            if bad:
                raise OptionError(f"option {option!r}: {bad} are key or excluded columns", option)
        if self.track_history_columns is not None and self.track_history_except_column_list is not None:
            raise OptionError("options 'track_history_column_list' and 'track_history_except_column_list' were "
                              "both given; give one of them", "track_history_column_list")
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
        reserved = [DELETED_AT, IS_DELETE, NOW, ACTION]  # (the first two may come in a batch: see check_columns)
        if self.scd_type == 2:
            reserved += [VALID_FROM, VALID_TO, IS_CURRENT]
        object.__setattr__(self, "reserved", tuple(reserved))

    def value_columns(self, names: list[str]) -> list[str]:
        """The value columns among a batch's column ``names`` (not keys, sequence, metadata or the sink's)."""
        metadata = (self.sequence_by, COMMIT_TS, UNCHANGED, *DROPPED_METADATA)
        return [c for c in names if c not in self.keys and c not in metadata and not c.startswith(HIDDEN_PREFIX)]

    def excluded(self, names: list[str]) -> list[str]:
        """The columns of a batch the table does not keep (``column_list`` / ``except_column_list``)."""
        if self.column_list is not None:  # (a list sequence_by's columns are always kept)
            return [c for c in self.value_columns(names) if c not in self.column_list and c not in self.sequence_columns]
        return [c for c in names if c in self.except_column_list]  # (sequence columns: refused in the list)

    def null_ignored(self, values: list[str]) -> list[str]:
        """Of the value columns ``values``, those whose nulls in a non-delete change leave the stored value."""
        if self.ignore_null_updates:
            return list(values)
        if self.ignore_null_updates_column_list is not None:
            return [c for c in values if c in self.ignore_null_updates_column_list]
        if self.ignore_null_updates_except_column_list is not None:
            return [c for c in values if c not in self.ignore_null_updates_except_column_list]
        return []

    def check_lists(self, names: list[str]) -> None:
        """Every column a list option names is a column of the batch (``names``); else an
        :class:`~cdc.errors.OptionError` naming the option and the columns."""
        # (Not track_history_columns: a tracked column may appear mid-history, by schema evolution.)
        for name in ("column_list", "except_column_list", "ignore_null_updates_column_list",
                     "ignore_null_updates_except_column_list"):
            unknown = [c for c in getattr(self, name) or () if c not in names]
            if unknown:
                raise OptionError(
                    f"option {name!r} names column(s) {unknown} that the changes do not have; columns: {names}", name
                )


def sink_spec(
    keys: str | Sequence[str],
    sequence_by: str | Sequence[str],
    *,
    apply_as_deletes: str,
    scd_type: int,
    track_history_column_list: Sequence[str] | None,
    track_history_except_column_list: Sequence[str] | None,
    track_history_columns: Sequence[str] | None,
    apply_as_truncates: Any,
    ignore_null_updates: bool,
    ignore_null_updates_column_list: Sequence[str] | None,
    ignore_null_updates_except_column_list: Sequence[str] | None,
    column_list: Sequence[str] | None,
    except_column_list: Sequence[str] | None,
    except_columns: Sequence[str] | None,
    tombstone_retention: timedelta,
    prune_by_key_range: bool | None,
    bookkeeping_columns: Sequence[str] | None,
) -> SinkSpec:
    """The :class:`SinkSpec` of :class:`sinks.delta.sink.DeltaUpsertSink`'s options as the user gives them: the
    deprecated names (``except_columns``, ``track_history_columns``) taken with a warning, an error naming the
    option as given."""
    if except_columns is not None:
        if except_column_list is not None:
            raise OptionError("options 'except_columns' and 'except_column_list' were both given; give "
                              "'except_column_list' (the former's new name)", "except_columns")
        warnings.warn("option 'except_columns' is deprecated; use 'except_column_list' (the same meaning)",
                      DeprecationWarning, stacklevel=3)
        except_column_list = except_columns
    if track_history_columns is not None:
        if track_history_column_list is not None:
            raise OptionError("options 'track_history_columns' and 'track_history_column_list' were both "
                              "given; give 'track_history_column_list' (the former's new name)",
                              "track_history_columns")
        warnings.warn("option 'track_history_columns' is deprecated; use 'track_history_column_list' (the same "
                      "meaning)", DeprecationWarning, stacklevel=3)
        track_history_column_list = track_history_columns
    try:
        spec = SinkSpec(
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
            apply_as_truncates=condition_text(apply_as_truncates),
            tombstone_retention=tombstone_retention,
            prune_by_key_range=prune_by_key_range,
            bookkeeping_columns=None if bookkeeping_columns is None else tuple(bookkeeping_columns),
        )
    except OptionError as e:  # named as the user gave it
        if except_columns is None or e.option != "except_column_list":
            raise
        raise OptionError(str(e).replace("'except_column_list'", "'except_columns' (now 'except_column_list')"),
                          "except_columns") from None
    return spec


def condition_text(condition: Any) -> str | None:
    """A condition option (SQL text or a pyspark ``Column``) as text: the text itself, or the Column's."""
    if condition is None or isinstance(condition, str):
        return condition
    from pyspark.sql import Column

    if isinstance(condition, Column):
        return str(condition)
    raise OptionError(f"option 'apply_as_truncates': {condition!r} is neither a SQL condition nor a Column",
                      "apply_as_truncates")
