"""Pruning by key range: the typed bounds of a batch's key columns, and the rows a batch reads.

A batch touches only the keys it carries, so the sink reads the state table (and, SCD type 2, the main
table's current versions) and merges into both tables only within the batch's range of each key column:
Delta's per-file min/max statistics then skip the files that cannot hold one of its keys. Pruning is what
keeps a MERGE's cost near the files the batch touches instead of the whole table.

The bounds never become SQL text. They are Arrow scalars (:class:`KeyRange`), and each engine binds them as
typed values: a pyarrow dataset expression (delta-rs reads, each bound cast to the type the column is read
as), Spark ``Column`` literals (delta-spark reads and MERGEs). delta-rs's MERGE derives the same range from
the source itself (:class:`sinks.delta.rs.DeltaRsEngine`). A key column of a type that cannot be ordered
reliably (floating point: NaN; nested types) is not pruned: the batch is applied unpruned on that column.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sinks.delta.layout import VALID_TO, quote

log = logging.getLogger(__name__)

_ARROW_ERRORS = (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError)


def prunable(t: pa.DataType) -> bool:
    """True for the key types the sink prunes by range: integers, text, binary, decimal, date, timestamp
    and boolean (ordered the same way by Arrow, DataFusion, Spark and Delta's statistics; text and binary
    by their bytes)."""
    return bool(
        pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
        or pa.types.is_string_view(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t) or pa.types.is_decimal(t) or pa.types.is_date(t)
        or pa.types.is_timestamp(t) or pa.types.is_boolean(t)
    )


def _orderable(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """View types as their plain kind (Arrow's min/max has no kernel for views)."""
    if pa.types.is_string_view(column.type):
        return column.cast(pa.string())
    if pa.types.is_binary_view(column.type):
        return column.cast(pa.binary())
    return column


@dataclass(frozen=True)
class Bound:
    """The smallest and largest value of one key column in a batch."""

    column: str
    lo: pa.Scalar
    hi: pa.Scalar


@dataclass(frozen=True)
class KeyRange:
    """A batch's range of each prunable key column (no bounds: nothing is pruned)."""

    bounds: tuple[Bound, ...] = ()
    #: every key column is pruned (has a bound, or the batch is empty): an engine may derive the same range
    #: from the batch itself
    complete: bool = False

    @classmethod
    def of(cls, keys: Sequence[str], table: pa.Table) -> KeyRange:
        """The range of each key column of ``table`` (an empty table has no bounds: nothing is in range)."""
        if table.num_rows == 0:
            return cls(complete=all(prunable(table.schema.field(k).type) for k in keys))
        bounds = []
        for k in keys:
            column = table.column(k)
            if not prunable(column.type):
                continue
            try:
                mm = pc.min_max(_orderable(column))
            except _ARROW_ERRORS as e:  # a type Arrow cannot order: that column is applied unpruned
                log.debug("key column %r (%s) is not pruned: %s", k, column.type, e)
                continue
            bounds.append(Bound(k, mm["min"], mm["max"]))
        return cls(tuple(bounds), complete=len(bounds) == len(keys))

    @classmethod
    def of_values(cls, keys: Sequence[str], schema: pa.Schema, values: Iterable[tuple[str, Any, Any]]) -> KeyRange:
        """The range from Python values (``(column, min, max)``, e.g. a Spark aggregation's row), typed by
        ``schema``; columns of ``keys`` missing from ``values`` are not pruned."""
        bounds = []
        for column, lo, hi in values:
            t = schema.field(column).type
            if lo is None or hi is None or not prunable(t):
                continue
            bounds.append(Bound(column, pa.scalar(lo, t), pa.scalar(hi, t)))
        return cls(tuple(bounds), complete=len(bounds) == len(keys))

    def arrow(self, schema: pa.Schema) -> Any:
        """The range as a pyarrow dataset expression over data of ``schema``: each bound is cast to the
        column's type in ``schema`` (the type the files are read as), so both sides of every comparison have
        one type. A bound that does not cast leaves its column unpruned. None: nothing to prune."""
        import pyarrow.dataset as ds

        out = None
        for b in self.bounds:
            if b.column not in schema.names:
                continue
            t = schema.field(b.column).type
            try:
                lo, hi = b.lo.cast(t), b.hi.cast(t)
            except _ARROW_ERRORS as e:
                log.debug("key column %r is not pruned: its bounds do not cast to %s: %s", b.column, t, e)
                continue
            term = (ds.field(b.column) >= lo) & (ds.field(b.column) <= hi)
            out = term if out is None else out & term
        return out

    def spark(self, alias: str | None = None) -> Any:
        """The range as a Spark ``Column`` over the table (``alias``: the MERGE's target alias): the bounds
        are literals bound as typed values. None: nothing to prune."""
        from pyspark.sql import functions as F


        out = None
        for b in self.bounds:
            c = F.col(quote(b.column) if alias is None else f"{alias}.{quote(b.column)}")
            term = (c >= F.lit(b.lo.as_py())) & (c <= F.lit(b.hi.as_py()))
            out = term if out is None else out & term
        return out


@dataclass(frozen=True)
class Rows:
    """The rows a batch reads from a table: those in its key range; with ``current``, only current versions
    (SCD type 2's main table: ``_valid_to`` is null)."""

    key_range: KeyRange
    current: bool = False

    def arrow(self, schema: pa.Schema) -> Any:
        """As a pyarrow dataset expression over data of ``schema`` (None: every row)."""
        import pyarrow.dataset as ds

        out = self.key_range.arrow(schema)
        if self.current:
            out = ds.field(VALID_TO).is_null() if out is None else out & ds.field(VALID_TO).is_null()
        return out

    def spark(self) -> Any:
        """As a Spark ``Column`` (None: every row)."""
        from pyspark.sql import functions as F

        out = self.key_range.spark()
        if self.current:
            out = F.col(VALID_TO).isNull() if out is None else out & F.col(VALID_TO).isNull()
        return out
