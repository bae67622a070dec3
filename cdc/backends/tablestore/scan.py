"""Batch scan of a Tablestore table's current rows, without a tunnel (``spark.read.format("tablestore")``).

The table's columns only (the primary key from DescribeTable, the value columns of ``catalog``), not the
change model. The driver asks the service for split points (``ComputeSplitPointsBySize``) and plans one
range per split; each executor reads its range with ``GetRange``, page after page
(``next_start_primary_key``), decoding the rows with the module's PlainBuffer reader.

Filters (:class:`Comparison`) are checked on every row read (so a pushed filter is exact whatever the
service does), and those on the first primary-key column also narrow the ranges read. ``columns`` projects:
only the named value columns are asked for (``columns_to_get``; one key column always rides along, since
the service drops a row that has none of the requested columns).

Example::

    plan = ScanPlanner(parse(ScanOptions, options, what="format 'tablestore'"))
    for scan_range in plan.ranges([Comparison("id", ">=", 10)]):
        for batch in plan.reader().read(scan_range):
            ...
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pydantic import PositiveInt

from cdc.backends.tablestore.options import TablestoreConnection, parse_catalog
from cdc.backends.tablestore.plainbuffer import (
    INF_MAX,
    INF_MIN,
    PrimaryKeyValue,
    Row,
    decode_rows,
    encode_row,
)
from cdc.errors import MalformedRecordError, OptionError, requires_extra
from cdc.options import Field

if TYPE_CHECKING:
    from cdc.backends.tablestore.connection import TunnelClient

log = logging.getLogger(__name__)

Key = tuple[tuple[str, PrimaryKeyValue], ...]
_KEY_TYPES = {"INTEGER": pa.int64(), "STRING": pa.string(), "BINARY": pa.binary(), "BOOLEAN": pa.bool_()}
_ACCEPTS: dict[pa.DataType, tuple[type, ...]] = {
    pa.int64(): (int,),
    pa.float64(): (float, int),
    pa.bool_(): (bool,),
    pa.string(): (str,),
    pa.binary(): (bytes,),
}
OPERATORS = ("=", "<", ">", "<=", ">=", "in", "is null")
_MAX_PAGE_ROWS = 5000  # GetRange returns at most this many rows a call


class ScanOptions(TablestoreConnection):
    """Options of the ``tablestore`` batch format (the connection's are shared with ``backend=tablestore``)."""

    scope: ClassVar[str] = "batch"

    table_name: str = Field(alias="table.name", description="The table to read.")
    catalog: str | None = Field(
        None,
        alias="catalog",
        description='EMR-style JSON schema of the value columns: {"columns": {"<name>": {"type": "long"}}}; '
        "without it only the primary-key columns are read.",
    )
    columns: str | None = Field(
        None,
        alias="columns",
        description="Comma-separated columns to return (key or catalog columns), in table order; default all.",
    )
    split_size_bytes: PositiveInt = Field(
        100 * 1024 * 1024,
        alias="splitSizeBytes",
        description="About this many bytes of the table per partition (ComputeSplitPointsBySize).",
    )
    page_size: PositiveInt = Field(
        _MAX_PAGE_ROWS,
        alias="pageSize",
        le=_MAX_PAGE_ROWS,
        description=f"Rows per GetRange call (at most {_MAX_PAGE_ROWS}, the service's limit).",
    )
    filter_pushdown: bool = Field(
        False,
        alias="filterPushdown",
        description="Take Spark's simple filters (needs spark.sql.python.filterPushdown.enabled=true too: "
        "PySpark refuses a reader that takes filters while that setting is off).",
    )

    def client(self) -> TunnelClient:
        with requires_extra("tablestore", f"format {'tablestore'!r}"):
            from cdc.backends.tablestore.connection import RetrySettings, TunnelClient
        key_id, secret, token = self.credentials()
        return TunnelClient(
            self.endpoint,
            self.instance_name,
            key_id,
            secret,
            sts_token=token,
            socket_timeout=self.socket_timeout,
            retry=RetrySettings(attempts=self.max_attempts),
        )


@dataclass(frozen=True)
class Comparison:
    """``column <op> value``: ``op`` one of :data:`OPERATORS` (``in``: ``value`` is a tuple; ``is null``: none).

    Null never compares (SQL): a row without the column fails every comparison but ``is null``.
    """

    column: str
    op: str
    value: Any = None

    def test(self, row: dict[str, Any]) -> bool:
        v = row.get(self.column)
        if self.op == "is null":
            return v is None
        if v is None:
            return False
        try:
            if self.op == "=":
                return bool(v == self.value)
            if self.op == "in":
                return v in self.value
            if self.op == "<":
                return bool(v < self.value)
            if self.op == ">":
                return bool(v > self.value)
            if self.op == "<=":
                return bool(v <= self.value)
            return bool(v >= self.value)
        except TypeError:  # a value of another type than the column's never matches
            return False


@dataclass(frozen=True)
class ScanRange:
    """Rows with keys in ``[start, end)`` (full keys, INF_MIN/INF_MAX padded). Picklable."""

    start: Key
    end: Key


def _rank(key: Key) -> tuple[tuple[int, Any], ...]:
    """Tablestore's row order of (padded) keys: INF_MIN below every value, INF_MAX above."""
    return tuple((0, 0) if v is INF_MIN else (2, 0) if v is INF_MAX else (1, v) for _, v in key)


def _successor(value: PrimaryKeyValue) -> PrimaryKeyValue | None:
    """The smallest key value after ``value`` (None: none that can be written)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value + 1 if value < (1 << 63) - 1 else None
    if isinstance(value, str):
        return value + "\x00"
    if isinstance(value, bytes):
        return value + b"\x00"
    return None


@dataclass(frozen=True)
class TableLayout:
    """The table's columns as the scan returns them. Picklable."""

    keys: tuple[tuple[str, pa.DataType], ...]
    values: tuple[tuple[str, pa.DataType], ...]
    output: tuple[str, ...]
    filters: tuple[Comparison, ...] = ()

    @property
    def types(self) -> dict[str, pa.DataType]:
        return dict(self.keys + self.values)

    def schema(self) -> pa.Schema:
        types, key_names = self.types, {k for k, _ in self.keys}
        return pa.schema([pa.field(n, types[n], nullable=n not in key_names) for n in self.output])

    def columns_to_get(self) -> list[str]:
        """Value columns to ask for (output and filtered ones) plus a key column; [] asks for every column."""
        value_names = {n for n, _ in self.values}
        wanted = [n for n in self.output if n in value_names]
        wanted += [f.column for f in self.filters if f.column in value_names and f.column not in wanted]
        if len(wanted) == len(value_names):
            return []
        return [self.keys[0][0], *wanted]

    def to_batch(self, rows: Sequence[Row]) -> pa.RecordBatch:
        types, filters, output = self.types, self.filters, self.output
        key_names = {k for k, _ in self.keys}
        kept: list[dict[str, Any]] = []
        for row in rows:
            values: dict[str, Any] = dict(row.primary_key)
            for cell in row.cells:
                if cell.name in types and cell.name not in key_names:
                    values[cell.name] = cell.value
            if all(f.test(values) for f in filters):
                kept.append(values)
        arrays = []
        for name in output:
            column = [r.get(name) for r in kept]
            accepts = _ACCEPTS[types[name]]
            for v in column:
                if v is not None and type(v) not in accepts:
                    raise MalformedRecordError(
                        f"column {name!r}: value of type {type(v).__name__} does not fit {types[name]}"
                    )
            arrays.append(pa.array(column, type=types[name]))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema())


class ScanPlanner:
    """The driver side: the table's layout and its ranges (see the module docstring)."""

    def __init__(self, options: ScanOptions) -> None:
        self.options = options
        self.client = options.client()
        keys = []
        for name, kind in self.client.describe_table(options.table_name).primary_key:
            if kind not in _KEY_TYPES:
                raise OptionError(
                    f"table {options.table_name!r}: key column {name!r} has type {kind}", "table.name"
                )
            keys.append((str(name), _KEY_TYPES[kind]))
        key_names = {k for k, _ in keys}
        values = [
            (n, t) for n, t in parse_catalog(options.catalog or '{"columns": {}}') if n not in key_names
        ]
        self.keys, self.values = tuple(keys), tuple(values)
        names = [n for n, _ in keys + values]
        output = names
        if options.columns is not None:
            chosen = [c.strip() for c in options.columns.split(",") if c.strip()]
            unknown = [c for c in chosen if c not in names]
            if unknown or not chosen:
                raise OptionError(
                    f"option 'columns': {', '.join(map(repr, unknown)) or 'no column'} is not a column of the "
                    f"table; accepted values: {', '.join(names)}",
                    "columns",
                )
            output = [n for n in names if n in chosen]
        self.output = tuple(output)

    def layout(self, filters: Sequence[Comparison] = ()) -> TableLayout:
        return TableLayout(self.keys, self.values, self.output, tuple(filters))

    def split_points(self) -> list[Key]:
        """The service's split points for ``splitSizeBytes`` (increasing keys, possibly shorter than the key)."""
        from cdc.backends.tablestore import table_pb as pb

        req = pb.ComputeSplitPointsBySizeRequest(
            table_name=self.options.table_name,
            split_size=self.options.split_size_bytes,
            split_size_unit_in_byte=1,
        )
        resp = self.client.call("/ComputeSplitPointsBySize", req, pb.ComputeSplitPointsBySizeResponse)
        return [decode_rows(point)[0].primary_key for point in resp.split_points]

    def _pad(self, key: Key, fill: PrimaryKeyValue) -> Key:
        given = dict(key)
        return tuple((name, given.get(name, fill)) for name, _ in self.keys)

    def bounds(self, filters: Sequence[Comparison]) -> ScanRange:
        """The key range the filters on the first key column allow (the others are checked on rows)."""
        first = self.keys[0][0]
        rest = self.keys[1:]
        low: Key = self._pad((), INF_MIN)
        high: Key = self._pad((), INF_MAX)

        def at(value: PrimaryKeyValue, fill: PrimaryKeyValue) -> Key:
            return ((first, value), *((n, fill) for n, _ in rest))

        def after(value: PrimaryKeyValue) -> Key | None:  # the first key past every key starting with value
            if rest:
                return at(value, INF_MAX)
            nxt = _successor(value)
            return None if nxt is None else ((first, nxt),)

        for f in filters:
            if f.column != first or f.op == "is null" or f.value is None:
                continue
            values = list(f.value) if f.op == "in" else [f.value]
            if not values or any(type(v) not in _ACCEPTS[self.keys[0][1]][:1] for v in values):
                continue  # a literal of another type than the key: no narrowing, the rows decide
            lo_key = at(min(values), INF_MIN) if f.op in ("=", "in", ">", ">=") else None
            hi_key = after(max(values)) if f.op in ("=", "in", "<=") else None
            hi_key = at(f.value, INF_MIN) if f.op == "<" else hi_key
            if lo_key is not None and _rank(lo_key) > _rank(low):
                low = lo_key
            if hi_key is not None and _rank(hi_key) < _rank(high):
                high = hi_key
        return ScanRange(low, high)

    def ranges(self, filters: Sequence[Comparison] = ()) -> list[ScanRange]:
        """One range per split, cut to the filters' key range; empty ranges dropped."""
        bound = self.bounds(filters)
        cuts = [self._pad(p, INF_MIN) for p in self.split_points()]
        starts = [self._pad((), INF_MIN), *cuts]
        ends = [*cuts, self._pad((), INF_MAX)]
        out = []
        for start, end in zip(starts, ends, strict=True):
            lo = start if _rank(start) >= _rank(bound.start) else bound.start
            hi = end if _rank(end) <= _rank(bound.end) else bound.end
            if _rank(lo) < _rank(hi):
                out.append(ScanRange(lo, hi))
        log.info(
            "table %s: %d split point(s), %d range(s) to read", self.options.table_name, len(cuts), len(out)
        )
        return out

    def reader(self, filters: Sequence[Comparison] = ()) -> ScanReader:
        return ScanReader(self.client, self.options.table_name, self.layout(filters), self.options.page_size)


@dataclass
class ScanReader:
    """The executor side: reads one range page by page. Picklable (the client reopens its pool)."""

    client: TunnelClient
    table: str
    layout: TableLayout
    page_size: int
    pages_read: int = field(default=0, compare=False)

    def read(self, scan_range: ScanRange) -> Iterator[pa.RecordBatch]:
        from cdc.backends.tablestore import table_pb as pb

        start, columns = scan_range.start, self.layout.columns_to_get()
        end = encode_row(Row(scan_range.end))
        while True:
            req = pb.GetRangeRequest(
                table_name=self.table,
                direction=pb.FORWARD,
                max_versions=1,
                limit=self.page_size,
                inclusive_start_primary_key=encode_row(Row(start)),
                exclusive_end_primary_key=end,
            )
            req.columns_to_get.extend(columns)
            resp = self.client.call("/GetRange", req, pb.GetRangeResponse)
            self.pages_read += 1
            rows = decode_rows(resp.rows) if resp.rows else []
            if rows:
                yield self.layout.to_batch(rows)
            if not resp.next_start_primary_key:
                return
            start = decode_rows(resp.next_start_primary_key)[0].primary_key
