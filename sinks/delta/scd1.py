"""SCD type 1: the MERGE source of the main table and the purge of old tombstones from the state table.

A delete removes the key's row from the main table and leaves a tombstone in the state table (the key, the
delete's sequence, ``__cdc_deleted_at``), so an older change arriving later loses on sequence (see
:mod:`sinks.delta.layout`). The tombstones are purged once older than ``tombstone_retention``; SCD type 2
keeps its tombstones with the history.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from sinks.delta.layout import DELETED_AT
from sinks.delta.merge import quote
from sinks.delta.spec import SinkSpec
from sinks.delta.state import guard


def stage_scd1(spec: SinkSpec, prepared: pa.Table, heads: pa.Table) -> pa.Table:
    """The SCD type 1 MERGE source of the main table: the batch's latest change per key, only where newer
    than the key's head in the state table (``heads``); the MERGE deletes, updates or inserts by
    ``__cdc_is_delete``."""
    return guard(spec, prepared, heads)


def purge_predicate(spec: SinkSpec, now: datetime) -> str | None:
    """Deletes (from the state table) tombstones older than the retention; None for SCD type 2, whose tombstones are kept with the
    history (a late change before an SCD2 tombstone is placed into history against it)."""
    if spec.scd_type == 2:
        return None
    # A string literal with an explicit UTC offset: both engines coerce it to the column's timestamp type
    # (DataFusion rejects a typed TIMESTAMP literal of another precision).
    cutoff = (now - spec.tombstone_retention).astimezone(UTC).isoformat()
    return f"{quote(DELETED_AT)} IS NOT NULL AND {quote(DELETED_AT)} < '{cutoff}'"
