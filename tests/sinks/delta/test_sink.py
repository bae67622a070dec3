"""The sink's core on real delta-rs tables: options, schema evolution, tombstones, compaction, pruning.

The main table is read with ``deltalake`` directly (a plain Delta table of live rows); tombstones and
sequences are checked in the state table ``<path>/_cdc_state``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdc.errors import MalformedRecordError, OptionError, TerminalError
from sinks.delta import DeltaUpsertSink, SchemaEvolutionError
from sinks.delta.layout import DELETED_AT, LegacyLayoutError, state_path

TS = pa.timestamp("us", tz="UTC")


def changes(rows: list[tuple[Any, ...]], extra: dict[str, pa.Array] | None = None) -> pa.Table:
    """rows: (op, seq, id, name, qty)."""
    t = pa.table({
        "_op": pa.array([r[0] for r in rows], pa.string()),
        "_seq": pa.array([r[1] for r in rows], pa.int64()),
        "_commit_ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * len(rows), TS),
        "_channel": pa.array(["c0"] * len(rows), pa.string()),
        "_position": pa.array(range(len(rows)), pa.int64()),
        "id": pa.array([r[2] for r in rows], pa.int64()),
        "name": pa.array([r[3] for r in rows], pa.string()),
        "qty": pa.array([r[4] for r in rows], pa.int64()),
    })
    for name, arr in (extra or {}).items():
        t = t.append_column(name, arr)
    return t


def live(path: Path) -> dict[int, dict[str, Any]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert all(DELETED_AT not in r for r in rows), "no tombstone column in the main table"
    return {r["id"]: r for r in rows}


def state(path: Path) -> dict[Any, tuple[int, bool]]:
    """The state table: per key, (last applied sequence, is a tombstone)."""
    rows = DeltaTable(state_path(str(path))).to_pyarrow_table().to_pylist()
    return {r["id"]: (r["_seq"], r[DELETED_AT] is not None) for r in rows}


def sink(path: Path, **kw: Any) -> DeltaUpsertSink:
    kw.setdefault("app_id", "test")
    kw.setdefault("compact_every", None)
    return DeltaUpsertSink(str(path), keys=["id"], **kw)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"keys": []}, "keys"),
        ({"keys": ["id", "id"]}, "keys"),
        ({"scd_type": 3}, "scd_type"),
        ({"except_columns": ["id"]}, "except_columns"),
        ({"except_columns": ["_seq"]}, "except_columns"),
        ({"track_history_column_list": ["name"]}, "track_history_column_list"),  # needs scd_type=2
        ({"track_history_except_column_list": ["name"]}, "track_history_except_column_list"),  # the same
        ({"scd_type": 2, "track_history_except_column_list": ["id"]}, "track_history_except_column_list"),  # a key
        ({"scd_type": 2, "track_history_column_list": "name"}, "track_history_column_list"),  # a list
        ({"scd_type": 2, "track_history_column_list": ["name"], "track_history_except_column_list": ["qty"]},
         "track_history_column_list"),
        ({"scd_type": 2, "track_history_columns": ["name"], "track_history_column_list": ["name"]},
         "track_history_columns"),
        ({"engine": "duckdb"}, "engine"),
        ({"compact_every": 0}, "compact_every"),
        ({"sequence_by": "id"}, "sequence_by"),
        ({"tombstone_retention": timedelta(days=-1)}, "tombstone_retention"),
        ({"bookkeeping_columns": ["_seq"]}, "bookkeeping_columns"),  # tokens, not column names
        ({"bookkeeping_columns": ["is_current"]}, "bookkeeping_columns"),  # SCD type 2 only
        ({"except_column_list": ["id"]}, "except_column_list"),
        ({"column_list": "name"}, "column_list"),  # a list, not one name
        ({"ignore_null_updates_column_list": ["_seq"]}, "ignore_null_updates_column_list"),
        ({"apply_as_truncates": "_op = 't'", "scd_type": 2}, "apply_as_truncates"),
        ({"apply_as_truncates": " "}, "apply_as_truncates"),
        ({"apply_as_truncates": 1}, "apply_as_truncates"),
    ],
)
def test_bad_options_name_the_option(tmp_path: Path, kwargs: dict[str, Any], option: str) -> None:
    args: dict[str, Any] = {"keys": ["id"], **kwargs}
    with pytest.raises(OptionError) as e:
        DeltaUpsertSink(str(tmp_path / "t"), **args)
    assert e.value.option == option and option in str(e.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"column_list": ["name"], "except_column_list": ["qty"]},
        {"ignore_null_updates_column_list": ["name"], "ignore_null_updates_except_column_list": ["qty"]},
        {"ignore_null_updates": True, "ignore_null_updates_column_list": ["name"]},
        {"except_columns": ["qty"], "except_column_list": ["qty"]},
    ],
)
def test_exclusive_options_given_together_name_both(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(OptionError) as e:
        DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], **kwargs)
    assert all(f"'{name}'" in str(e.value) for name in kwargs)


@pytest.mark.parametrize(
    "option",
    ["column_list", "except_column_list", "ignore_null_updates_column_list", "ignore_null_updates_except_column_list"],
)
def test_a_list_naming_an_unknown_column_fails_the_batch_naming_option_and_column(tmp_path: Path, option: str) -> None:
    s = sink(tmp_path / "t", **{option: ["name", "colour"]})
    with pytest.raises(OptionError, match=rf"option '{option}' names column\(s\) \['colour'\]") as e:
        s.write(changes([("insert", 1, 1, "a", 1)]), 0)
    assert e.value.option == option
    assert not (tmp_path / "t" / "_delta_log").exists()


def test_column_lists_choose_the_stored_columns_and_except_columns_still_works(tmp_path: Path) -> None:
    extra = {"note": pa.array(["n"], pa.string())}
    sink(tmp_path / "a", column_list=["qty"]).write(changes([("insert", 1, 1, "a", 1)], extra), 0)
    assert DeltaTable(str(tmp_path / "a")).schema().to_arrow().names == ["id", "_seq", "_commit_ts", "qty"]
    sink(tmp_path / "b", except_column_list=["qty", "note"]).write(changes([("insert", 1, 1, "a", 1)], extra), 0)
    assert DeltaTable(str(tmp_path / "b")).schema().to_arrow().names == ["id", "_seq", "_commit_ts", "name"]
    with pytest.warns(DeprecationWarning, match="'except_columns' is deprecated; use 'except_column_list'"):
        old = sink(tmp_path / "c", except_columns=["qty"])
    assert old.spec.except_column_list == ("qty",)


@pytest.mark.parametrize("mode", ["safe", "ordered", "scd2", "scd2-ordered"])
def test_ignore_null_updates_keeps_stored_values_and_leaves_inserts_and_deletes_alone(tmp_path: Path, mode: str) -> None:
    """A null in an update of an ignored column keeps the stored value (also after an earlier change of the same
    batch set it); a column outside the list takes the null; a key without a row gets the null; a delete
    deletes. SCD type 2 (both modes): the new version takes the value from the current one."""
    kw: dict[str, Any] = {"ordered": mode.endswith("ordered")}
    if mode.startswith("scd2"):
        kw["scd_type"], mode = 2, "scd2"
    s = sink(tmp_path / "t", ignore_null_updates_column_list=["name"], **kw)
    s.write(changes([("insert", 1, 1, "a", 1), ("insert", 2, 2, "b", 2), ("insert", 3, 3, "c", 3)]), 0)
    s.write(changes([("update", 4, 1, None, None),  # name kept, qty nulled
                     ("insert", 5, 4, None, 4),  # a new key: the null is stored
                     ("update", 6, 2, "b2", 20), ("update", 7, 2, None, 21),  # the batch's own earlier value kept
                     ("delete", 8, 3, None, None)]), 1)
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    current = {r["id"]: (r["name"], r["qty"]) for r in rows if mode != "scd2" or r["_valid_to"] is None}
    assert current == {1: ("a", None), 2: ("b2", 21), 4: (None, 4)}
    if mode == "scd2":
        assert sorted((r["id"], r["_valid_from"], r["name"]) for r in rows if r["id"] == 2) == [
            (2, 2, "b"), (2, 6, "b2"), (2, 7, "b2")]
    everything = sink(tmp_path / "u", ignore_null_updates=True, **kw)
    everything.write(changes([("insert", 1, 1, "a", 1)]), 0)
    everything.write(changes([("update", 2, 1, None, None)]), 1)
    after = DeltaTable(str(tmp_path / "u")).to_pyarrow_table().to_pylist()
    assert [(r["name"], r["qty"], r["_seq"]) for r in after if mode != "scd2" or r["_valid_to"] is None] == [("a", 1, 2)]


def test_bad_batches_fail_clearly_and_write_nothing(tmp_path: Path) -> None:
    s = sink(tmp_path / "t")
    with pytest.raises(OptionError, match="app_id"):
        DeltaUpsertSink(str(tmp_path / "t"), keys=["id"]).write(changes([("insert", 1, 1, "a", 1)]), 0)
    with pytest.raises(OptionError, match="'nope'"):
        sink(tmp_path / "t", sequence_by="nope").write(changes([("insert", 1, 1, "a", 1)]), 0)
    with pytest.raises(OptionError, match="integer or timestamp"):
        sink(tmp_path / "t", sequence_by="name").write(changes([("insert", 1, 1, "a", 1)]), 0)
    with pytest.raises(OptionError, match="apply_as_deletes"):
        sink(tmp_path / "t", apply_as_deletes="qty < 0").write(changes([("insert", 1, 1, "a", 1)]), 0)
    bad = changes([("insert", 1, 1, "a", 1)]).set_column(5, "id", pa.array([None], pa.int64()))
    with pytest.raises(MalformedRecordError, match="channel 'c0' position 0"):
        s.write(bad, 0)
    assert not (tmp_path / "t" / "_delta_log").exists()


def test_upserts_deletes_tombstones_and_stale_changes(tmp_path: Path) -> None:
    s = sink(tmp_path / "t")
    assert s.write(changes([("insert", 1, 1, "a", 1), ("insert", 2, 2, "b", 2), ("update", 3, 1, "a2", 10)]), 0)
    assert {k: (r["name"], r["qty"], r["_seq"]) for k, r in live(tmp_path / "t").items()} == {
        1: ("a2", 10, 3), 2: ("b", 2, 2)
    }
    # A delete, then a late (older) insert of the same key in a later batch: the tombstone wins.
    assert s.write(changes([("delete", 4, 2, None, None)]), 1)
    assert s.write(changes([("insert", 2, 2, "b", 2), ("update", 2, 1, "old", 0)]), 2)
    assert set(live(tmp_path / "t")) == {1}
    assert live(tmp_path / "t")[1]["name"] == "a2"
    assert state(tmp_path / "t") == {1: (3, False), 2: (4, True)}  # the tombstone lives in the state table
    # Metadata kept: the sequence and commit time; dropped: _op, _channel, _position.
    names = DeltaTable(str(tmp_path / "t")).schema().to_arrow().names
    assert names == ["id", "_seq", "_commit_ts", "name", "qty"]
    # A newer insert revives the key.
    assert s.write(changes([("insert", 5, 2, "b3", 3)]), 3)
    assert live(tmp_path / "t")[2]["name"] == "b3"


def test_replayed_batch_is_a_no_op(tmp_path: Path) -> None:
    s = sink(tmp_path / "t")
    batch = changes([("insert", 1, 1, "a", 1)])
    assert s.write(batch, 0)
    version = DeltaTable(str(tmp_path / "t")).version()
    assert not s.write(batch, 0)
    assert not sink(tmp_path / "t").write(changes([("update", 9, 1, "different", 9)]), 0)
    assert DeltaTable(str(tmp_path / "t")).version() == version
    for table in (str(tmp_path / "t"), state_path(str(tmp_path / "t"))):
        assert DeltaTable(table).transaction_version("test") == 0
    # A batch whose every change is stale changes no row but is still recorded as committed.
    assert s.write(changes([("insert", 0, 1, "stale", 0)]), 1)
    for table in (str(tmp_path / "t"), state_path(str(tmp_path / "t"))):
        assert DeltaTable(table).transaction_version("test") == 1
    assert live(tmp_path / "t")[1]["name"] == "a"


def test_tombstones_are_purged_after_retention(tmp_path: Path) -> None:
    now = [datetime(2025, 1, 1, tzinfo=UTC)]
    s = sink(tmp_path / "t", tombstone_retention=timedelta(hours=1), compact_every=2, clock=lambda: now[0])
    s.write(changes([("insert", 1, 1, "a", 1), ("insert", 2, 2, "b", 2)]), 0)
    s.write(changes([("delete", 3, 1, None, None)]), 1)  # batch 1 runs maintenance: tombstone still young
    assert state(tmp_path / "t")[1] == (3, True)
    assert set(live(tmp_path / "t")) == {2}
    now[0] += timedelta(hours=2)
    s.write(changes([("update", 4, 2, "b2", 2)]), 2)
    s.write(changes([("update", 5, 2, "b3", 3)]), 3)  # maintenance: purge + compaction
    assert state(tmp_path / "t") == {2: (5, False)}
    ops = [h["operation"] for h in DeltaTable(state_path(str(tmp_path / "t"))).history()]
    assert "DELETE" in ops[:2]  # the purge (then compaction, if there was more than one file)
    # After the purge an older insert is applied again (the retention is the window that guards against it).
    s.write(changes([("insert", 2, 1, "late", 1)]), 4)
    assert set(live(tmp_path / "t")) == {1, 2}


def test_compaction_keeps_table_readable_and_equal(tmp_path: Path) -> None:
    s = sink(tmp_path / "t", compact_every=4)
    expected: dict[int, str] = {}
    seq = 0
    for b in range(8):
        rows = []
        for i in range(5):
            seq += 1
            rows.append(("insert", seq, b * 5 + i, f"v{seq}", seq))
            expected[b * 5 + i] = f"v{seq}"
        s.write(changes(rows), b)
        assert {k: r["name"] for k, r in live(tmp_path / "t").items()} == expected
    dt = DeltaTable(str(tmp_path / "t"))
    assert [h["operation"] for h in dt.history()].count("OPTIMIZE") == 2
    assert len(dt.file_uris()) <= 2


def test_schema_evolution_adds_columns_and_rejects_type_changes(tmp_path: Path) -> None:
    s = sink(tmp_path / "t")
    s.write(changes([("insert", 1, 1, "a", 1)]), 0)
    s.write(changes([("insert", 2, 2, "b", 2)], {"color": pa.array(["red"], pa.string())}), 1)
    got = live(tmp_path / "t")
    assert got[1]["color"] is None and got[2]["color"] == "red"
    field = pa.schema(DeltaTable(str(tmp_path / "t")).schema().to_arrow()).field("color")
    assert field.nullable and field.type == pa.string()
    version = DeltaTable(str(tmp_path / "t")).version()
    bad = changes([("update", 3, 1, "x", 1)]).drop_columns(["qty"]).append_column("qty", pa.array(["many"]))
    with pytest.raises(SchemaEvolutionError, match=r"nothing was written: 'qty': table has int64, changes have string"):
        s.write(bad, 2)
    assert DeltaTable(str(tmp_path / "t")).version() == version
    # Excluded columns never reach the table.
    s2 = sink(tmp_path / "u", except_column_list=["qty"])
    s2.write(changes([("insert", 1, 1, "a", 1)]), 0)
    assert "qty" not in DeltaTable(str(tmp_path / "u")).schema().to_arrow().names


def test_composite_keys_and_timestamp_sequence(tmp_path: Path) -> None:
    def batch(rows: list[tuple[str, int, str, int, str]]) -> pa.Table:
        return pa.table({
            "_op": [r[0] for r in rows],
            "updated": pa.array([datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=r[1]) for r in rows], TS),
            "region": [r[2] for r in rows], "id": pa.array([r[3] for r in rows], pa.int64()), "v": [r[4] for r in rows],
        })

    s = DeltaUpsertSink(str(tmp_path / "t"), keys=["region", "id"], sequence_by="updated", app_id="a")
    s.write(batch([("insert", 5, "eu", 1, "new"), ("insert", 1, "us", 1, "x"), ("insert", 2, "eu", 1, "old")]), 0)
    s.write(batch([("insert", 3, "eu", 1, "older"), ("delete", 4, "us", 1, "")]), 1)
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    assert {(r["region"], r["id"]): r["v"] for r in rows} == {("eu", 1): "new"}


def test_key_range_prunes_files(tmp_path: Path) -> None:
    s = sink(tmp_path / "t")
    for b in range(4):  # four files, each a disjoint key range
        s.write(changes([("insert", b * 100 + i + 1, b * 100 + i, "v", 0) for i in range(50)]), b)
    s.write(changes([("update", 1000, 210, "w", 1), ("update", 1001, 220, "w", 1)]), 4)
    for table in (str(tmp_path / "t"), state_path(str(tmp_path / "t"))):
        merge = DeltaTable(table).history(1)[0]
        metrics = merge["operationMetrics"]
        assert merge["operation"] == "MERGE"
        assert metrics["num_target_files_skipped_during_scan"] >= 3, metrics
        # delta-rs derives the range from the source: the statement carries no value of the data
        assert "210" not in merge["operationParameters"]["mergePredicate"], merge["operationParameters"]


@pytest.mark.parametrize("ordered", [False, True], ids=["safe", "ordered"])
@pytest.mark.parametrize("tracking", [{"track_history_column_list": ["name"]},
                                      {"track_history_except_column_list": ["qty"]},
                                      {"track_history_columns": ["name"]}])  # the deprecated name
def test_scd2_history_and_tracked_columns(tmp_path: Path, tracking: dict[str, list[str]], ordered: bool) -> None:
    s = sink(tmp_path / "t", scd_type=2, ordered=ordered, **tracking)
    s.write(changes([("insert", 1, 1, "a", 1)]), 0)
    s.write(changes([("update", 2, 1, "a", 2)]), 1)  # only an untracked column: in place
    s.write(changes([("update", 3, 1, "b", 3)]), 2)  # tracked: a new version
    s.write(changes([("delete", 4, 1, None, None)]), 3)
    s.write(changes([("update", 2, 1, "a", 2)]), 4)  # a redelivery of a stored change: nothing changes
    s.write(changes([("insert", 6, 1, "c", 6)]), 5)
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    versions = sorted(
        ((r["name"], r["qty"], r["_valid_from"], r["_valid_to"], r["_is_current"]) for r in rows),
        key=lambda v: v[2],
    )
    assert versions == [("a", 2, 1, 3, False), ("b", 3, 3, 4, False), ("c", 6, 6, None, True)]


def test_scd2_every_change_of_a_batch_is_a_version_and_late_changes_are_back_filled(tmp_path: Path) -> None:
    s = sink(tmp_path / "t", scd_type=2, track_history_column_list=["name"])
    s.write(changes([("insert", 1, 1, "a", 1), ("insert", 1, 2, "x", 1)]), 0)
    s.write(changes([
        ("update", 3, 1, "b", 3), ("update", 2, 1, "a", 2),  # out of order inside the batch: both apply
        ("update", 4, 1, "b", 4),  # untracked only: the version of seq 3 in place
        ("delete", 5, 1, None, None), ("insert", 6, 1, "c", 6), ("delete", 7, 1, None, None),
        ("insert", 8, 1, "d", 8), ("update", 2, 2, "late", 0),  # key 2: seq 2 is newer than its head (1)
    ]), 1)
    s.write(changes([("insert", q, 4, name, q) for q, name in ((10, "a"), (20, "b"), (30, "c"), (50, "d"))]), 2)
    # Late changes (older than the key's head) go into history at their sequence.
    s.write(changes([
        ("update", 0, 1, "w", 0),  # before key 1's first version: a version until it
        ("update", 65, 1, "e", 65),  # newer than key 1's head: a version as ever
        ("update", 5, 4, "z", 5),  # before key 4's first version
        ("update", 15, 4, "q", 15),  # splits [10, 20)
        ("delete", 25, 4, None, None),  # closes [20, 30) at 25; the versions after it remain
        ("update", 40, 4, "c", 40),  # untracked only, after [30, 50)'s last change: that version in place
        ("update", 45, 4, "e", 45),  # splits it again
        ("update", 20, 4, "b", 20),  # a redelivery of a stored change: nothing
        ("update", 60, 4, "f", 60),
    ]), 3)
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    versions = sorted(
        ((r["id"], r["name"], r["qty"], r["_seq"], r["_valid_from"], r["_valid_to"], r["_is_current"])
         for r in rows),
        key=lambda v: (v[0], v[4]),
    )
    assert versions == [
        (1, "w", 0, 0, 0, 1, False),
        (1, "a", 2, 2, 1, 3, False),  # seq 2 changed only qty: in place of the version from seq 1
        (1, "b", 4, 4, 3, 5, False),
        (1, "c", 6, 6, 6, 7, False),
        (1, "d", 8, 8, 8, 65, False),
        (1, "e", 65, 65, 65, None, True),
        (2, "x", 1, 1, 1, 2, False),
        (2, "late", 0, 2, 2, None, True),
        (4, "z", 5, 5, 5, 10, False),
        (4, "a", 10, 10, 10, 15, False),
        (4, "q", 15, 15, 15, 20, False),
        (4, "b", 20, 20, 20, 25, False),
        (4, "c", 40, 40, 30, 45, False),
        (4, "e", 45, 45, 45, 50, False),
        (4, "d", 50, 50, 50, 60, False),
        (4, "f", 60, 60, 60, None, True),
    ]
    assert state(tmp_path / "t") == {1: (65, False), 2: (2, False), 4: (60, False)}, "late changes move no head"
    # A late change with a stored change's sequence and other values cannot be placed: nothing is written.
    before = DeltaTable(str(tmp_path / "t")).version()
    with pytest.raises(MalformedRecordError, match=r"key id=4 have the same sequence \(_seq 30\) .*\['name'\]"):
        s.write(changes([("update", 30, 4, "X", 30), ("update", 70, 4, "g", 70)]), 4)
    assert DeltaTable(str(tmp_path / "t")).version() == before


def test_delta_spark_engine_reports_missing_jars(tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sinks.delta.session as session_module
    import sinks.delta.spark as engine_module

    assert session_module.class_loadable(spark, "org.apache.spark.sql.SparkSession")  # the probe itself works
    assert not session_module.class_loadable(spark, "io.delta.NoSuchClass")
    # The tests' session has the jars (make delta-spark): a session without them answers as this probe does.
    monkeypatch.setattr(engine_module, "delta_jars_available", lambda _: False)
    s = DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], engine="delta-spark", app_id="a")
    with pytest.raises(TerminalError, match="io.delta Spark jars"):
        s.write(changes([("insert", 1, 1, "a", 1)]), 0)


def partial(rows: list[tuple[Any, ...]]) -> pa.Table:
    """rows: (op, seq, id, name, qty, unchanged columns or None)."""
    t = changes([r[:5] for r in rows])
    return t.append_column("_unchanged", pa.array([r[5] for r in rows], pa.list_(pa.string())))


def current(path: Path) -> dict[int, tuple[str, int]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {r["id"]: (r["name"], r["qty"]) for r in rows if r.get("_is_current", True)}


@pytest.mark.parametrize("scd_type", [1, 2])
def test_partial_changes_keep_unchanged_columns(tmp_path: Path, scd_type: int) -> None:
    s = sink(tmp_path / "t", scd_type=scd_type)
    s.write(partial([("insert", 1, 1, "a", 1, None), ("insert", 2, 2, "b", 2, None), ("insert", 3, 3, "c", 3, None)]), 0)
    s.write(partial([
        ("update", 4, 1, "JUNK", 10, ["name"]),  # a run of partials on an existing row: overlaid
        ("update", 5, 1, "a2", 99, ["qty"]),
        ("delete", 6, 2, None, None, None),  # a partial after a delete: created with the unchanged column null
        ("update", 7, 2, "JUNK", 20, ["name"]),
        ("update", 8, 4, "JUNK", 40, ["name"]),  # a partial on a missing row: created, unchanged column null
        ("update", 9, 3, "c2", 30, []),  # an empty _unchanged is a full row
    ]), 1)
    got = current(tmp_path / "t")
    assert got == {1: ("a2", 10), 2: (None, 20), 3: ("c2", 30), 4: (None, 40)}
    # A stale re-delivery of row 1's insert (seq 1, full) next to a newer partial: the partial must overlay
    # the table's row (seq 5), not the stale insert.
    s.write(partial([("insert", 1, 1, "a", 1, None), ("update", 10, 1, "JUNK", 11, ["name"])]), 2)
    got = current(tmp_path / "t")
    assert got[1] == ("a2", 11)
    assert "_unchanged" not in DeltaTable(str(tmp_path / "t")).schema().to_arrow().names


def test_hidden_bookkeeping_columns_only_hide(tmp_path: Path) -> None:
    """Hiding the sequence and commit time leaves the guard intact: it lives in the state table."""
    s = sink(tmp_path / "t", bookkeeping_columns=[])
    s.write(changes([("insert", 5, 1, "a", 1), ("insert", 6, 2, "b", 2)]), 0)
    s.write(changes([("update", 4, 1, "stale", 0), ("delete", 7, 2, None, None)]), 1)
    s.write(changes([("insert", 3, 2, "older", 0)]), 2)
    assert DeltaTable(str(tmp_path / "t")).schema().to_arrow().names == ["id", "name", "qty"]
    assert {k: (r["name"], r["qty"]) for k, r in live(tmp_path / "t").items()} == {1: ("a", 1)}
    assert state(tmp_path / "t") == {1: (5, False), 2: (7, True)}


def legacy_table(path: Path) -> None:
    """A table as the previous layout wrote it: tombstone rows (values null, __cdc_deleted_at set) among the
    live rows, batches 0-3 committed under the application transaction 'test'."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    when = datetime(2025, 1, 1, tzinfo=UTC)
    rows = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "_seq": pa.array([3, 4, 5], pa.int64()),
        "_commit_ts": pa.array([when] * 3, TS),
        "name": pa.array(["a", None, "c"]),
        "qty": pa.array([1, None, 3], pa.int64()),
        DELETED_AT: pa.array([None, when, None], TS),
    })
    write_deltalake(str(path), rows, commit_properties=CommitProperties(app_transactions=[Transaction("test", 3)]))


def test_previous_layout_is_refused_then_migrated(tmp_path: Path) -> None:
    legacy_table(tmp_path / "t")
    s = sink(tmp_path / "t")
    version = DeltaTable(str(tmp_path / "t")).version()
    with pytest.raises(LegacyLayoutError, match=r"previous layout.*sink\.migrate\(\)"):
        s.write(changes([("insert", 9, 4, "d", 4)]), 4)
    assert DeltaTable(str(tmp_path / "t")).version() == version, "nothing was written"
    assert s.migrate()
    assert DeltaTable(str(tmp_path / "t")).version() == version + 1, "the main table is migrated in one commit"
    assert DeltaTable(str(tmp_path / "t")).schema().to_arrow().names == ["id", "_seq", "_commit_ts", "name", "qty"]
    assert {k: r["name"] for k, r in live(tmp_path / "t").items()} == {1: "a", 3: "c"}
    assert state(tmp_path / "t") == {1: (3, False), 2: (4, True), 3: (5, False)}
    assert not s.migrate(), "a second run has nothing to do"
    # The main table's application transaction survived: Spark's replay of batch 3 (the same changes, already
    # applied) does not merge into it again, and changes nothing in the new state table (sequence-guarded).
    s.write(changes([("update", 5, 3, "c", 3), ("delete", 4, 2, None, None)]), 3)
    assert [h["operation"] for h in DeltaTable(str(tmp_path / "t")).history(1)] != ["MERGE"]
    assert state(tmp_path / "t") == {1: (3, False), 2: (4, True), 3: (5, False)}
    # The tombstone still guards its key; newer changes apply.
    s.write(changes([("insert", 2, 2, "late", 0), ("update", 9, 3, "c2", 9)]), 4)
    assert {k: r["name"] for k, r in live(tmp_path / "t").items()} == {1: "a", 3: "c2"}


def test_a_truncate_empties_both_tables_in_order_and_survives_a_crash_between_commits(tmp_path: Path) -> None:
    """A truncate record (debezium.truncate=apply) drops the table's rows and the batch's earlier changes;
    a crash after the main table's commit and before the state's leaves a replay that keeps the batch's rows."""
    s = sink(tmp_path / "t")
    assert s.write(changes([("insert", 1, 1, "a", 1), ("insert", 2, 2, "b", 2), ("delete", 3, 1, None, None)]), 0)
    batch = changes([("insert", 4, 9, "gone", 9), ("truncate", 5, 0, None, None), ("insert", 6, 2, "again", 20),
                     ("insert", 7, 5, "new", 5)])

    def crash(*_: Any) -> None:
        raise RuntimeError("killed before the state's commit")

    s.state_engine().merge = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="killed"):
        s.write(batch, 1)
    assert set(live(tmp_path / "t")) == {2, 5}
    assert sink(tmp_path / "t").write(batch, 1)
    assert {k: (r["name"], r["qty"]) for k, r in live(tmp_path / "t").items()} == {2: ("again", 20), 5: ("new", 5)}
    assert state(tmp_path / "t") == {2: (6, False), 5: (7, False)}
    assert not sink(tmp_path / "t").write(batch, 1)


def test_apply_as_truncates_empties_the_table_at_its_place_in_the_batch(tmp_path: Path) -> None:
    """The condition (evaluated by Spark into ``__cdc_is_truncate`` in foreachBatch; given directly here) marks
    a change as a truncate: the batch's changes before it are dropped, those after it applied."""
    s = sink(tmp_path / "t", apply_as_truncates="_op = 'wipe'")
    with pytest.raises(OptionError, match="__cdc_is_truncate"):
        s.write(changes([("insert", 1, 1, "a", 1)]), 0)
    s.write(changes([("insert", 1, 1, "a", 1)], {"__cdc_is_truncate": pa.array([False])}), 0)
    batch = changes([("insert", 2, 2, "b", 2), ("update", 3, 0, None, None), ("insert", 4, 3, "c", 3)],
                    {"__cdc_is_truncate": pa.array([False, True, None])})
    assert s.write(batch, 1)
    assert {k: r["name"] for k, r in live(tmp_path / "t").items()} == {3: "c"}
    assert state(tmp_path / "t") == {3: (4, False)}


# ------------------------------------------------------------------ sequence_by over several columns
def versioned(rows: list[tuple[str, int, int, int, str | None]], form: str) -> pa.Table:
    """rows: (op, id, version, offset, name); the sequence is (version, offset): as two columns (``form``
    "list") or one struct column ``seq`` ("struct")."""
    ver = pa.array([r[2] for r in rows], pa.int64())
    off = pa.array([r[3] for r in rows], pa.int32())
    t = pa.table({
        "_op": pa.array([r[0] for r in rows], pa.string()),
        "id": pa.array([r[1] for r in rows], pa.int64()),
        "name": pa.array([r[4] for r in rows], pa.string()),
    })
    if form == "list":
        return t.append_column("ver", ver).append_column("off", off)
    return t.append_column("seq", pa.StructArray.from_arrays([ver, off], ["ver", "off"]))


#: (batches, then per mode: the table's rows (id, name, sequence), SCD type 2: (id, name, from, to) versions).
COMPOSITE = [
    [("insert", 1, 1, 5, "a"), ("update", 1, 1, 7, "b"), ("insert", 1, 0, 9, "z"),  # (0, 9) < (1, 5) < (1, 7)
     ("insert", 2, 2, 0, "x"), ("insert", 2, 2, 0, "x")],  # a redelivery: counted once
    [("update", 1, 1, 6, "stale"), ("update", 1, 2, 0, "c"), ("delete", 2, 2, 1, None)],
    [("insert", 2, 1, 9, "older than the delete")],
]


def composite_sink(path: str, mode: str, form: str, **kw: Any) -> DeltaUpsertSink:
    seq: Any = ["ver", "off"] if form == "list" else "seq"
    scd = {"scd_type": 2} if mode == "scd2" else {"ordered": mode == "ordered"}
    return DeltaUpsertSink(path, keys=["id"], sequence_by=seq, app_id="t", compact_every=None, **scd, **kw)


def check_composite(path: str, mode: str, form: str, write: Any, engine: str = "delta-rs", batches: int = 3) -> None:
    """Apply the first ``batches`` of :data:`COMPOSITE` through ``write(sink, table, batch_id)`` and check the
    table (both engines)."""
    s = composite_sink(path, mode, form, engine=engine)
    for i, rows in enumerate(COMPOSITE[:batches]):
        write(s, versioned(rows, form), i)
    seq = "_sequence" if form == "list" else "seq"
    got = DeltaTable(path).to_pyarrow_table().to_pylist()
    if mode == "scd2":
        versions = sorted((r["id"], r["name"], tuple(r["_valid_from"].values()),
                           r["_valid_to"] and tuple(r["_valid_to"].values())) for r in got)
        if batches == 1:
            assert versions == [(1, "a", (1, 5), (1, 7)), (1, "b", (1, 7), None), (1, "z", (0, 9), (1, 5)),
                                (2, "x", (2, 0), None)]
            return
        # The late changes are back-filled: "stale" splits the version of (1, 5), "older than the delete" is
        # a version before key 2's first.
        assert versions == [(1, "a", (1, 5), (1, 6)), (1, "b", (1, 7), (2, 0)), (1, "c", (2, 0), None),
                            (1, "stale", (1, 6), (1, 7)), (1, "z", (0, 9), (1, 5)),
                            (2, "older than the delete", (1, 9), (2, 0)), (2, "x", (2, 0), (2, 1))]
        return
    table = sorted((r["id"], r["name"], tuple(r[seq].values())) for r in got)
    if mode == "ordered" and batches == 3:  # no tombstone: the change older than the delete brings the key back
        assert table == [(1, "c", (2, 0)), (2, "older than the delete", (1, 9))]
        return
    assert table == [(1, "c", (2, 0))]
    if mode == "ordered":
        return
    heads = DeltaTable(state_path(path)).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r[seq], r[DELETED_AT] is not None) for r in heads) == [
        (1, {"ver": 2, "off": 0}, False), (2, {"ver": 2, "off": 1}, True)]


@pytest.mark.parametrize("form", ["list", "struct"])
@pytest.mark.parametrize("mode", ["safe", "ordered", "scd2"])
def test_sequence_by_several_columns_or_a_struct_compares_in_the_order_given(
        tmp_path: Path, mode: str, form: str) -> None:
    check_composite(str(tmp_path / "t"), mode, form, lambda s, t, i: s.write(t, i))


@pytest.mark.parametrize("form", ["list", "struct", "single"])
def test_bad_sequences_fail_naming_the_column_and_the_key_and_write_nothing(tmp_path: Path, form: str) -> None:
    def table(rows: list[tuple[str, int | None, int, str]]) -> pa.Table:
        """rows: (key, version, offset, name)."""
        ver = pa.array([r[1] for r in rows], pa.int64())
        off = pa.array([r[2] for r in rows], pa.int64())
        t = pa.table({"_op": pa.array(["insert"] * len(rows)), "k": pa.array([r[0] for r in rows]),
                      "name": pa.array([r[3] for r in rows])})
        if form == "list":
            return t.append_column("ver", ver).append_column("off", off)
        if form == "single":
            return t.append_column("ver", ver)
        return t.append_column("seq", pa.StructArray.from_arrays([ver, off], ["ver", "off"]))

    seq: Any = {"list": ["ver", "off"], "struct": "seq", "single": "ver"}[form]
    s = DeltaUpsertSink(str(tmp_path / "t"), keys=["k"], sequence_by=seq, app_id="t", compact_every=None)
    if form == "list":  # the changes' own column of the struct's name
        with pytest.raises(OptionError, match="'_sequence'"):
            s.write(table([("a", 1, 1, "v")]).append_column("_sequence", pa.array([1])), 0)
    key = "o'k\\"  # shown as the value's repr, never as SQL
    with pytest.raises(MalformedRecordError, match=r"null sequence.*'ver'") as e:
        s.write(table([("a", 1, 1, "v"), (key, None, 2, "v")]), 0)
    assert repr(key) in str(e.value)
    with pytest.raises(MalformedRecordError, match=r"same sequence.*\['name'\]") as e:
        s.write(table([("a", 1, 1, "v"), (key, 1, 2, "v"), (key, 1, 2, "w")]), 0)
    assert repr(key) in str(e.value)
    assert not (tmp_path / "t" / "_delta_log").exists(), "nothing was written"
    s.write(table([(key, 1, 2, "v"), (key, 1, 2, "v"), (key, 0, 3, "u")]), 0)  # identical: one change
    assert [(r["k"], r["name"]) for r in DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()] == [(key, "v")]
