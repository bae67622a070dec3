"""Partial changes: the real SDK writes PutRow / UpdateRow (put, delete-all-versions, delete-one-version
cells) / DeleteRow through the local server; the changes read through the backend (and through Spark)
carry ``_unchanged`` so that folding them per key in ``_seq`` order (an update keeps the columns it leaves
unchanged) gives exactly the rows the table holds, as GetRow returns them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tablestore as ots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World, drain

COLUMNS = ("v", "n", "w")
CATALOG = json.dumps(
    {
        "columns": {
            "id": {"type": "long"},
            "v": {"type": "string"},
            "n": {"type": "long"},
            "w": {"type": "string"},
        }
    }
)
IGNORE = ots.Condition(ots.RowExistenceExpectation.IGNORE)


@pytest.fixture(scope="module", autouse=True)
def sdk_sizes_timestamps() -> Iterator[None]:
    """The SDK (6.x) sizes an UpdateRow buffer without the cells' timestamps, so an UpdateRow with a
    DeleteOneVersion cell ``(name, None, ts)`` fails with "The buffer is full" before it is sent; count
    them (8 bytes and a tag each) so the real SDK can send what the service accepts."""
    from tablestore.plainbuffer.plain_buffer_builder import PlainBufferBuilder

    original = PlainBufferBuilder.compute_update_row_size

    def sized(primary_key: Any, attribute_columns: Any) -> int:
        stamps = sum(
            1
            for cells in attribute_columns.values()
            if isinstance(cells, list)
            for c in cells
            if isinstance(c, tuple) and len(c) == 3 and c[2] is not None
        )
        return int(original(primary_key, attribute_columns)) + 9 * stamps

    PlainBufferBuilder.compute_update_row_size = staticmethod(sized)  # type: ignore[method-assign]
    yield
    PlainBufferBuilder.compute_update_row_size = staticmethod(original)  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TablestoreProcess]:
    proc = TablestoreProcess(
        tmp_path_factory.mktemp("ots") / "data",
        instance="partial",
        access_key_id="partial-id",
        access_key_secret="partial-secret",
        max_records_per_read=7,
    )
    proc.start()
    yield proc
    proc.stop()


def value(col: str, i: int) -> Any:
    return i if col == "n" else f"{col}{i}"


# One write: ("put", key, columns) | ("update", key, puts, delete_all, delete_one) | ("delete", key)
cols = st.lists(st.sampled_from(COLUMNS), unique=True)
WRITE = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 4), cols),
    st.tuples(st.just("update"), st.integers(0, 4), cols, cols, cols),
    st.tuples(st.just("delete"), st.integers(0, 4)),
)


def apply(w: World, write: tuple[Any, ...], i: int) -> None:
    """Write through the real SDK."""
    kind, key = write[0], write[1]
    pk = [("id", key)]
    if kind == "put":
        w.sdk.put_row(w.table, ots.Row(pk, [(c, value(c, i)) for c in write[2]]), IGNORE)
    elif kind == "delete":
        w.sdk.delete_row(w.table, ots.Row(pk), IGNORE)
    else:
        puts, delete_all, delete_one = write[2], write[3], write[4]
        puts = [c for c in puts if c not in delete_all and c not in delete_one]
        delete_one = [c for c in delete_one if c not in delete_all]
        # DeleteOneVersion names a version by its timestamp: the current one (a column that has none
        # gets a timestamp no version has, which deletes nothing on the server).
        _, row, _ = w.sdk.get_row(w.table, pk, max_version=1)
        stamps = {c[0]: c[2] for c in (row.attribute_columns if row else [])}
        update: dict[str, Any] = {}
        if puts:
            update["put"] = [(c, value(c, i)) for c in puts]
        if delete_all:
            update["delete_all"] = list(delete_all)
        if delete_one:
            update["delete"] = [(c, None, stamps.get(c, 1)) for c in delete_one]
        if update:
            w.sdk.update_row(w.table, ots.Row(pk, update), IGNORE)


def fold(changes: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """What a sink does with partial changes: per key in _seq order; an update keeps _unchanged columns."""
    rows: dict[int, dict[str, Any]] = {}
    for c in sorted(changes, key=lambda r: r["_seq"]):
        key = c["id"]
        if c["_op"] == "delete":
            rows.pop(key, None)
            continue
        keep = set(c["_unchanged"] or ())
        if c["_op"] == "update":
            assert c["__ots_record_type__"] == "UPDATE"
            assert {col for col in COLUMNS if c[f"__ots_column_type_{col}"] is None} == keep
        else:
            assert not keep, f"a {c['_op']} is a whole row: {c}"
        before = rows.get(key, {})
        rows[key] = {col: before.get(col) if col in keep else c[col] for col in COLUMNS}
    return {k: r for k, r in rows.items() if any(v is not None for v in r.values())}


def table_now(w: World, keys: range = range(5)) -> dict[int, dict[str, Any]]:
    out = {}
    for key in keys:
        _, row, _ = w.sdk.get_row(w.table, [("id", key)], max_version=1)
        if row is not None and row.attribute_columns:
            values = {c[0]: c[1] for c in row.attribute_columns}
            out[key] = {col: values.get(col) for col in COLUMNS}
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(WRITE, min_size=1, max_size=25))
def test_folding_partial_changes_gives_the_table(
    server: TablestoreProcess, writes: list[tuple[Any, ...]]
) -> None:
    w = World(server, tunnel_type="Stream", extra_options={"catalog": CATALOG})
    w.create_tunnel()
    for i, write in enumerate(writes):
        apply(w, write, i)
    backend = w.backend()
    try:
        changes = [r for _, t in drain(backend, limit=4) for r in t.to_pylist()]
    finally:
        backend.close()
    assert len(changes) == sum(1 for wr in writes if wr[0] != "update" or any(wr[2:]))
    assert fold(changes) == table_now(w)


def test_base_data_rows_are_whole_and_updates_partial(server: TablestoreProcess) -> None:
    w = World(server, tunnel_type="BaseAndStream", extra_options={"catalog": CATALOG})
    w.sdk.put_row(w.table, ots.Row([("id", 1)], [("v", "a"), ("n", 1)]), IGNORE)
    w.create_tunnel()
    w.sdk.update_row(w.table, ots.Row([("id", 1)], {"put": [("w", "x")]}), IGNORE)
    w.sdk.update_row(w.table, ots.Row([("id", 1)], {"delete_all": ["v"]}), IGNORE)
    w.sdk.put_row(w.table, ots.Row([("id", 1)], [("n", 2)]), IGNORE)
    backend = w.backend()
    try:
        changes = [r for _, t in drain(backend) for r in t.to_pylist()]
    finally:
        backend.close()
    got = [(c["_op"], c["_unchanged"], c["v"], c["n"], c["w"]) for c in changes]
    assert got == [
        ("snapshot", None, "a", 1, None),
        ("update", ["v", "n"], None, None, "x"),
        ("update", ["n", "w"], None, None, None),
        ("insert", None, None, 2, None),
    ]
    assert fold(changes) == table_now(w) == {1: {"v": None, "n": 2, "w": None}}


@pytest.mark.spark
@pytest.mark.slow
def test_spark_reads_unchanged_columns(spark: Any, server: TablestoreProcess, tmp_path: Path) -> None:
    w = World(server, tunnel_type="Stream", extra_options={"catalog": CATALOG})
    w.create_tunnel()
    writes = [
        ("put", 1, ["v", "n", "w"]),
        ("update", 1, ["n"], [], []),
        ("update", 1, [], ["w"], []),
        ("update", 1, [], [], ["v"]),
        ("put", 2, ["w"]),
        ("delete", 1),
    ]
    for i, write in enumerate(writes):
        apply(w, write, i)
    reader = spark.readStream.format("cdc").option("backend", "tablestore")
    for k, v in w.options().items():
        reader = reader.option(k, v)
    df = reader.load()
    assert df.schema["_unchanged"].dataType.simpleString() == "array<string>"
    assert df.columns.index("_unchanged") == df.columns.index("_position") + 1
    q = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out")).orderBy("_seq").collect()
    got = [(r["_op"], r["id"], r["_unchanged"], r["v"], r["n"], r["w"]) for r in rows]
    assert got == [
        ("insert", 1, None, "v0", 0, "w0"),
        ("update", 1, ["v", "w"], None, 1, None),
        ("update", 1, ["v", "n"], None, None, None),
        ("update", 1, ["n", "w"], None, None, None),
        ("insert", 2, None, None, None, "w4"),
        ("delete", 1, None, None, None, None),
    ]
    assert [r["__ots_column_type_v"] for r in rows] == ["PUT", None, None, "DELETE_ONE_VERSION", None, None]


@pytest.mark.spark
@pytest.mark.slow
def test_partial_updates_stream_into_delta_equal_to_the_table(spark: Any, server: TablestoreProcess, tmp_path: Path) -> None:
    """End to end: random PutRow / UpdateRow / DeleteRow through the real SDK, a BaseAndStream tunnel read by
    the Spark source in small batches (partial updates of a key fall in one batch and across batches), applied
    by ``DeltaUpsertSink``: the Delta table equals what GetRow returns."""
    import random

    from sinks.delta import DeltaUpsertSink, read

    rng = random.Random(5)
    w = World(server, tunnel_type="BaseAndStream", extra_options={"catalog": CATALOG})
    for key in range(5):  # base data
        apply(w, ("put", key, list(COLUMNS)), key)
    w.create_tunnel()
    for i in range(5, 80):
        roll = rng.random()
        key = rng.randrange(6)
        if roll < 0.15:
            write: tuple[Any, ...] = ("put", key, rng.sample(COLUMNS, rng.randint(1, 3)))
        elif roll < 0.25:
            write = ("delete", key)
        else:
            picked = rng.sample(COLUMNS, rng.randint(1, 3))
            write = ("update", key, picked[:1], picked[1:2] if roll < 0.6 else [], picked[2:])
        apply(w, write, i)

    reader = spark.readStream.format("cdc").option("backend", "tablestore").option("maxRecordsPerTrigger", 9)
    for k, v in w.options().items():
        reader = reader.option(k, v)
    lake = str(tmp_path / "lake")
    sink = DeltaUpsertSink(lake, keys=["id"], sequence_by="_seq", except_columns=[f"__ots_column_type_{c}" for c in COLUMNS])
    q = (
        reader.load()
        .drop("__ots_record_type__", "__ots_record_timestamp__")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    got = {r["id"]: {c: r[c] for c in COLUMNS} for r in read(spark, lake).collect()}
    got = {k: row for k, row in got.items() if any(v is not None for v in row.values())}
    assert got == table_now(w, range(6))
