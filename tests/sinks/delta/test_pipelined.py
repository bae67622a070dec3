"""Pipelined mode without Spark: batches staged while the background merge runs are merged together.

``_stage_and_submit`` is what ``foreachBatch`` calls once the batch is collected; the merges run on real
delta-rs tables, and the first one is held on an event so that the next batches pile up deterministically."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta import DeltaUpsertSink
from sinks.delta.layout import state_path
from sinks.delta.staging import StagingLog
from tests.sinks.delta.test_sink import changes, live, state

BATCHES = [
    changes([("insert", 1, 1, "a", 1), ("insert", 2, 2, "b", 2), ("insert", 3, 3, "c", 3)]),
    changes([("update", 5, 1, "a5", 5), ("delete", 6, 2, None, None)]),
    changes([("update", 8, 3, "c8", 8), ("update", 4, 1, "stale", 4)]),  # seq 4 < 5 of batch 1: stale
    changes([("insert", 9, 2, "b9", 9), ("insert", 10, 4, "d", 10)]),  # key 2 comes back after its delete
]
EXPECTED = {1: ("a5", 5), 2: ("b9", 9), 3: ("c8", 8), 4: ("d", 10)}


def held_sink(path: Path, fail_group: bool = False) -> tuple[DeltaUpsertSink, threading.Event]:
    """A pipelined sink whose first main-table merge waits for the returned event; with ``fail_group`` the
    second main-table merge (the batches that waited) fails."""
    sink = DeltaUpsertSink(str(path), keys=["id"], app_id="test", compact_every=None, pipelined=True,
                           engine="delta-rs")
    engine = sink.engine()
    release, calls, merge = threading.Event(), [0], engine.merge

    def slow_merge(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls[0] += 1
        if calls[0] == 1:
            assert release.wait(60)
        if calls[0] == 2 and fail_group:
            raise OSError("the object store went away")
        return merge(*args, **kwargs)

    engine.merge = slow_merge  # type: ignore[method-assign]
    return sink, release


def test_batches_staged_while_a_merge_runs_are_merged_in_one_commit(tmp_path: Path) -> None:
    sink, release = held_sink(tmp_path / "t")
    for batch_id, batch in enumerate(BATCHES):
        sink._stage_and_submit(batch, batch_id, "test")
    release.set()
    sink.flush()
    assert {k: (r["name"], r["qty"]) for k, r in live(tmp_path / "t").items()} == EXPECTED
    assert state(tmp_path / "t") == {1: (5, False), 2: (9, False), 3: (8, False), 4: (10, False)}
    merges = [h for h in DeltaTable(str(tmp_path / "t")).history() if h["operation"] == "MERGE"]
    assert len(merges) == 2, "batch 0 alone, then batches 1-3 (staged while it ran) in one MERGE"
    for table in (str(tmp_path / "t"), state_path(str(tmp_path / "t"))):
        assert DeltaTable(table).transaction_version("test") == 3
    assert StagingLog(sink.staging_dir, "test").pending() == []


def test_a_failed_group_stays_staged_and_the_next_start_merges_it(tmp_path: Path) -> None:
    sink, release = held_sink(tmp_path / "t", fail_group=True)
    for batch_id, batch in enumerate(BATCHES):
        sink._stage_and_submit(batch, batch_id, "test")
    release.set()
    with pytest.raises(OSError, match="went away"):
        sink.flush()
    assert DeltaTable(str(tmp_path / "t")).transaction_version("test") == 0, "nothing after batch 0 committed"
    assert StagingLog(sink.staging_dir, "test").pending() == [1, 2, 3]
    restarted = DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], app_id="test", compact_every=None,
                                pipelined=True, engine="delta-rs")
    restarted._recover("test")
    assert {k: (r["name"], r["qty"]) for k, r in live(tmp_path / "t").items()} == EXPECTED
    assert DeltaTable(str(tmp_path / "t")).transaction_version("test") == 3
    assert StagingLog(sink.staging_dir, "test").pending() == []


def test_a_staged_batch_is_recovered_with_the_auto_cdc_options(tmp_path: Path) -> None:
    """A batch is staged as foreachBatch leaves it (excluded columns dropped, apply_as_truncates evaluated):
    recovery merges it as it is, without checking the column lists against it again."""
    staged = BATCHES[0].drop_columns(["qty"]).append_column("__cdc_is_truncate", pa.array([False, False, False]))
    StagingLog(str(tmp_path / "t" / "_cdc_staging"), "test").put(0, staged)
    restarted = DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], app_id="test", compact_every=None, pipelined=True,
                                engine="delta-rs", except_column_list=["qty"], apply_as_truncates="_op = 'x'")
    restarted._recover("test")
    assert {k: r["name"] for k, r in live(tmp_path / "t").items()} == {1: "a", 2: "b", 3: "c"}
    assert StagingLog(restarted.staging_dir, "test").pending() == []
