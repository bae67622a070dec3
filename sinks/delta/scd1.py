"""SCD type 1: the MERGE source of the main table, the conflicts it fails on, and the purge of old tombstones
from the state table.

A delete removes the key's row from the main table and leaves a tombstone in the state table (the key, the
delete's sequence, ``__cdc_deleted_at``), so an older change arriving later loses on sequence (see
:mod:`sinks.delta.layout`). The tombstones are purged once older than ``tombstone_retention``; SCD type 2
keeps its tombstones with the history.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from cdc.errors import MalformedRecordError
from sinks.delta.engine import Engine
from sinks.delta.keyrange import KeyRange, Rows
from sinks.delta.layout import DELETED_AT, IS_DELETE, SET_PREFIX, TIE, TIE_MARK, quote
from sinks.delta.merge import MergePlan
from sinks.delta.sequence import _same, tie_error
from sinks.delta.spec import SinkSpec
from sinks.delta.state import HELD, conform, guard, of_keys


def stage_scd1(spec: SinkSpec, prepared: pa.Table, heads: pa.Table, *, ordered: bool = False) -> pa.Table:
    """The SCD type 1 MERGE source of the main table: the batch's latest change per key, only where newer
    than the key's head in the state table (``heads``), or as new (``__cdc_tie``: the MERGE compares it with
    the stored row); the MERGE deletes, updates or inserts by ``__cdc_is_delete``. ``ordered``: there are no
    heads (the MERGE compares sequences)."""
    return guard(spec, prepared, heads, ties=not ordered)


def purge_predicate(spec: SinkSpec, now: datetime) -> str | None:
    """Deletes (from the state table) tombstones older than the retention; None for SCD type 2, whose tombstones are kept with the
    history (a late change before an SCD2 tombstone is placed into history against it)."""
    if spec.scd_type == 2:
        return None
    # A string literal with an explicit UTC offset: both engines coerce it to the column's timestamp type
    # (DataFusion rejects a typed TIMESTAMP literal of another precision).
    cutoff = (now - spec.tombstone_retention).astimezone(UTC).isoformat()
    return f"{quote(DELETED_AT)} IS NOT NULL AND {quote(DELETED_AT)} < '{cutoff}'"


def is_tie_failure(e: BaseException) -> bool:
    """True when ``e`` is a MERGE that failed on a conflicting tie (see :func:`sinks.delta.merge.merge_plan`)."""
    return TIE_MARK in str(e)


def tie_conflict(spec: SinkSpec, plan: MergePlan, change: dict[str, Any], stored: dict[str, Any] | None,
                 ordered: bool) -> MalformedRecordError | None:
    """The error for a change of a MERGE source that ties its key's stored change with other values (the
    stored row ``stored``; None: the key has no row), or None when it does not (a redelivery)."""
    seq = spec.sequence_by
    tied = stored is not None and _same(change.get(seq), stored.get(seq)) if ordered else bool(change.get(TIE))
    if not tied:
        return None
    if stored is None or change[IS_DELETE]:  # an upsert at a delete's sequence, or a delete at a live row's
        return None if stored is None and change[IS_DELETE] else tie_error(change, spec.keys, seq, ["_op"], HELD)

    def own(c: str) -> bool:
        return SET_PREFIX + c not in change or _same(change[SET_PREFIX + c], change[seq])

    differ = [c for c in plan.tie_columns if own(c) and not _same(change.get(c), stored.get(c))]
    return tie_error(change, spec.keys, seq, differ, HELD) if differ else None


def find_tie(spec: SinkSpec, plan: MergePlan, source: Any, main: Engine, ordered: bool) -> MalformedRecordError | None:
    """After a MERGE of the Arrow table ``source`` failed on a tie: the error naming the first conflict (the
    tied changes' keys read from the main table; only this failure pays for it)."""
    import pyarrow.compute as pc

    candidates = source if ordered else source.filter(pc.fill_null(source.column(TIE), False))
    keys = candidates.select(list(spec.keys))
    stored = conform(of_keys(main, Rows(KeyRange.of(spec.keys, keys)), keys), source.schema).to_pylist()
    by_key = {tuple(r[k] for k in spec.keys): r for r in stored}
    for change in candidates.to_pylist():
        error = tie_conflict(spec, plan, change, by_key.get(tuple(change[k] for k in spec.keys)), ordered)
        if error is not None:
            return error
    return None

