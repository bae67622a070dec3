"""The MERGE statement that applies a staged batch: one :class:`MergePlan`, whose text runs unchanged on
delta-rs (DataFusion SQL) and on delta-spark (Spark SQL), and the SQL quoting both engines parse alike.

The text holds column names and the sink's own constants only, never a value of the data: the batch's key
range, which prunes the MERGE, travels beside it as typed bounds (:class:`sinks.delta.keyrange.KeyRange`)
that each engine binds its own way. The source of the MERGE is staged by :mod:`sinks.delta.scd1` or
:mod:`sinks.delta.scd2`; the clauses here rely on what staging put there (deletes already nulled, SCD type 2
actions in ``__cdc_action``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from sinks.delta.keyrange import KeyRange
from sinks.delta.layout import (
    ACTION,
    AT,
    DELETED_AT,
    FROM,
    HISTORY_ACTIONS,
    IS_CURRENT,
    IS_DELETE,
    MAIN_MATCHED_ACTIONS,
    SET_PREFIX,
    SOURCE_ALIAS,
    TARGET_ALIAS,
    TIE,
    TO,
    VALID_FROM,
    VALID_TO,
    quote,
)
from sinks.delta.spec import SinkSpec


def col(alias: str, name: str) -> str:
    return f"{alias}.{quote(name)}"


@dataclass(frozen=True)
class Clause:
    """One WHEN clause of a MERGE: ``kind`` is ``update`` or ``delete`` (WHEN MATCHED; a delete has no
    assignments) or ``insert`` (WHEN NOT MATCHED). Clauses apply in order: the first whose condition holds."""

    kind: Literal["update", "delete", "insert"]
    condition: str | None
    assignments: Mapping[str, str]  # quoted target column -> SQL expression over s / t


@dataclass(frozen=True)
class MergePlan:
    """A MERGE statement: the same text runs on delta-rs and on delta-spark. ``key_range`` is the source's
    range of the key columns, to prune the target by (empty: no pruning); it is not part of the text."""

    predicate: str
    clauses: tuple[Clause, ...]
    key_range: KeyRange = field(default_factory=KeyRange)
    source_alias: str = SOURCE_ALIAS
    target_alias: str = TARGET_ALIAS
    #: SCD type 1: the condition over a source row ``s`` and its key's target row ``t`` (left-joined: ``t``'s
    #: columns null when the key has no row) under which the MERGE fails as a conflicting tie (see
    #: :func:`merge_plan`), and the columns it compares; None when the MERGE checks no ties.
    ties: str | None = None
    tie_columns: tuple[str, ...] = ()


def _key_match(spec: SinkSpec) -> str:
    return " AND ".join(f"{col(TARGET_ALIAS, k)} = {col(SOURCE_ALIAS, k)}" for k in spec.keys)


def merge_plan(
    spec: SinkSpec, source: Sequence[str], table: pa.Schema, key_range: KeyRange, *, ordered: bool = False,
    tie_fail: str | None = None, sequence_type: pa.DataType | None = None,
) -> MergePlan:
    """The MERGE that applies a staged batch (:func:`sinks.delta.scd1.stage_scd1` or
    :func:`sinks.delta.scd2.main_source`), whose columns are ``source`` and whose key range is
    ``key_range``, to the main table, whose schema is ``table``.

    The source holds only changes newer than their key's head in the state table (the sequence guard ran in
    Arrow), so no clause compares sequences, and the main table needs no bookkeeping column to be correct.

    ``ordered`` (SCD type 1, ordered mode): the source was not guarded against a state table (there is none);
    where the table keeps ``sequence_by``, a matched row is changed only by a newer change (``s.seq > t.seq``),
    so a stale update is still never applied.

    ``tie_fail`` (SCD type 1; the engine's ``tie_fail``, a boolean SQL expression that fails the MERGE): a
    change whose sequence equals its key's stored one (safe mode: ``__cdc_tie``, set by the guard from the
    state table; ordered mode: ``s.seq = t.seq``, where the table keeps ``sequence_by``) changes nothing when
    it is the stored change again (the same values in the columns it sets, or a delete of a deleted key), and
    fails the MERGE (nothing committed) otherwise; :attr:`MergePlan.ties` then finds the conflict to name.
    Only such rows evaluate anything more: the check is a clause condition of rows the MERGE joins anyway.
    ``sequence_type`` is the sequence's type (default: the table's column's). A tie with a tombstone is never
    in the source (the guard drops the delete again and fails an upsert).
    """
    s, t = SOURCE_ALIAS, TARGET_ALIAS
    present = set(source)
    validity = {VALID_FROM, VALID_TO, IS_CURRENT}
    values = [f.name for f in table if f.name not in validity and f.name not in spec.keys]

    def from_source(c: str) -> str:
        return col(s, c) if c in present else "NULL"

    def overlay(c: str) -> str:
        # A partial change (see batch.fold_partial) keeps the target's value unless a change of the batch
        # newer than the key's head set the column (staging nulled the older setters).
        if SET_PREFIX + c not in present:
            return from_source(c)
        return f"CASE WHEN {col(s, SET_PREFIX + c)} IS NOT NULL THEN {col(s, c)} ELSE {col(t, c)} END"

    def row(extra: Mapping[str, str], *, keys: bool = True, over_target: bool = False) -> dict[str, str]:
        out = {quote(k): col(s, k) for k in spec.keys} if keys else {}
        for c in values:
            out[quote(c)] = overlay(c) if over_target else from_source(c)
        out.update({quote(k): v for k, v in extra.items() if k in table.names})
        return out

    predicate = _key_match(spec)
    clauses: tuple[Clause, ...]
    ties, tie_columns = None, ()
    if spec.scd_type == 1:
        is_delete = col(s, IS_DELETE)
        newer = f"{col(s, spec.sequence_by)} > {col(t, spec.sequence_by)}" if ordered and spec.sequence_by in table.names else None
        seq_type = sequence_type or (table.field(spec.sequence_by).type if spec.sequence_by in table.names else pa.int64())
        tie = _tie(spec, present, table, ordered, seq_type)
        checks: tuple[Clause, ...] = ()
        not_tie = ""
        if tie is not None and tie_fail is not None:
            compared = tuple(c for c in values if c in present and c != spec.sequence_by
                             and not pa.types.is_map(table.field(c).type))
            sames = [_same_set(spec, c, table.field(c).type, seq_type, present) for c in compared]
            differ = f"{is_delete} OR NOT ({' AND '.join(sames) or 'true'})"
            # (delta-rs evaluates every clause's condition on every row, matched or not: hence "t.k IS NOT NULL")
            found = f"{col(t, spec.keys[0])} IS NOT NULL"
            checks = (Clause("delete", f"CASE WHEN {found} AND {tie} AND ({differ}) THEN {tie_fail} ELSE false END", {}),)
            ties, tie_columns = f"COALESCE({tie}, false) AND (CASE WHEN {found} THEN {differ} ELSE NOT {is_delete} END)", compared
            if TIE in present:  # safe mode: a tied change never applies
                not_tie = f" AND NOT {tie}"
        delete = is_delete if newer is None else f"{is_delete} AND {newer}"
        update = newer if not not_tie else f"NOT {tie}" if newer is None else f"{newer}{not_tie}"
        clauses = (
            *checks,
            Clause("delete", delete + not_tie, {}),
            Clause("update", update, row({}, keys=False, over_target=True)),
            Clause("insert", f"NOT {is_delete}{not_tie}", row({})),
        )
    else:
        action = col(s, ACTION)
        matched = ", ".join(f"'{a}'" for a in MAIN_MATCHED_ACTIONS)
        valid_from, valid_to = col(s, FROM), col(s, TO)
        closed = {VALID_TO: valid_to, IS_CURRENT: "false"}
        current = f"{action} IN ({matched}) AND {col(t, VALID_TO)} IS NULL"
        history: tuple[Clause, ...] = ()
        if AT in present:  # a back-fill's actions match a stored version by its valid-from
            backfilled = ", ".join(f"'{a}'" for a in HISTORY_ACTIONS)
            same = _equal(col(t, VALID_FROM), col(s, AT), table.field(VALID_FROM).type)
            current = f"({current} OR ({action} IN ({backfilled}) AND {same}))"
            span = {VALID_FROM: valid_from, VALID_TO: valid_to, IS_CURRENT: f"{valid_to} IS NULL"}
            reshaped = {**span, spec.sequence_by: col(s, spec.sequence_by)}
            history = (
                Clause("update", f"{action} = 'reshape'", {quote(k): v for k, v in reshaped.items() if k in table.names}),
                Clause("update", f"{action} = 'replace'", row(span, keys=False)),
            )
        predicate += f" AND {current}"
        clauses = (
            *history,
            Clause("update", f"{action} = 'close'", {quote(k): v for k, v in closed.items() if k in table.names}),
            Clause("update", f"{action} = 'closeupd'", row(closed, keys=False)),
            Clause("update", f"{action} = 'inplace'", row({}, keys=False)),
            Clause(
                "insert",
                f"{action} = 'open'",
                row({VALID_FROM: valid_from, VALID_TO: valid_to, IS_CURRENT: f"{valid_to} IS NULL"}),
            ),
        )
    return MergePlan(predicate, clauses, _pruning(spec, key_range), ties=ties, tie_columns=tie_columns)


def _tie(spec: SinkSpec, present: set[str], table: pa.Schema, ordered: bool, seq_type: pa.DataType) -> str | None:
    """SQL: a source row's sequence equals its key's stored one (None: not knowable here)."""
    if TIE in present:
        return col(SOURCE_ALIAS, TIE)
    if ordered and spec.sequence_by in table.names:
        return _equal(col(SOURCE_ALIAS, spec.sequence_by), col(TARGET_ALIAS, spec.sequence_by), seq_type)
    return None


def _same_set(spec: SinkSpec, c: str, t: pa.DataType, seq_type: pa.DataType, present: set[str]) -> str:
    """SQL: column ``c`` of a source row equals the target's, or the change does not set ``c`` (a partial change:
    ``__cdc_set_<c>`` is not the change's own sequence)."""
    same = _not_distinct(col(SOURCE_ALIAS, c), col(TARGET_ALIAS, c), t)
    if SET_PREFIX + c not in present:
        return same
    own = _equal(col(SOURCE_ALIAS, SET_PREFIX + c), col(SOURCE_ALIAS, spec.sequence_by), seq_type)
    return f"(NOT COALESCE({own}, false) OR {same})"


def _not_distinct(a: str, b: str, t: pa.DataType) -> str:
    """``a`` and ``b`` (of type ``t``) are equal or both null; a struct field by field."""
    if not pa.types.is_struct(t):
        return f"({a} IS NOT DISTINCT FROM {b})"
    return "(" + " AND ".join(_not_distinct(f"{a}.{quote(f.name)}", f"{b}.{quote(f.name)}", f.type) for f in t) + ")"


def _equal(a: str, b: str, t: pa.DataType) -> str:
    """``a = b`` for two columns of type ``t``; a struct field by field (DataFusion compares no structs)."""
    if not pa.types.is_struct(t):
        return f"{a} = {b}"
    return " AND ".join(_equal(f"{a}.{quote(f.name)}", f"{b}.{quote(f.name)}", f.type) for f in t)


def _pruning(spec: SinkSpec, key_range: KeyRange) -> KeyRange:
    return key_range if spec.prune_by_key_range is not False else KeyRange()


def state_plan(spec: SinkSpec, key_range: KeyRange) -> MergePlan:
    """The MERGE that records a batch's new key heads (:func:`sinks.delta.state.state_source`), whose key
    range is ``key_range``, in the state table. Guarded by sequence, so merging the same batch twice changes
    nothing."""
    s, t = SOURCE_ALIAS, TARGET_ALIAS
    seq = spec.sequence_by
    head = {quote(seq): col(s, seq), quote(DELETED_AT): col(s, DELETED_AT)}
    clauses = (
        Clause("update", f"{col(s, seq)} > {col(t, seq)}", head),
        Clause("insert", None, {**{quote(k): col(s, k) for k in spec.keys}, **head}),
    )
    return MergePlan(_key_match(spec), clauses, _pruning(spec, key_range))
