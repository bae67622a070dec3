"""Real Spark: streaming queries from the local change log into DeltaUpsertSink, read back with read()."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backends.local import LocalLog
from cdc.errors import MalformedRecordError
from sinks.delta import DeltaUpsertSink, read
from tests.sinks.delta.test_sink import check_composite, composite_sink, versioned

pytestmark = pytest.mark.spark
SCHEMA = [("id", pa.int64()), ("status", pa.string()), ("qty", pa.int64())]


def random_history(log: LocalLog, rounds: int, seed: int, source: dict[int, tuple[str, int]]) -> None:
    """Random inserts/updates/deletes in several appends (the source table is kept in ``source``)."""
    rng = random.Random(seed)
    for _ in range(rounds):
        rows: list[dict[str, Any]] = []
        for _ in range(rng.randint(5, 25)):
            key = rng.randrange(30)
            if key in source and rng.random() < 0.25:
                rows.append({"_op": "delete", "id": key})
                del source[key]
            else:
                value = (rng.choice(["new", "paid", "shipped"]), rng.randrange(100))
                rows.append({"_op": "update" if key in source else "insert", "id": key, "status": value[0], "qty": value[1]})
                source[key] = value
        log.append(rows)


def run(spark: Any, log: Path, ck: Path, sink: DeltaUpsertSink, max_records: int = 17) -> None:
    q = (
        spark.readStream.format("cdc").option("backend", "local").option("path", str(log))
        .option("maxRecordsPerTrigger", str(max_records)).load()
        .writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    )
    q.awaitTermination()
    assert q.exception() is None


def as_dict(df: Any) -> dict[int, tuple[str, int]]:
    return {r["id"]: (r["status"], r["qty"]) for r in df.collect()}


def test_stream_into_delta_equals_source(spark: Any, tmp_path: Path) -> None:
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source: dict[int, tuple[str, int]] = {}
    random_history(log, 4, seed=1, source=source)
    log.split(log.open_channels()[0])
    random_history(log, 3, seed=2, source=source)
    table = tmp_path / "orders"
    sink = DeltaUpsertSink(str(table), keys=["id"], compact_every=3)
    run(spark, tmp_path / "log", tmp_path / "ck", sink)
    df = read(spark, str(table))
    assert df.columns == ["id", "_seq", "_commit_ts", "status", "qty"]
    assert as_dict(df) == source
    assert df.count() == len(source)

    # More changes, a new column, and the same query restarted from its checkpoint.
    random_history(log, 2, seed=3, source=source)
    run(spark, tmp_path / "log", tmp_path / "ck", DeltaUpsertSink(str(table), keys=["id"]))
    assert as_dict(read(spark, str(table))) == source


def test_pipelined_mode_stages_then_merges(spark: Any, tmp_path: Path) -> None:
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source: dict[int, tuple[str, int]] = {}
    random_history(log, 5, seed=7, source=source)
    table = tmp_path / "orders"
    sink = DeltaUpsertSink(str(table), keys=["id"], pipelined=True, compact_every=2)
    run(spark, tmp_path / "log", tmp_path / "ck", sink, max_records=9)
    sink.flush()
    assert as_dict(read(spark, str(table))) == source
    assert not list((table / "_cdc_staging").rglob("*.arrow")), "committed batches leave no staged copy"
    from deltalake import DeltaTable

    app = json_app(table)
    assert app.startswith("cdc-tunnel-") and DeltaTable(str(table)).transaction_version(app) is not None


def json_app(table: Path) -> str:
    import json

    for f in sorted((table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            if "txn" in (action := json.loads(line)):
                return str(action["txn"]["appId"])
    return ""


def test_custom_delete_condition_is_evaluated_by_spark(spark: Any, tmp_path: Path) -> None:
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"])
    log.append([{"id": 1, "status": "new", "qty": 1}, {"id": 2, "status": "new", "qty": 2}])
    log.append([{"_op": "update", "id": 2, "status": "cancelled", "qty": 2}, {"_op": "delete", "id": 1}])
    log.append([{"id": 3, "status": "new", "qty": 3}])
    table = tmp_path / "t"
    sink = DeltaUpsertSink(str(table), keys=["id"], apply_as_deletes="_op = 'delete' OR status = 'cancelled'")
    run(spark, tmp_path / "log", tmp_path / "ck", sink, max_records=2)
    assert as_dict(read(spark, str(table))) == {3: ("new", 3)}


def test_scd2_read_returns_history(spark: Any, tmp_path: Path) -> None:
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"])
    log.append([{"id": 1, "status": "new", "qty": 1}])
    log.append([{"_op": "update", "id": 1, "status": "paid", "qty": 1}])
    log.append([{"_op": "delete", "id": 1}, {"id": 2, "status": "new", "qty": 5}])
    table = tmp_path / "t"
    run(spark, tmp_path / "log", tmp_path / "ck", DeltaUpsertSink(str(table), keys=["id"], scd_type=2), max_records=1)
    history = sorted((r["id"], r["status"], r["_valid_from"], r["_valid_to"], r["_is_current"]) for r in read(spark, str(table)).collect())
    assert history == [(1, "new", 1, 2, False), (1, "paid", 2, 3, False), (2, "new", 4, None, True)]
    assert as_dict(read(spark, str(table), current_only=True)) == {2: ("new", 5)}


def test_read_after_schema_evolution_and_empty_table(spark: Any, tmp_path: Path) -> None:
    s = DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], app_id="a")
    s.write(pa.table({"_op": ["insert"], "_seq": pa.array([1], pa.int64()), "id": pa.array([1], pa.int64())}), 0)
    s.write(pa.table({"_op": ["insert"], "_seq": pa.array([2], pa.int64()), "id": pa.array([2], pa.int64()),
                      "note": ["hi"]}), 1)
    assert sorted(tuple(r) for r in read(spark, str(tmp_path / "t")).collect()) == [(1, 1, None), (2, 2, "hi")]
    s.write(pa.table({"_op": ["delete", "delete"], "_seq": pa.array([3, 4], pa.int64()), "id": pa.array([1, 2], pa.int64())}), 2)
    assert read(spark, str(tmp_path / "t")).count() == 0


def test_delta_spark_engine_gives_the_same_table(spark: Any, tmp_path: Path) -> None:
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"])
    source: dict[int, tuple[str, int]] = {}
    random_history(log, 5, seed=4, source=source)
    for engine in ("delta-rs", "delta-spark"):
        sink = DeltaUpsertSink(str(tmp_path / engine), keys=["id"], engine=engine)
        run(spark, tmp_path / "log", tmp_path / f"ck-{engine}", sink)
    assert as_dict(read(spark, str(tmp_path / "delta-rs"))) == source
    got = spark.read.format("delta").load(str(tmp_path / "delta-spark"))
    assert as_dict(got) == source


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(0, 5)), min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 59), max_size=4),
    max_records=st.integers(1, 25),
    scd_type=st.sampled_from([1, 2]),
)
def test_random_histories_through_real_spark(
    spark: Any, ops: list[tuple[int, bool, int]], cuts: list[int], max_records: int, scd_type: int
) -> None:
    """A few hypothesis examples end to end: random appends (and a split) streamed by Spark into the sink."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = LocalLog.create(work / "log", SCHEMA, ["id"], channels=2)
        source: dict[int, tuple[str, int]] = {}
        bounds = sorted({0, len(ops), *(c for c in cuts if c < len(ops))})
        for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
            rows: list[dict[str, Any]] = []
            for key, delete, qty in ops[lo:hi]:
                if delete:
                    rows.append({"_op": "delete", "id": key})
                    source.pop(key, None)
                else:
                    rows.append({"_op": "update" if key in source else "insert", "id": key, "status": "s", "qty": qty})
                    source[key] = ("s", qty)
            log.append(rows)
            if n == 0:
                log.split(log.open_channels()[-1])
        sink = DeltaUpsertSink(str(work / "t"), keys=["id"], scd_type=scd_type, compact_every=2)
        run(spark, work / "log", work / "ck", sink, max_records=max_records)
        assert as_dict(read(spark, str(work / "t"), current_only=True)) == source


def test_partial_changes_through_foreach_batch(spark: Any, tmp_path: Path) -> None:
    """A partial change schema (``_unchanged``, as Tablestore's backend declares it) through Spark's collect:
    the foreachBatch entry point folds and merges it like the Arrow core."""
    from datetime import UTC, datetime

    from cdc.model import ChangeSchema

    schema = ChangeSchema.of(SCHEMA, ["id"], partial=True)
    ts = datetime(2025, 1, 1, tzinfo=UTC)

    def batch(rows: list[tuple[str, int, int, str | None, int | None, list[str] | None]]) -> Any:
        cols = list(zip(*rows, strict=True))
        t = pa.table({
            "_op": pa.array(cols[0], pa.string()), "_seq": pa.array(cols[1], pa.int64()),
            "_commit_ts": pa.array([ts] * len(rows), pa.timestamp("us", tz="UTC")),
            "_channel": pa.array(["c"] * len(rows)), "_position": pa.array(cols[1], pa.int64()),
            "_unchanged": pa.array(cols[5], pa.list_(pa.string())),
            "id": pa.array(cols[2], pa.int64()), "status": pa.array(cols[3], pa.string()), "qty": pa.array(cols[4], pa.int64()),
        }, schema=schema.arrow())
        return spark.createDataFrame(t.to_pandas(), schema=schema.spark())

    table = tmp_path / "t"
    sink = DeltaUpsertSink(str(table), keys=["id"], app_id="partial-test")
    sink(batch([("insert", 1, 1, "new", 1, None), ("insert", 2, 2, "new", 2, None)]), 0)
    sink(batch([("update", 3, 1, "junk", 10, ["status"]), ("update", 4, 1, "paid", 0, ["qty"]),
                ("update", 5, 3, "junk", 30, ["status"])]), 1)
    assert as_dict(read(spark, str(table))) == {1: ("paid", 10), 2: ("new", 2), 3: (None, 30)}


@pytest.mark.parametrize(("mode", "form"), [("safe", "list"), ("scd2", "struct")])
def test_sequence_by_several_columns_on_delta_spark(spark: Any, tmp_path: Path, mode: str, form: str) -> None:
    """The composite-sequence history of test_sink.py on delta-spark, cut to keep Spark's MERGEs few: SCD1 its
    first two batches (the third, a change older than a tombstone, meets the same guard as the second's stale
    change), SCD type 2 its first batch (a struct sequence through the history walk on the executors and its
    MERGE); bad sequences fail as on delta-rs. (Ordered mode's MERGE compares the sequence with the same text
    as the state table's MERGE here.)"""
    check_composite(str(tmp_path / "t"), mode, form, lambda s, t, i: s.write_frame(spark.createDataFrame(t), i),
                    engine="delta-spark", batches=2 if mode == "safe" else 1)
    if mode != "safe":
        return
    # Bad batches against the same table: they fail and leave it as it was.
    s = composite_sink(str(tmp_path / "t"), mode, form, engine="delta-spark")
    before = DeltaTable(str(tmp_path / "t")).version()
    key = 7
    tied = versioned([("insert", key, 1, 2, "v"), ("insert", key, 1, 2, "w"), ("insert", 8, 1, 2, "v")], form)
    with pytest.raises(MalformedRecordError, match=r'two changes of key \{"id":7\} have the same sequence'):
        s.write_frame(spark.createDataFrame(tied), 2)
    nulls = versioned([("insert", key, 1, 2, "v")], form)
    nulls = nulls.set_column(nulls.column_names.index("off"), "off", pa.array([None], pa.int32()))
    with pytest.raises(MalformedRecordError, match=r"null sequence \(column 'off' of sequence_by.*id=7"):
        s.write_frame(spark.createDataFrame(nulls), 2)
    assert DeltaTable(str(tmp_path / "t")).version() == before, "nothing was written"
