"""The delta-spark engine on the io.delta jars of ``make delta-spark``: the batch is prepared and merged inside
Spark (never collected), and every path gives the table delta-rs gives for the same changes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdc.backends.local import LocalLog
from cdc.errors import MalformedRecordError, OptionError
from sinks.delta import DeltaUpsertSink, read
from sinks.delta.layout import DELETED_AT, MODE_PROPERTY, STATE_DIR

pytestmark = pytest.mark.spark
TS = pa.timestamp("us", tz="UTC")
NOW = datetime(2025, 3, 1, tzinfo=UTC)


def changes(rows: list[tuple[str, int, int, str | None, int | None, list[str] | None]]) -> pa.Table:
    """(op, key, seq, a, b, unchanged) rows as a batch of change records."""
    return pa.table({
        "_op": pa.array([r[0] for r in rows], pa.string()),
        "id": pa.array([r[1] for r in rows], pa.int64()),
        "_seq": pa.array([r[2] for r in rows], pa.int64()),
        "_commit_ts": pa.array([NOW] * len(rows), TS),
        "a": pa.array([r[3] for r in rows], pa.string()),
        "b": pa.array([r[4] for r in rows], pa.int64()),
        "_unchanged": pa.array([r[5] for r in rows], pa.list_(pa.string())),
    })


BATCHES = [
    changes([("insert", 1, 1, "x", 1, None), ("insert", 2, 2, "y", 2, None), ("insert", 3, 3, "z", 3, None),
             ("update", 1, 4, "x2", 10, None), ("insert", 4, 5, "w", 4, None)]),
    changes([("delete", 2, 6, None, None, None), ("update", 3, 7, "junk", 30, ["a"]), ("update", 1, 2, "old", 0, None),
             ("update", 4, 8, "w2", 99, ["b"]), ("insert", 5, 9, "v", 5, None), ("update", 5, 10, "v2", 50, None)]),
    changes([("insert", 2, 11, "back", 20, None), ("update", 3, 12, "z3", 0, ["b"]), ("delete", 5, 13, None, None, None),
             ("update", 1, 4, "x2", 10, None)]),
    changes([("update", 6, 14, "new", 60, ["a"]), ("update", 4, 15, "w3", 40, None)]),
]


def table_rows(path: Path) -> list[dict[str, Any]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: tuple((k, str(v)) for k, v in sorted(r.items())))


def sink(path: Path, engine: str, scd_type: int, **kw: Any) -> DeltaUpsertSink:
    return DeltaUpsertSink(str(path), keys=["id"], scd_type=scd_type, engine=engine, app_id="t", compact_every=3,
                           clock=lambda: NOW, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("scd_type", [1, 2], ids=["scd1", "scd2"])
def test_frame_path_equals_delta_rs(spark: Any, tmp_path: Path, scd_type: int) -> None:
    """The same batches through delta-rs (Arrow) and through delta-spark's DataFrame path give equal tables
    (SCD2 history included) and equal state tables (tombstones, sequences, heads). SCD1 has two paths, chosen
    per batch: the JVM aggregation for full changes, Arrow buckets for a batch with partial changes; one SCD1
    history takes both in turn (even batches without ``_unchanged``, odd ones with it), so each path meets
    inserts, deletes, a stale update and a table the other path wrote. SCD2 always runs in Arrow buckets, so
    one history of partial and full changes mixed covers it (each case is ~10 Spark MERGEs)."""
    rs, ds = sink(tmp_path / "rs", "delta-rs", scd_type), sink(tmp_path / "ds", "delta-spark", scd_type)
    for i, batch in enumerate(BATCHES):
        if scd_type == 1 and i % 2 == 0:
            batch = batch.drop_columns(["_unchanged"])  # full changes: the JVM aggregation
        rs.write(batch, i)
        ds.write_frame(spark.createDataFrame(batch), i)
        assert table_rows(tmp_path / "ds") == table_rows(tmp_path / "rs"), f"after batch {i}"
        assert table_rows(tmp_path / "ds" / STATE_DIR) == table_rows(tmp_path / "rs" / STATE_DIR), f"state, batch {i}"
    assert not ds.write_frame(spark.createDataFrame(BATCHES[-1]), len(BATCHES) - 1), "a replay is skipped"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["one-source", "union"])
def test_batch_is_never_collected(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    """From foreachBatch, engine='delta-spark' merges without bringing the batch to the driver: every way
    to collect a DataFrame fails, except single-row results (the batch's checks and key range). Both modes:
    one cdc source over an ordered log runs ordered mode (the source's mark; one MERGE, no state table);
    a union of two such sources is not ordered and runs safe mode (the state table's MERGE too). The marked
    batch's reduction to each key's latest change does not look for ties (its sequences are distinct per key);
    the union's does."""
    import sinks.delta.sink as sink_module

    schema = [("id", pa.int64()), ("a", pa.string())]
    log = LocalLog.create(tmp_path / "log", schema, ["id"])
    mine = 50 if shape == "one-source" else 25  # keys of the first log; the union's second log has the rest
    log.append([{"_op": "insert", "id": i, "a": f"v{i}"} for i in range(mine)])
    log.append([{"_op": "delete", "id": i} for i in range(0, mine, 5)] + [{"_op": "update", "id": 1, "a": "w"}])
    if shape == "union":
        other = LocalLog.create(tmp_path / "log2", schema, ["id"])
        other.append([{"_op": "insert", "id": i, "a": f"v{i}"} for i in range(25, 50)])
        other.append([{"_op": "delete", "id": i} for i in range(25, 50, 5)])
    DataFrame = type(spark.range(1))  # the classic DataFrame (pyspark.sql.DataFrame is its abstract parent)
    real_collect = DataFrame.collect
    big: list[int] = []

    def collect(self: Any) -> Any:
        rows = real_collect(self)
        if len(rows) > 1:
            big.append(len(rows))
        return rows

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the batch was collected to the driver")

    monkeypatch.setattr(DataFrame, "collect", collect)
    for name in ("toArrow", "toPandas", "toLocalIterator", "_collect_as_arrow", "_collect_as_arrow_table"):
        if hasattr(DataFrame, name):
            monkeypatch.setattr(DataFrame, name, refuse)
    monkeypatch.setattr(sink_module, "collect_arrow", refuse)
    import sinks.delta.frame as frame

    ties: list[bool] = []
    real_stage = frame._stage_latest

    def stage(*args: Any, **kwargs: Any) -> Any:
        ties.append(kwargs.get("ties", True))
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(frame, "_stage_latest", stage)
    target = DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], engine="delta-spark")

    def stream(name: str) -> Any:
        return spark.readStream.format("cdc").option("backend", "local").option("path", str(tmp_path / name)).load()

    changes = stream("log") if shape == "one-source" else stream("log").unionByName(stream("log2"))
    q = (
        changes.writeStream.foreachBatch(target).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination()
    assert q.exception() is None
    assert not big, f"collected {big} rows"
    # One marked source: its _seq is distinct per key, so the reduction looks for no ties; a union is not.
    assert ties and set(ties) == {shape == "union"}
    monkeypatch.undo()
    got = {r["id"]: r["a"] for r in read(spark, str(tmp_path / "t")).collect()}
    assert got == {i: ("w" if i == 1 else f"v{i}") for i in range(50) if i % 5}
    mode = "ordered" if shape == "one-source" else "safe"
    assert DeltaTable(str(tmp_path / "t")).metadata().configuration[MODE_PROPERTY] == mode
    assert (tmp_path / "t" / STATE_DIR).exists() == (mode == "safe")


def test_ordered_batch_checks_run_in_the_merge_plan(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In ordered mode a batch of full changes runs no checking job of its own: its checks are a filter of the
    MERGE source. A batch that fails one (a truncate, a null key, an unknown _op) writes nothing there and runs
    the checked way, which applies the truncate or names what is wrong; prune_by_key_range=True runs it always."""
    import sinks.delta.frame as frame

    calls: list[int] = []
    real_check = frame.check

    def counted(spec: Any, df: Any) -> Any:
        calls.append(1)
        return real_check(spec, df)

    monkeypatch.setattr(frame, "check", counted)
    path = tmp_path / "t"
    ordered = sink(path, "delta-spark", 1, ordered=True)
    full = [b.drop_columns(["_unchanged"]) for b in BATCHES]
    ordered.write_frame(spark.createDataFrame(full[0]), 0)
    assert calls == [] and {r["id"]: r["a"] for r in table_rows(path)} == {1: "x2", 2: "y", 3: "z", 4: "w"}
    truncated = changes([("insert", 7, 16, "t", 7, None), ("truncate", 0, 17, None, None, None),
                         ("insert", 8, 18, "after", 8, None)]).drop_columns(["_unchanged"])
    ordered.write_frame(spark.createDataFrame(truncated), 1)
    assert calls and {r["id"]: r["a"] for r in table_rows(path)} == {8: "after"}
    calls.clear()  # (the changes after a truncate are checked again: two checks)
    version = DeltaTable(str(path)).version()
    for bad, words in (([("insert", None, 19, "k", 1, None)], "null 'id'"), ([("upsert", 9, 19, "k", 1, None)], "upsert")):
        with pytest.raises(MalformedRecordError, match=words):
            ordered.write_frame(spark.createDataFrame(changes(bad).drop_columns(["_unchanged"])), 2)
        assert DeltaTable(str(path)).version() == version, "nothing was written"
    assert calls == [1, 1]
    ordered.write_frame(spark.createDataFrame(full[3]), 2)
    assert calls == [1, 1] and {r["id"]: r["a"] for r in table_rows(path)} == {8: "after", 4: "w3", 6: "new"}
    pruned = sink(tmp_path / "p", "delta-spark", 1, ordered=True, prune_by_key_range=True)
    pruned.write_frame(spark.createDataFrame(full[0]), 0)
    assert calls == [1, 1, 1]


def test_read_uses_delta_reader(spark: Any, tmp_path: Path) -> None:
    """read() goes through format("delta") when the jars are there: it sees a table only Delta reads right
    (deletion vectors: the data files alone still hold deleted rows)."""
    path = str(tmp_path / "dv")
    rs = sink(tmp_path / "dv", "delta-rs", 1)
    rs.write(BATCHES[0].drop_columns(["_unchanged"]), 0)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")
    got = {r["id"] for r in read(spark, path).collect()}
    assert got == {1, 2, 4}
    assert DELETED_AT not in read(spark, path).columns


def auto_cdc_batch(rows: list[tuple[str, int, int, str | None, int | None, str]]) -> pa.Table:
    """(op, key, seq, a, b, kind) rows; ``kind`` is the source's own marker column (``t``: a truncate)."""
    return pa.table({
        "_op": pa.array([r[0] for r in rows], pa.string()),
        "id": pa.array([r[1] for r in rows], pa.int64()),
        "_seq": pa.array([r[2] for r in rows], pa.int64()),
        "a": pa.array([r[3] for r in rows], pa.string()),
        "b": pa.array([r[4] for r in rows], pa.int64()),
        "kind": pa.array([r[5] for r in rows], pa.string()),
    })


AUTO_CDC = [
    (auto_cdc_batch([("insert", 1, 1, "x", 1, ""), ("insert", 2, 2, "y", 2, ""), ("insert", 3, 3, "z", 3, "")]),
     {1: ("x", 1), 2: ("y", 2), 3: ("z", 3)}),
    # a's nulls in updates are ignored (also after an earlier change of the batch set it), b's are not; a new
    # key stores the null; a delete deletes.
    (auto_cdc_batch([("update", 1, 4, None, None, ""), ("update", 2, 5, "y2", 20, ""), ("update", 2, 6, None, 21, ""),
                     ("delete", 3, 7, None, None, ""), ("insert", 4, 8, None, 4, "")]),
     {1: ("x", None), 2: ("y2", 21), 4: (None, 4)}),
    # the truncate (kind = 't') drops the table and the batch's changes before it; those after it apply.
    (auto_cdc_batch([("insert", 5, 9, "gone", 9, ""), ("update", 2, 10, None, None, "t"), ("insert", 6, 11, "v", 6, ""),
                     ("update", 6, 12, None, 60, "")]),
     {6: ("v", 60)}),
]


class _Crash(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("ordered", [False, True], ids=["safe", "ordered"])
def test_auto_cdc_options_on_both_engines(spark: Any, tmp_path: Path, ordered: bool) -> None:
    """ignore_null_updates_column_list, except_column_list and apply_as_truncates (a Column) through the
    foreachBatch entry point: both engines give the expected table after every batch, in either mode. In safe
    mode delta-spark dies between the truncate batch's main and state commits, and the replay commits the
    state alone (the truncate does not empty the main table again)."""
    from pyspark.sql import functions as F

    def make(engine: str) -> DeltaUpsertSink:
        return DeltaUpsertSink(
            str(tmp_path / engine), keys=["id"], engine=engine, app_id="t", compact_every=None, ordered=ordered, clock=lambda: NOW,
            ignore_null_updates_column_list=["a"], except_column_list=["kind"], apply_as_truncates=F.col("kind") == "t",
        )

    def crash(*_: Any) -> None:
        raise _Crash("killed before the state's commit")

    sinks = {engine: make(engine) for engine in ("delta-rs", "delta-spark")}
    for i, (batch, expected) in enumerate(AUTO_CDC):
        frame = spark.createDataFrame(batch)
        for engine, target in sinks.items():
            if engine == "delta-spark" and not ordered and i == len(AUTO_CDC) - 1:
                target.state_engine(spark).merge_frame = crash  # type: ignore[attr-defined]
                with pytest.raises(_Crash):
                    target(frame, i)
                target = sinks[engine] = make(engine)
            target(frame, i)
            rows = DeltaTable(str(tmp_path / engine)).to_pyarrow_table()
            assert rows.column_names == ["id", "_seq", "a", "b"], engine
            assert {r["id"]: (r["a"], r["b"]) for r in rows.to_pylist()} == expected, f"{engine}, batch {i}"
        assert table_rows(tmp_path / "delta-spark") == table_rows(tmp_path / "delta-rs")
        if not ordered:
            assert table_rows(tmp_path / "delta-spark" / STATE_DIR) == table_rows(tmp_path / "delta-rs" / STATE_DIR)


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
@pytest.mark.parametrize("ordered", [True, False])
def test_a_refresh_deletes_the_rows_below_its_sequence_before_its_batch_merges(
    spark: Any, tmp_path: Path, engine: str, ordered: bool
) -> None:
    """A re-snapshot's end (``_op`` ``refresh`` at the sequence it began at): the rows it did not deliver, whose
    sequence is below it, are deleted, its batch's rows (its last chunk, changes) merged; a replay changes
    nothing. SCD type 2 and a table without its sequence column refuse it, naming the option."""
    path = tmp_path / "t"
    s = sink(path, engine, 1, ordered=ordered)

    def write(batch: pa.Table, batch_id: int, on: DeltaUpsertSink = s) -> bool:
        batch = batch.drop_columns(["_unchanged"])
        return on.write_frame(spark.createDataFrame(batch), batch_id) if engine == "delta-spark" else on.write(batch, batch_id)

    write(changes([("insert", k, k, f"v{k}", k, None) for k in range(1, 6)]), 0)
    # Chunk rows of 1 and 2 at sequence 10, a change of 4 after it began, then the end: 3 and 5 are gone.
    end = changes([("snapshot", 1, 10, "v1", 1, None), ("snapshot", 2, 10, "again", 2, None),
                   ("update", 4, 11, "v4b", 4, None), ("refresh", 0, 10, None, None, None)])
    assert write(end, 1)
    assert {r["id"]: r["a"] for r in table_rows(path)} == {1: "v1", 2: "again", 4: "v4b"}
    assert not write(end, 1), "a replay of the committed batch"
    assert {r["id"] for r in table_rows(path)} == {1, 2, 4}
    assert write(changes([("refresh", 0, 12, None, None, None)]), 2)  # a refresh alone: an empty table at its cut
    assert table_rows(path) == []
    hidden = sink(tmp_path / "h", engine, 1, ordered=ordered, bookkeeping_columns=["commit_ts"])
    write(changes([("insert", 1, 1, "x", 1, None)]), 0, hidden)
    with pytest.raises(OptionError, match="bookkeeping_columns"):
        write(changes([("refresh", 0, 5, None, None, None)]), 1, hidden)
    history = sink(tmp_path / "s", engine, 2, ordered=ordered)
    with pytest.raises(OptionError, match="scd_type"):
        write(changes([("refresh", 0, 5, None, None, None)]), 0, history)
