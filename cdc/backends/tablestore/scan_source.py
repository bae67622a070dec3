"""The ``tablestore`` batch format: a table's current rows as a DataFrame (see :mod:`.scan`).

::

    cdc.register(spark)
    rows = (spark.read.format("tablestore").option("endpoint", ...).option("instance.name", ...)
            .option("table.name", "orders").option("catalog", '{"columns": {"amount": {"type": "double"}}}')
            .option("columns", "id,amount").load())

Filters: with the option ``filterPushdown=true`` and Spark's ``spark.sql.python.filterPushdown.enabled=true``
(Spark calls ``pushFilters`` only then), the filters this format takes (``=``, ``<``, ``>``, ``<=``, ``>=``,
``IN``, ``IS NULL`` on one column) are applied while reading (and narrow the key range when on the first key
column); the others stay with Spark. Without them Spark filters every row itself: the same answer, more rows
read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from cdc.backends.tablestore.scan import Comparison, ScanOptions, ScanPlanner, ScanRange
from cdc.options import parse

FORMAT = "tablestore"
_OPS: dict[type, str] = {
    EqualTo: "=",
    LessThan: "<",
    GreaterThan: ">",
    LessThanOrEqual: "<=",
    GreaterThanOrEqual: ">=",
    In: "in",
    IsNull: "is null",
}


def _literal(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray) else value


def to_comparison(f: Filter, columns: Sequence[str]) -> Comparison | None:
    """The :class:`Comparison` of a Spark filter this format can apply, else None."""
    op = _OPS.get(type(f))
    path: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if op is None or len(path) != 1 or path[0] not in columns:
        return None
    column = path[0]
    if op == "is null":
        return Comparison(column, op)
    value: Any = getattr(f, "value", None)
    if op == "in":
        values = tuple(_literal(v) for v in value or ())
        return None if not values or any(v is None for v in values) else Comparison(column, op, values)
    return None if value is None else Comparison(column, op, _literal(value))


class TablestoreScanPartition(InputPartition):
    """One range of the table; None when the filters leave no range (Spark needs a partition to read)."""

    def __init__(self, scan_range: ScanRange | None) -> None:
        super().__init__(scan_range)
        self.scan_range = scan_range


class TablestoreScanReader(DataSourceReader):
    """Reads the planned ranges; Spark filters the rows (see :class:`TablestorePushdownReader`)."""

    def __init__(self, planner: ScanPlanner) -> None:
        self.planner = planner
        self.filters: list[Comparison] = []
        self.reader = planner.reader()

    def partitions(self) -> Sequence[InputPartition]:
        ranges = self.planner.ranges(self.filters)
        return [TablestoreScanPartition(r) for r in ranges] or [TablestoreScanPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, TablestoreScanPartition)
        if partition.scan_range is not None:
            yield from self.reader.read(partition.scan_range)


class TablestorePushdownReader(TablestoreScanReader):
    """With ``filterPushdown=true``: takes the simple filters. A separate class because PySpark 4.2 fails a
    query whose reader merely defines ``pushFilters`` while ``spark.sql.python.filterPushdown.enabled`` is
    off (DATA_SOURCE_PUSHDOWN_DISABLED), and a data source cannot read that setting."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        columns = [n for n, _ in self.planner.keys + self.planner.values]
        for f in filters:
            comparison = to_comparison(f, columns)
            if comparison is None:
                yield f
            else:
                self.filters.append(comparison)
        self.reader = self.planner.reader(self.filters)


class TablestoreTableSource(DataSource):
    """``spark.read.format("tablestore")``: see the module docstring; options: :class:`.scan.ScanOptions`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.scan_options = parse(ScanOptions, dict(options), what=f"format {FORMAT!r}")
        self._planner: ScanPlanner | None = None

    @property
    def planner(self) -> ScanPlanner:
        if self._planner is None:
            self._planner = ScanPlanner(self.scan_options)
        return self._planner

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        schema: StructType = from_arrow_schema(self.planner.layout().schema())
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.scan_options.filter_pushdown:
            return TablestorePushdownReader(self.planner)
        return TablestoreScanReader(self.planner)
