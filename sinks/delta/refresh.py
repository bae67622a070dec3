"""Applying a ``refresh`` record (see :class:`cdc.model.Op`): a table's re-snapshot at the source has delivered its
last row, and every row whose sequence is below the record's is gone at the source.

Every row the re-snapshot delivered, and every change after it started, has a larger sequence; a row of the table
with a smaller one (or none: a row written to the table by other means) is one the source no longer has, and is
deleted. The delete runs before the batch's MERGE, and only while the batch has not committed to the table, as a
truncate does: a replay after a crash deletes the same rows again and merges the batch, so the batch's own rows
(its last chunk) are never removed. It needs the table to keep ``sequence_by`` (an integer: the change model's
``_seq``), and SCD type 1 (SCD type 2 keeps history rows whose sequences are old by design).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import OptionError
from cdc.model import OP, Op
from sinks.delta.engine import Engine
from sinks.delta.layout import quote
from sinks.delta.spec import SinkSpec

log = logging.getLogger(__name__)


def without_refreshes(spec: SinkSpec, batch: pa.Table) -> tuple[pa.Table, int | None]:
    """(the batch without its ``refresh`` records, the largest sequence among them), or (the batch, None)."""
    if OP not in batch.column_names or batch.num_rows == 0:
        return batch, None
    is_refresh = pc.fill_null(pc.equal(batch.column(OP), Op.REFRESH.value), False)
    if not pc.any(is_refresh).as_py():
        return batch, None
    return batch.filter(pc.invert(is_refresh)), refresh_sequence(spec, batch.filter(is_refresh).column(spec.sequence_by))


def refresh_sequence(spec: SinkSpec, values: Any) -> int:
    """The sequence a refresh deletes below: the largest of its records' (a later re-snapshot supersedes)."""
    if not pa.types.is_integer(values.type):
        raise OptionError(
            f"option 'sequence_by': a refresh record (a re-snapshot's end) deletes the rows whose sequence is below "
            f"its own, which needs the change model's integer _seq as sequence_by, not {spec.sequence_by!r} "
            f"({values.type})", "sequence_by")
    return int(pc.max(values).as_py())


def refresh_predicate(spec: SinkSpec, schema: pa.Schema | None, at: int, path: str) -> str | None:
    """The delete of a refresh at sequence ``at`` (None: no table yet, nothing to delete); refuses, naming the
    option, a table that cannot tell its rows' sequences."""
    if spec.scd_type != 1:
        raise OptionError(
            f"option 'scd_type': a refresh record (a re-snapshot's end) deletes the rows of {path} the source no "
            "longer has, which SCD type 2's history cannot tell apart; accepted value: 1", "scd_type")
    if schema is None:
        return None
    if spec.sequence_by not in schema.names:
        raise OptionError(
            f"option 'bookkeeping_columns': a refresh record (a re-snapshot's end) deletes the rows of {path} whose "
            f"sequence is below its own, and the table does not keep its sequence column {spec.sequence_by!r}: "
            "include 'sequence' in bookkeeping_columns (it applies when the table is created)", "bookkeeping_columns")
    column = quote(spec.sequence_by)
    return f"{column} < {int(at)} OR {column} IS NULL"


def apply_refresh(spec: SinkSpec, main: Engine, at: int | None, done: bool, batch_id: int, path: str) -> None:
    """Delete the rows of a refresh at ``at`` (None: the batch holds none) from the main table (one commit), unless
    the batch committed there."""
    if at is None:
        return
    where = refresh_predicate(spec, main.schema(), at, path)
    if done or where is None:
        return
    main.delete(where)
    log.info("batch %d: a re-snapshot that began at sequence %d ended: rows below it deleted from %s", batch_id, at,
             path)
