"""The MERGE statement that applies a staged batch: one :class:`MergePlan`, whose text runs unchanged on
delta-rs (DataFusion SQL) and on delta-spark (Spark SQL), and the SQL quoting both engines parse alike.

The source of the MERGE is staged by :mod:`sinks.delta.scd1` or :mod:`sinks.delta.scd2`; the clauses here
rely on what staging put there (deletes already nulled, SCD type 2 actions in ``__cdc_action``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from cdc.model import COMMIT_TS
from sinks.delta.layout import (
    ACTION,
    DELETED_AT,
    FROM,
    IS_CURRENT,
    MATCHED_ACTIONS,
    NOW,
    SET_PREFIX,
    SOURCE_ALIAS,
    TARGET_ALIAS,
    TO,
    VALID_FROM,
    VALID_TO,
)
from sinks.delta.spec import SinkSpec


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


def key_range(spec: SinkSpec, source: pa.Table) -> str:
    """A pruning conjunct on the first key column's range in the batch ('' when not applicable)."""
    if not spec.prune_by_key_range or source.num_rows == 0:
        return ""
    k = spec.keys[0]
    mm = pc.min_max(source.column(k)).as_py()
    lo, hi = sql_literal(mm["min"]), sql_literal(mm["max"])
    if lo is None or hi is None:
        return ""
    return f" AND {col(TARGET_ALIAS, k)} >= {lo} AND {col(TARGET_ALIAS, k)} <= {hi}"


def _key_match(spec: SinkSpec) -> str:
    return " AND ".join(f"{col(TARGET_ALIAS, k)} = {col(SOURCE_ALIAS, k)}" for k in spec.keys)


def merge_plan(spec: SinkSpec, source: pa.Table, table: pa.Schema) -> MergePlan:
    """The MERGE that applies a prepared (SCD1) or staged (SCD2) batch to a table with schema ``table``."""
    s, t = SOURCE_ALIAS, TARGET_ALIAS
    present = set(source.column_names)
    seq = spec.sequence_by
    newer = f"{col(s, seq)} > {col(t, seq)}"
    hidden = {DELETED_AT, VALID_FROM, VALID_TO, IS_CURRENT}
    data = [f.name for f in table if f.name not in hidden]
    values = [c for c in data if c not in spec.keys]

    def from_source(c: str) -> str:
        return col(s, c) if c in present else "NULL"

    def overlay(c: str) -> str:
        # A partial change (see batch.fold_partial) keeps the target's value unless the batch set the column
        # after the target row's last change.
        if SET_PREFIX + c not in present:
            return from_source(c)
        return f"CASE WHEN {col(s, SET_PREFIX + c)} > {col(t, seq)} THEN {col(s, c)} ELSE {col(t, c)} END"

    def row(
        extra: Mapping[str, str], *, nulls: bool = False, keys: bool = True, over_target: bool = False
    ) -> dict[str, str]:
        out = {quote(k): col(s, k) for k in spec.keys} if keys else {}
        for c in values:
            keep = c == seq or c == COMMIT_TS
            if keep or not nulls:
                out[quote(c)] = overlay(c) if over_target and not keep else from_source(c)
            else:
                out[quote(c)] = "NULL"
        out.update({quote(k): v for k, v in extra.items()})
        return out

    predicate = _key_match(spec)
    clauses: tuple[Clause, ...]
    if spec.scd_type == 1:
        # The source is staged (scd1.stage_scd1): deletes already carry null values and their tombstone time,
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
    return MergePlan(predicate + key_range(spec, source), clauses)

