"""The ``tablestore`` batch format (a table's current rows, no tunnel) against the local server: ranges from
the service's split points, GetRange paging, projection, filters pushed or left to Spark; rows equal a plain
GetRange of the table through the SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNotNull, IsNull, LessThan, LessThanOrEqual
from tablestore import (
    INF_MAX,
    INF_MIN,
    CapacityUnit,
    Direction,
    OTSClient,
    ReservedThroughput,
    Row,
    TableMeta,
    TableOptions,
)

from cdc.backends.tablestore.scan import Comparison, ScanOptions, ScanPlanner
from cdc.backends.tablestore.scan_source import TablestorePushdownReader
from cdc.errors import OptionError
from cdc.options import parse
from cdc.servers.tablestore import LocalTablestore

CATALOG = '{"columns": {"v": {"type": "long"}, "name": {"type": "string"}, "f": {"type": "double"}}}'
ROWS = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTablestore]:
    with LocalTablestore(tmp_path_factory.mktemp("scan")) as local:
        sdk = _sdk(local)
        sdk.create_table(
            TableMeta("t", [("id", "INTEGER"), ("s", "STRING")]),
            TableOptions(),
            ReservedThroughput(CapacityUnit(0, 0)),
        )
        for i in range(ROWS):
            columns: list[tuple[str, Any]] = [
                ("v", i * 10),
                ("name", f"n{i % 7}"),
                ("extra", "not in the catalog"),
            ]
            if i % 5:
                columns.append(("f", i / 4))
            sdk.put_row("t", Row([("id", i // 2), ("s", f"k{i % 2}")], columns))
        yield local


def _sdk(server: LocalTablestore) -> OTSClient:
    return OTSClient(server.endpoint, server.access_key_id, server.access_key_secret, server.instance)


def _options(server: LocalTablestore, **extra: str) -> dict[str, str]:
    return {
        "endpoint": server.endpoint,
        "instance.name": server.instance,
        "table.name": "t",
        "access.key.id": server.access_key_id,
        "access.key.secret": server.access_key_secret,
        "catalog": CATALOG,
        **extra,
    }


def _planner(server: LocalTablestore, **extra: str) -> ScanPlanner:
    return ScanPlanner(parse(ScanOptions, _options(server, **extra), what="format 'tablestore'"))


def _expected(server: LocalTablestore) -> list[dict[str, Any]]:
    """The table through the SDK's own GetRange, in key order, as catalog rows."""
    sdk, out = _sdk(server), []
    start: Any = [("id", INF_MIN), ("s", INF_MIN)]
    while start is not None:
        _, start, rows, _ = sdk.get_range(
            "t", Direction.FORWARD, start, [("id", INF_MAX), ("s", INF_MAX)], max_version=1
        )
        for r in rows:
            cells = {c[0]: c[1] for c in r.attribute_columns}
            out.append(
                {
                    "id": r.primary_key[0][1],
                    "s": r.primary_key[1][1],
                    **{k: cells.get(k) for k in ("v", "name", "f")},
                }
            )
    return out


def _scan(planner: ScanPlanner, filters: list[Comparison] | None = None) -> tuple[list[dict[str, Any]], int]:
    reader = planner.reader(filters or [])
    ranges = planner.ranges(filters or [])
    batches = [b for r in ranges for b in reader.read(r)]
    table = pa.Table.from_batches(batches, schema=planner.layout().schema()) if batches else None
    return (table.to_pylist() if table is not None else []), len(ranges)


def test_ranges_follow_split_points_and_rows_equal_get_range(server: LocalTablestore) -> None:
    planner = _planner(server, splitSizeBytes="3000")
    assert len(planner.split_points()) >= 3
    rows, ranges = _scan(planner)
    assert ranges == len(planner.split_points()) + 1
    assert rows == _expected(server) and len(rows) == ROWS
    assert planner.layout().schema() == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("s", pa.string(), nullable=False),
            pa.field("v", pa.int64()),
            pa.field("name", pa.string()),
            pa.field("f", pa.float64()),
        ]
    )
    assert _scan(_planner(server))[1] == 1  # the default 100 MB: one range


def test_get_range_paging(server: LocalTablestore) -> None:
    planner = _planner(server, pageSize="7")
    reader = planner.reader()
    (whole,) = planner.ranges()
    rows = pa.Table.from_batches(list(reader.read(whole))).to_pylist()
    assert rows == _expected(server)
    assert reader.pages_read == -(-ROWS // 7)


def test_projection_through_the_columns_option(server: LocalTablestore) -> None:
    planner = _planner(server, columns="f, s", splitSizeBytes="5000")
    assert planner.layout().schema().names == ["s", "f"]  # table order, whatever the option's order
    assert planner.layout().columns_to_get() == ["id", "f"]  # a key column keeps rows without f
    rows, _ = _scan(planner)
    assert rows == [{"s": r["s"], "f": r["f"]} for r in _expected(server)]
    assert _planner(server, columns="id").layout().columns_to_get() == ["id"]


@pytest.mark.parametrize(
    "filters, narrows",
    [
        ([Comparison("id", "=", 42)], True),
        ([Comparison("id", ">", 80), Comparison("id", "<=", 90)], True),
        ([Comparison("id", "<", 3)], True),
        ([Comparison("id", "in", (7, 1, 55))], True),
        ([Comparison("s", "=", "k1"), Comparison("v", ">=", 1500)], False),
        ([Comparison("f", "is null")], False),
        ([Comparison("name", "in", ("n1", "n3")), Comparison("f", "<", 10.0)], False),
        ([Comparison("id", "=", "not an integer")], False),
    ],
)
def test_filters_on_key_and_value_columns(
    server: LocalTablestore, filters: list[Comparison], narrows: bool
) -> None:
    planner = _planner(server, splitSizeBytes="3000")
    rows, ranges = _scan(planner, filters)
    assert rows == [r for r in _expected(server) if all(f.test(r) for f in filters)]
    assert (ranges < len(planner.ranges())) == narrows


def test_push_filters_takes_the_simple_ones_and_hands_back_the_rest(server: LocalTablestore) -> None:
    reader = TablestorePushdownReader(_planner(server, splitSizeBytes="3000"))
    pushed = [
        EqualTo(("s",), "k0"),
        GreaterThan(("id",), 10),
        LessThan(("id",), 20),
        In(("name",), ("n1", "n2")),
        IsNull(("f",)),
        LessThanOrEqual(("nope",), 1),
        IsNotNull(("f",)),
    ]
    rest = list(reader.pushFilters(pushed))
    assert rest == [LessThanOrEqual(("nope",), 1), IsNotNull(("f",))]
    got = [row for p in reader.partitions() for b in reader.read(p) for row in b.to_pylist()]
    want = [
        r
        for r in _expected(server)
        if r["s"] == "k0" and 10 < r["id"] < 20 and r["name"] in ("n1", "n2") and r["f"] is None
    ]
    assert got == want and want


def test_bad_options_name_the_option(server: LocalTablestore) -> None:
    with pytest.raises(
        OptionError, match="option 'columns': 'nope' is not a column.*accepted values: id, s, v, name, f"
    ):
        _planner(server, columns="v,nope")
    with pytest.raises(OptionError, match="pageSize"):
        parse(ScanOptions, _options(server, pageSize="6000"), what="format 'tablestore'")
    with pytest.raises(OptionError, match="tunnel.name"):
        parse(ScanOptions, _options(server, **{"tunnel.name": "x"}), what="format 'tablestore'")


@pytest.mark.spark
@pytest.mark.slow
def test_spark_format_with_and_without_filter_pushdown(spark: Any, server: LocalTablestore) -> None:
    reader = spark.read.format("tablestore")
    for k, v in _options(server, splitSizeBytes="3000").items():
        reader = reader.option(k, v)
    df = reader.load()
    assert df.rdd.getNumPartitions() == len(_planner(server, splitSizeBytes="3000").ranges()) > 1
    assert [r.asDict() for r in df.orderBy("id", "s").collect()] == _expected(server)
    query = "id >= 20 AND id < 40 AND s = 'k1' AND f IS NOT NULL"
    want = [r for r in _expected(server) if 20 <= r["id"] < 40 and r["s"] == "k1" and r["f"] is not None]
    key = "spark.sql.python.filterPushdown.enabled"
    pushing = reader.option("filterPushdown", "true").load()
    try:
        assert [r.asDict() for r in df.where(query).orderBy("id").collect()] == want  # Spark filters
        with pytest.raises(Exception, match=key):  # PySpark refuses a pushdown reader without its setting
            pushing.where(query).collect()
        spark.conf.set(key, "true")
        for frame in (df, pushing):
            assert [r.asDict() for r in frame.where(query).orderBy("id").collect()] == want
        plan = pushing.where(query)._jdf.queryExecution().executedPlan().toString()
        assert "isnotnull(f" in plan and "(id >= 20)" not in plan, plan  # only IS NOT NULL stays with Spark
    finally:
        spark.conf.unset(key)
    projected = reader.option("filterPushdown", "false").option("columns", "name,id").load()
    assert projected.columns == ["id", "name"]
    assert projected.count() == ROWS


def test_filters_that_leave_no_range_read_nothing(server: LocalTablestore) -> None:
    reader = TablestorePushdownReader(_planner(server))
    assert list(reader.pushFilters([GreaterThan(("id",), 50), LessThan(("id",), 10)])) == []
    (partition,) = reader.partitions()
    assert list(reader.read(partition)) == []
