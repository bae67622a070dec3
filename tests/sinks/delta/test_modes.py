"""The sink's two modes: ordered (one MERGE per batch, no state table) and safe (the state table guards).

On a history delivered in each key's sequence order both modes give the same table (hypothesis, both
engines); ordered mode still never applies a stale update where the table keeps the sequence; a table's mode
is recorded when it is created and a query claiming the other mode fails naming both.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def sink(path: str, engine: str, ordered: bool, **kw: Any) -> DeltaUpsertSink:
    return DeltaUpsertSink(path, keys=["id"], engine=engine, app_id="t", ordered=ordered, clock=lambda: NOW, **kw)


def run_both(history: list[list[tuple[str, int, str | None, list[str] | None]]], engine: str,
             spark: Any = None) -> None:
    with tempfile.TemporaryDirectory() as d:
        paths = {m: f"{d}/{m}" for m in ("ordered", "safe")}
        sinks = {m: sink(p, engine, m == "ordered") for m, p in paths.items()}
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


def test_ordered_mode_never_applies_a_stale_update(tmp_path: Path) -> None:
    """With the sequence in the table, the MERGE compares it: a late, older update or delete of a live row is
    not applied (ordered mode trusts the source for what it cannot see: a deleted key's last sequence)."""
    path = str(tmp_path / "t")
    s = sink(path, "delta-rs", True)
    s.write(batch([("insert", 1, "new", None), ("insert", 2, "keep", None)], 10), 0)
    s.write(batch([("update", 1, "old", None), ("delete", 2, None, None)], 1), 1)
    assert [(r["id"], r["a"], r["_seq"]) for r in rows(path)] == [(1, "new", 10), (2, "keep", 11)]


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
