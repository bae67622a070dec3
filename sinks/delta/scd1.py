"""SCD type 1: the MERGE source (a delete becomes its key's tombstone) and the purge of old tombstones.

A delete does not remove the key's row: it nulls the value columns and stamps ``__cdc_deleted_at``, so an
older change arriving later loses on sequence (see :mod:`sinks.delta.layout`). The tombstones are purged once
older than ``tombstone_retention``; SCD type 2 keeps its tombstones with the history.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from cdc.model import COMMIT_TS
from sinks.delta.layout import DELETED_AT, IS_DELETE, NOW, SET_PREFIX, TIMESTAMP
from sinks.delta.merge import quote
from sinks.delta.spec import SinkSpec


def stage_scd1(spec: SinkSpec, prepared: pa.Table) -> pa.Table:
    """The SCD type 1 MERGE source: deletes get null values and ``__cdc_deleted_at`` (the tombstone's
    time); other rows a null ``__cdc_deleted_at``."""
    is_delete = prepared.column(IS_DELETE)
    keep = {*spec.keys, spec.sequence_by, COMMIT_TS, IS_DELETE, NOW}
    out = prepared
    if pc.any(is_delete).as_py():
        for i, f in enumerate(prepared.schema):
            if f.name not in keep and not f.name.startswith(SET_PREFIX):
                out = out.set_column(i, f, pc.if_else(is_delete, pa.nulls(out.num_rows, f.type), out.column(i)))
    stamp = pc.if_else(is_delete, prepared.column(NOW), pa.nulls(prepared.num_rows, TIMESTAMP))
    return out.append_column(pa.field(DELETED_AT, TIMESTAMP), stamp)


def purge_predicate(spec: SinkSpec, now: datetime) -> str | None:
    """Deletes tombstones older than the retention; None for SCD type 2, whose tombstones are kept with the
    history (a purged SCD2 tombstone would let a late, older change open a version overlapping history)."""
    if spec.scd_type == 2:
        return None
    # A string literal with an explicit UTC offset: both engines coerce it to the column's timestamp type
    # (DataFusion rejects a typed TIMESTAMP literal of another precision).
    cutoff = (now - spec.tombstone_retention).astimezone(UTC).isoformat()
    return f"{quote(DELETED_AT)} IS NOT NULL AND {quote(DELETED_AT)} < '{cutoff}'"
