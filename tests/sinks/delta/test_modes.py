"""The sink's two modes: ordered (one MERGE per batch, no state table) and safe (the state table guards).

On a history delivered in each key's sequence order both modes give the same table (hypothesis, both
engines); ordered mode still never applies a stale update where the table keeps the sequence; a table's mode
is recorded when it is created and a query claiming the other mode fails naming both.
"""

from __future__ import annotations

import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import MalformedRecordError
from sinks.delta import DeltaUpsertSink
from sinks.delta.layout import MODE_PROPERTY, STATE_DIR, ModeMismatchError

TS = pa.timestamp("us", tz="UTC")
NOW = datetime(2025, 3, 1, tzinfo=UTC)


def batch(changes: list[tuple[str, int, str | None, list[str] | None]], seq0: int) -> pa.Table:
    """(op, key, value, unchanged) changes, numbered in order from ``seq0`` (only an update is partial)."""
    return pa.table({
        "_op": pa.array([c[0] for c in changes], pa.string()),
        "_seq": pa.array(range(seq0, seq0 + len(changes)), pa.int64()),
        "_commit_ts": pa.array([NOW] * len(changes), TS),
        "id": pa.array([c[1] for c in changes], pa.int64()),
        "a": pa.array([c[2] for c in changes], pa.string()),
        "b": pa.array([len(c[2] or "") for c in changes], pa.int64()),
        "_unchanged": pa.array([c[3] if c[0] == "update" else None for c in changes], pa.list_(pa.string())),
    })


CHANGE = st.tuples(
    st.sampled_from(["insert", "update", "update", "delete"]), st.integers(0, 6), st.sampled_from(["p", "q'", "r\\"]),
    st.sampled_from([None, None, ["a"], ["b"]]),
)
#: A history in sequence order, cut into batches (each key's changes stay in order across batches).
HISTORY = st.lists(st.lists(CHANGE, min_size=1, max_size=8), min_size=1, max_size=4)


def rows(path: str) -> list[dict[str, Any]]:
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: (r["id"], r.get("_valid_from") or 0))


def sink(path: str, engine: str, ordered: bool, **kw: Any) -> DeltaUpsertSink:
    return DeltaUpsertSink(path, keys=["id"], engine=engine, app_id="t", ordered=ordered, clock=lambda: NOW, **kw)


def run_both(history: list[list[tuple[str, int, str | None, list[str] | None]]], engine: str,
             spark: Any = None, **kw: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        paths = {m: f"{d}/{m}" for m in ("ordered", "safe")}
        sinks = {m: sink(p, engine, m == "ordered", **kw) for m, p in paths.items()}
        seq = 1
        for i, changes in enumerate(history):
            table = batch(changes, seq)
            seq += len(changes)
            for s in sinks.values():
                if spark is None:
                    s.write(table, i)
                else:
                    s.write_frame(spark.createDataFrame(table), i)
            assert rows(paths["ordered"]) == rows(paths["safe"]), f"after batch {i}"
        assert not Path(paths["ordered"], STATE_DIR).exists(), "ordered mode keeps no state table"
        assert DeltaTable(paths["ordered"]).metadata().configuration[MODE_PROPERTY] == "ordered"
        assert DeltaTable(paths["safe"]).metadata().configuration[MODE_PROPERTY] == "safe"


@settings(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(HISTORY)
def test_ordered_equals_safe_on_in_order_histories(history: list[Any]) -> None:
    run_both(history, "delta-rs")


@settings(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(HISTORY, st.sampled_from([None, ["a"]]))
def test_ordered_equals_safe_on_in_order_histories_scd2(history: list[Any], tracked: list[str] | None) -> None:
    """SCD type 2 (every version, with in-place updates when ``a`` alone is tracked): ordered mode reads its
    key heads from the table's current versions (a deleted key's from its last closed one)."""
    run_both(history, "delta-rs", scd_type=2, track_history_column_list=tracked)


#: One in-order history for the DataFrame path: inserts, full and partial updates, a delete and a re-insert,
#: text with a quote and a backslash (a Spark MERGE costs seconds: the properties run on delta-rs above).
SPARK_HISTORY = [
    [("insert", 1, "p", None), ("insert", 2, "q'", None), ("update", 1, "r\\", ["b"]), ("insert", 3, "p", None)],
    [("delete", 2, None, None), ("update", 3, "q'", ["a"]), ("insert", 2, "p", None), ("update", 1, "q'", None)],
]


@pytest.mark.spark
def test_ordered_equals_safe_on_delta_spark(spark: Any) -> None:
    """The same on the DataFrame path, with partial changes (staged in Arrow buckets; the JVM staging of full
    changes runs in both modes in test_delta_spark.py's no-collect test)."""
    run_both(SPARK_HISTORY, "delta-spark", spark)


@pytest.mark.spark
def test_ordered_equals_safe_on_delta_spark_scd2(spark: Any) -> None:
    run_both(SPARK_HISTORY, "delta-spark", spark, scd_type=2)


def test_ordered_mode_never_applies_a_stale_update(tmp_path: Path) -> None:
    """With the sequence in the table, the MERGE compares it: a late, older update or delete of a live row is
    not applied (ordered mode trusts the source for what it cannot see: a deleted key's last sequence)."""
    path = str(tmp_path / "t")
    s = sink(path, "delta-rs", True)
    s.write(batch([("insert", 1, "new", None), ("insert", 2, "keep", None)], 10), 0)
    s.write(batch([("update", 1, "old", None), ("delete", 2, None, None)], 1), 1)
    assert [(r["id"], r["a"], r["_seq"]) for r in rows(path)] == [(1, "new", 10), (2, "keep", 11)]


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.spark)])
def test_ordered_scd2_never_applies_a_stale_change(tmp_path: Path, engine: str, request: Any) -> None:
    """SCD type 2 in ordered mode: a change not newer than the key's current version (also with the sequence
    hidden: its ``_valid_from``) or than its delete (the last closed version's ``_valid_to``) changes nothing,
    nor does a redelivery; the next in-order change still applies."""
    write: Any
    if engine == "delta-spark":
        spark = request.getfixturevalue("spark")
        write = lambda s, t, i: s.write_frame(spark.createDataFrame(t), i)  # noqa: E731
    else:
        write = lambda s, t, i: s.write(t, i)  # noqa: E731
    for shown in ([], ["commit_ts", "is_current"]) if engine == "delta-rs" else ([],):  # ["commit_ts", ...]: no sequence
        path = str(tmp_path / f"t{len(shown)}")
        s = sink(path, engine, True, scd_type=2, compact_every=None, **({"bookkeeping_columns": shown} if shown else {}))
        write(s, batch([("insert", 1, "new", None), ("insert", 2, "gone", None), ("delete", 2, None, None)], 10), 0)
        before = rows(path)
        stale = batch([("update", 1, "old", None), ("insert", 2, "back", None), ("insert", 1, "new", None)], 8)
        write(s, stale.set_column(1, "_seq", pa.array([5, 11, 10], pa.int64())), 1)  # 11: key 2's insert again
        assert rows(path) == before, f"shown {shown}"
        write(s, batch([("update", 1, "next", None), ("insert", 2, "back", None)], 13), 2)
        got = [(r["id"], r["a"], r["_valid_from"], r["_valid_to"]) for r in rows(path)]
        assert got == [(1, "new", 10, 13), (1, "next", 13, None), (2, "gone", 11, 12), (2, "back", 14, None)], shown
    assert DeltaTable(path).metadata().configuration[MODE_PROPERTY] == "ordered"
    assert not Path(path, STATE_DIR).exists()


def test_a_query_claiming_the_other_mode_fails(tmp_path: Path) -> None:
    """Both directions, and a table written before modes existed (no property: safe), fail naming both modes;
    nothing is written."""
    first = batch([("insert", 1, "x", None)], 1)
    ordered_path, safe_path = str(tmp_path / "o"), str(tmp_path / "s")
    sink(ordered_path, "delta-rs", True).write(first, 0)
    sink(safe_path, "delta-rs", False).write(first, 0)
    for path, claim in ((ordered_path, False), (safe_path, True)):
        version = DeltaTable(path).version()
        with pytest.raises(ModeMismatchError, match=r"created in (ordered|safe) mode .* asks for (safe|ordered) mode"):
            sink(path, "delta-rs", claim).write(batch([("update", 1, "y", None)], 2), 1)
        assert DeltaTable(path).version() == version
    # A table of the previous release: no mode property, hence safe.
    DeltaTable.create(str(tmp_path / "l"), DeltaTable(safe_path).schema().to_arrow())
    with pytest.raises(ModeMismatchError, match="safe mode"):
        sink(str(tmp_path / "l"), "delta-rs", True).write(batch([("update", 1, "y", None)], 2), 1)
    # Without a claim, a sink follows the table's mode.
    free = DeltaUpsertSink(ordered_path, keys=["id"], engine="delta-rs", app_id="t", clock=lambda: NOW)
    assert free.write(batch([("update", 1, "z", None)], 3), 1)
    assert rows(ordered_path)[0]["a"] == "z"


def tied(changes: list[tuple[str, int, int, str | None, list[str] | None]]) -> pa.Table:
    """(op, key, seq, value, unchanged) changes with the sequences given."""
    return pa.table({
        "_op": pa.array([c[0] for c in changes], pa.string()),
        "_seq": pa.array([c[2] for c in changes], pa.int64()),
        "_commit_ts": pa.array([NOW] * len(changes), TS),
        "id": pa.array([c[1] for c in changes], pa.int64()),
        "a": pa.array([c[3] for c in changes], pa.string()),
        "b": pa.array([len(c[3] or "") for c in changes], pa.int64()),
        "_unchanged": pa.array([c[4] for c in changes], pa.list_(pa.string())),
    })


#: Key 1 holds (x, 1) at sequence 5; key 2 was deleted at sequence 7.
STORED = [("insert", 1, 5, "x", None), ("insert", 2, 6, "y", None), ("delete", 2, 7, None, None)]
#: The same changes again (a partial one setting only ``a``): nothing changes; key 3 shows the batch applied.
REDELIVERED = [("update", 1, 5, "x", ["b"]), ("delete", 2, 7, None, None), ("insert", 3, 1, "n", None)]
#: Changes at a stored change's sequence with other values: (change, the columns named).
CONFLICTS = [(("update", 1, 5, "DIFF", None), "['a', 'b']"), (("update", 1, 5, "DIFF", ["b"]), "['a']"),
             (("delete", 1, 5, None, None), "['_op']"), (("insert", 2, 7, "z", None), "['_op']")]


def check_ties_across_batches(path: str, write: Any, ordered: bool, conflicts: list[Any] = CONFLICTS,
                              redelivered: list[Any] = REDELIVERED) -> None:
    """``write(table, batch_id)``: a redelivery changes nothing; each conflict fails naming the key, the
    sequence and the columns, and writes nothing (ordered mode keeps no tombstone: an upsert at a delete's
    sequence is applied, as any change of a deleted key)."""
    write(tied(STORED), 0)
    write(tied(redelivered), 1)
    assert [(r["id"], r["a"], r["b"]) for r in rows(path)] == [(1, "x", 1), (3, "n", 1)]
    for i, (change, differ) in enumerate(conflicts):
        if ordered and change[1] == 2:
            continue
        version = DeltaTable(path).version()
        # (a failure raised inside Spark shows the key and the sequence as JSON)
        key, at = rf"(id={change[1]}|\{{\"id\":{change[1]}\}})", rf"({change[2]}|\{{\"_seq\":{change[2]}\}})"
        message = (rf"two changes of key {key} have the same sequence \(_seq {at}\) and different "
                   rf"values in column\(s\) {re.escape(differ)}: the table holds a change at that sequence")
        with pytest.raises(MalformedRecordError, match=message):
            write(tied([("insert", 4, 1, "w", None), change]), 2 + i)
        assert DeltaTable(path).version() == version, "nothing was written"
    assert [(r["id"], r["a"]) for r in rows(path)] == [(1, "x"), (3, "n")]


@pytest.mark.parametrize("mode", ["safe", "ordered", "safe-sequence-hidden"])
def test_a_change_at_a_stored_sequence_is_a_redelivery_or_fails_the_batch(tmp_path: Path, mode: str) -> None:
    """SCD type 1 across batches, as within one: safe mode compares against the state table's head (also with
    the sequence hidden from the table), ordered mode against the table's ``sequence_by``."""
    path = str(tmp_path / "t")
    hidden = {"bookkeeping_columns": ["commit_ts"]} if mode == "safe-sequence-hidden" else {}
    s = sink(path, "delta-rs", mode == "ordered", **hidden)
    check_ties_across_batches(path, s.write, mode == "ordered")


@pytest.mark.spark
@pytest.mark.parametrize("ordered", [False, True], ids=["safe", "ordered"])
def test_a_change_at_a_stored_sequence_on_delta_spark(spark: Any, tmp_path: Path, ordered: bool) -> None:
    """The same on the DataFrame path (a Spark MERGE costs seconds: one case per way in): full changes are
    settled by the MERGE of the JVM staging (an upsert at a tombstone's sequence by its WHEN NOT MATCHED
    check), a partial one in the Arrow buckets; the failed MERGE's first conflict is found by a join in Spark."""
    path = str(tmp_path / "t")
    s = sink(path, "delta-spark", ordered, compact_every=None)
    full_redelivery = [("insert", 1, 5, "x", None), *REDELIVERED[1:]]
    check_ties_across_batches(path, lambda t, i: s.write_frame(spark.createDataFrame(t), i), ordered,
                              [CONFLICTS[0], CONFLICTS[1], CONFLICTS[3]], full_redelivery)
