"""Switching a table's mode: ``DeltaUpsertSink.migrate(mode="safe" | "ordered")``.

A table migrated to safe mode continues as a table built in safe mode from the start on the same history
(rows and key heads), late changes included, for every key whose head the ordered table recorded (not a key
deleted while it was ordered, SCD type 1; not a repeated delete, SCD type 2); one migrated to ordered mode
continues as one built ordered. A query claiming the old
mode fails before and after; a crash between a migration's two commits is completed by running it again.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import OptionError
from sinks.delta import DeltaUpsertSink
from sinks.delta.layout import DELETED_AT, MODE_PROPERTY, STATE_DIR, LegacyLayoutError, ModeMismatchError
from sinks.delta.migration import seed_state, set_mode, state_rows

TS = pa.timestamp("us", tz="UTC")
NOW = datetime(2025, 3, 1, tzinfo=UTC)
Change = tuple[str, int, str | None, int]  # op, key, value, sequence


def table(changes: list[Change]) -> pa.Table:
    return pa.table({
        "_op": pa.array([c[0] for c in changes], pa.string()),
        "_seq": pa.array([c[3] for c in changes], pa.int64()),
        "_commit_ts": pa.array([NOW] * len(changes), TS),
        "id": pa.array([c[1] for c in changes], pa.int64()),
        "a": pa.array([c[2] for c in changes], pa.string()),
    })


def sink(path: str, ordered: bool | None, **kw: Any) -> DeltaUpsertSink:
    kw.setdefault("engine", "delta-rs")
    return DeltaUpsertSink(path, keys=["id"], app_id="t", ordered=ordered, clock=lambda: NOW, compact_every=None, **kw)


def rows(path: str) -> list[dict[str, Any]]:
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: (r["id"], r.get("_valid_from") or 0))


def heads(path: str, keys: set[int] | None = None) -> list[tuple[int, int, bool]]:
    """The state table's rows (key, sequence, tombstone) of ``keys`` (default all)."""
    state = DeltaTable(f"{path}/{STATE_DIR}").to_pyarrow_table().to_pylist()
    return sorted((r["id"], r["_seq"], r[DELETED_AT] is not None) for r in state if keys is None or r["id"] in keys)


def mode(path: str) -> str:
    return str(DeltaTable(path).metadata().configuration[MODE_PROPERTY])


EVENT = st.tuples(st.sampled_from(["insert", "update", "update", "delete"]), st.integers(0, 5),
                  st.sampled_from(["p", "q'", "r\\"]))
BATCHES = st.lists(st.lists(EVENT, min_size=1, max_size=6), min_size=1, max_size=3)
#: Late changes: an event and which earlier (odd) sequence it comes at; in-order changes have even ones.
LATE = st.lists(st.tuples(EVENT, st.integers(0, 10_000)), max_size=5)


def numbered(batches: list[list[tuple[str, int, str]]], start: int) -> tuple[list[list[Change]], int]:
    """In-order batches: each change at the next even sequence from ``start``."""
    out, seq = [], start
    for b in batches:
        out.append([(op, k, None if op == "delete" else v, seq + 2 * i) for i, (op, k, v) in enumerate(b)])
        seq += 2 * len(b)
    return out, seq


def recorded(history: list[list[Change]], scd_type: int) -> set[int]:
    """The keys whose head an ordered table records exactly: a live key; SCD type 2, also a key whose last
    change is the delete that closed its version (not a repeated delete, nor the delete of a key never held)."""
    changes: dict[int, list[str]] = {}
    for b in history:
        for op, k, _, _ in b:
            changes.setdefault(k, []).append(op)
    return {k for k, ops in changes.items()
            if ops[-1] != "delete" or (scd_type == 2 and len(ops) > 1 and ops[-2] != "delete")}


@settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.too_slow])
@given(BATCHES, BATCHES, LATE, st.sampled_from([1, 2]))
def test_ordered_then_safe_equals_safe_from_the_start(before: Any, after: Any, late: Any, scd_type: int) -> None:
    """An ordered table migrated to safe mode holds the key heads a table safe from the start holds for each
    key the ordered table records (see :func:`recorded`); written on by a safe query (in-order batches, then
    late changes at earlier sequences of those keys and of the keys written after the migration), it holds
    the same rows and heads."""
    with tempfile.TemporaryDirectory() as d:
        ordered_then_safe(before, after, late, scd_type, f"{d}/m", f"{d}/r")


def ordered_then_safe(before: Any, after: Any, late: Any, scd_type: int, migrated: str, reference: str) -> None:
    first, seq = numbered(before, 2)
    for i, b in enumerate(first):
        sink(migrated, True, scd_type=scd_type).write(table(b), i)
        sink(reference, False, scd_type=scd_type).write(table(b), i)
    assert DeltaUpsertSink(migrated, keys=["id"], scd_type=scd_type).migrate("safe") is True
    assert mode(migrated) == "safe"
    seen = recorded(first, scd_type)
    assert heads(migrated, seen) == heads(reference, seen)
    then, seq = numbered(after, seq)
    seen |= {c[1] for b in then for c in b}
    stale = {(k, 2 * (at % (seq // 2)) + 1): (op, v) for (op, k, v), at in late if k in seen}
    then.append([(op, k, None if op == "delete" else v, s) for (k, s), (op, v) in stale.items()])
    for i, b in enumerate(then, start=len(first)):
        if b:
            sink(migrated, False, scd_type=scd_type).write(table(b), i)
            sink(reference, False, scd_type=scd_type).write(table(b), i)
    assert rows(migrated) == rows(reference)
    assert heads(migrated, seen) == heads(reference, seen)


@settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.too_slow])
@given(BATCHES, BATCHES, st.sampled_from([1, 2]))
def test_safe_then_ordered_equals_ordered_from_the_start(before: Any, after: Any, scd_type: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        safe_then_ordered(before, after, scd_type, f"{d}/m", f"{d}/r")


def safe_then_ordered(before: Any, after: Any, scd_type: int, migrated: str, reference: str) -> None:
    first, seq = numbered(before, 2)
    then, _ = numbered(after, seq)
    for i, b in enumerate(first):
        sink(migrated, False, scd_type=scd_type).write(table(b), i)
        sink(reference, True, scd_type=scd_type).write(table(b), i)
    assert Path(migrated, STATE_DIR).exists()
    assert DeltaUpsertSink(migrated, keys=["id"], scd_type=scd_type).migrate("ordered") is True
    assert mode(migrated) == "ordered" and not Path(migrated, STATE_DIR).exists()
    for i, b in enumerate(then, start=len(first)):
        sink(migrated, True, scd_type=scd_type).write(table(b), i)
        sink(reference, True, scd_type=scd_type).write(table(b), i)
    assert rows(migrated) == rows(reference)
    assert not Path(migrated, STATE_DIR).exists()


def test_tombstones_after_the_migration_and_none_before(tmp_path: Path) -> None:
    """SCD type 1: a key deleted after the migration to safe mode keeps its tombstone (a late, older insert is
    ignored) and a live key its sequence (a late update is ignored); a key deleted while the table was ordered
    has none, so an older insert arriving later brings it back, as it would have in ordered mode."""
    path = str(tmp_path / "t")
    sink(path, True).write(table([("insert", 1, "x", 10), ("insert", 2, "y", 11), ("insert", 3, "z", 12),
                                  ("delete", 3, None, 13)]), 0)
    assert sink(path, None).migrate("safe") is True
    assert heads(path) == [(1, 10, False), (2, 11, False)]
    s = sink(path, False)
    s.write(table([("delete", 2, None, 20)]), 1)
    s.write(table([("insert", 2, "back", 15), ("update", 1, "old", 9), ("insert", 3, "back", 5)]), 2)
    assert [(r["id"], r["a"], r["_seq"]) for r in rows(path)] == [(1, "x", 10), (3, "back", 5)]
    assert heads(path) == [(1, 10, False), (2, 20, True), (3, 5, False)]


def test_scd2_deleted_keys_become_tombstones(tmp_path: Path) -> None:
    """SCD type 2: the state holds each current version's sequence, and each deleted key's delete (its last
    closed version's ``_valid_to``) as a tombstone stamped with the migration's time; a repeated delete (15)
    left nothing in the ordered table, so the tombstone is the first delete's."""
    path = str(tmp_path / "t")
    sink(path, True, scd_type=2).write(table([("insert", 1, "x", 10), ("update", 1, "y", 12), ("insert", 2, "z", 11),
                                              ("delete", 2, None, 13), ("delete", 2, None, 15)]), 0)
    assert sink(path, None, scd_type=2).migrate("safe") is True
    state = DeltaTable(f"{path}/{STATE_DIR}").to_pyarrow_table().sort_by("id").to_pylist()
    assert state == [{"id": 1, "_seq": 12, DELETED_AT: None}, {"id": 2, "_seq": 13, DELETED_AT: NOW}]


def test_a_query_claiming_the_old_mode_fails_before_and_after(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    first = table([("insert", 1, "x", 1)])
    sink(path, True).write(first, 0)
    with pytest.raises(ModeMismatchError, match="created in ordered mode .* asks for safe mode"):
        sink(path, False).write(table([("update", 1, "y", 2)]), 1)
    free = sink(path, None)  # no claim: follows the table's mode, which it has read
    assert free.table_mode() == "ordered"
    assert free.migrate("safe") is True
    assert free.table_mode() == "safe" and sink(path, None).table_mode() == "safe"
    with pytest.raises(ModeMismatchError, match="created in safe mode .* asks for ordered mode"):
        sink(path, True).write(table([("update", 1, "y", 2)]), 1)
    assert free.write(table([("update", 1, "y", 2)]), 1)  # safe: the state table follows
    assert heads(path) == [(1, 2, False)]
    assert sink(path, None).migrate("ordered") is True
    with pytest.raises(ModeMismatchError, match="created in ordered mode .* asks for safe mode"):
        sink(path, False).write(table([("update", 1, "z", 3)]), 2)
    assert sink(path, True).write(table([("update", 1, "z", 3)]), 2)
    assert [(r["id"], r["a"]) for r in rows(path)] == [(1, "z")]


def test_nothing_to_do_and_bad_input(tmp_path: Path) -> None:
    """The same mode changes nothing (False); a bad mode, a missing table and a table of the previous layout
    are refused naming what is wrong."""
    path = str(tmp_path / "t")
    with pytest.raises(OptionError, match=f"no Delta table at {path}: nothing to migrate"):
        sink(path, None).migrate("safe")
    assert sink(path, None).migrate() is False  # the layout migration: nothing to migrate, as before
    sink(path, True).write(table([("insert", 1, "x", 1)]), 0)
    version = DeltaTable(path).version()
    with pytest.raises(OptionError, match=r"parameter 'mode' of migrate\(\): 'fast' is not accepted; accepted: "
                                          r"ordered, safe") as e:
        sink(path, None).migrate("fast")
    assert e.value.option == "mode"
    assert sink(path, None).migrate("ordered") is False
    assert DeltaTable(path).version() == version and not Path(path, STATE_DIR).exists()
    legacy = str(tmp_path / "l")
    DeltaTable.create(legacy, pa.schema([("id", pa.int64()), ("_seq", pa.int64()), (DELETED_AT, TS)]))
    with pytest.raises(LegacyLayoutError, match=r"run migrate\(\) \(without a mode\) first"):
        sink(legacy, None).migrate("ordered")


@pytest.mark.parametrize("scd_type", [1, 2])
def test_an_ordered_table_without_its_sequence_is_refused(tmp_path: Path, scd_type: int) -> None:
    path = str(tmp_path / "t")
    s = sink(path, True, scd_type=scd_type, bookkeeping_columns=["commit_ts"])
    s.write(table([("insert", 1, "x", 1)]), 0)
    version = DeltaTable(path).version()
    with pytest.raises(OptionError, match="does not keep its sequence column '_seq' .*'bookkeeping_columns' without "
                                          "'sequence'.* cannot seed the state table") as e:
        s.migrate("safe")
    assert e.value.option == "bookkeeping_columns"
    assert DeltaTable(path).version() == version and mode(path) == "ordered"
    assert not Path(path, STATE_DIR).exists()


def test_a_crash_between_the_commits_is_completed_by_running_again(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    s = sink(path, True)
    s.write(table([("insert", 1, "x", 1), ("insert", 2, "y", 2)]), 0)
    # To safe: the state table written, then the crash before the property.
    seed_state(path, s.spec, None, NOW)
    assert mode(path) == "ordered"
    with pytest.raises(ModeMismatchError):
        sink(path, False).write(table([("update", 1, "z", 3)]), 1)
    assert sink(path, None).migrate("safe") is True and mode(path) == "safe"
    assert heads(path) == [(1, 1, False), (2, 2, False)]
    sink(path, False).write(table([("update", 1, "z", 3)]), 1)
    # To ordered: the property set, then the crash before the state table is removed.
    set_mode(path, "ordered", None)
    assert sink(path, None).migrate("ordered") is True
    assert not Path(path, STATE_DIR).exists()
    assert sink(path, None).migrate("ordered") is False
    # A crash during the removal: the renamed folder is left; running again removes it.
    seed_state(path, s.spec, None, NOW)
    os.replace(Path(path, STATE_DIR), Path(path, STATE_DIR + ".dropped"))
    assert sink(path, None).migrate("ordered") is True
    assert sorted(os.listdir(path)) == sorted(n for n in os.listdir(path) if not n.startswith(STATE_DIR))
    # A state table left by a crash is never reused: back to safe overwrites it from the main table.
    seed_state(path, s.spec, None, NOW)
    set_mode(path, "ordered", None)  # (already)
    sink(path, True).write(table([("delete", 2, None, 4), ("insert", 3, "w", 5)]), 2)
    assert sink(path, None).migrate("safe") is True
    assert heads(path) == [(1, 3, False), (3, 5, False)]
    assert state_rows(path, s.spec, None, NOW).num_rows == 2


@pytest.mark.spark
def test_migrate_a_delta_spark_table(spark: Any, tmp_path: Path) -> None:
    """delta-spark reads the property the migration sets, and a delta-spark query continues in the new mode
    as one safe from the start does (its late change of a key deleted after the migration is ignored)."""
    path, reference = str(tmp_path / "m"), str(tmp_path / "r")
    first = table([("insert", 1, "x", 2), ("insert", 2, "y", 4)])
    then = table([("delete", 2, None, 6), ("insert", 2, "back", 5), ("update", 1, "old", 1)])
    sink(path, True, engine="delta-spark").write_frame(spark.createDataFrame(first), 0)
    assert sink(path, None, engine="delta-spark").migrate("safe") is True
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    assert props[MODE_PROPERTY] == "safe"
    with pytest.raises(ModeMismatchError):
        sink(path, True, engine="delta-spark").write_frame(spark.createDataFrame(then), 1)
    sink(path, False, engine="delta-spark").write_frame(spark.createDataFrame(then), 1)
    for i, b in enumerate((first, then)):
        sink(reference, False).write(b, i)
    assert rows(path) == rows(reference)
    assert heads(path) == heads(reference) == [(1, 2, False), (2, 6, True)]
