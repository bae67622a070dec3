"""The ``kill -9`` exactly-once test of test_crash.py on the delta-spark engine: the child's query merges each
batch inside Spark (Delta's idempotent-write confs carry the application transaction) and is killed between
the main table's commit and the state table's (safe mode); the restarted query must leave the table equal to
the source with every batch id committed once to each table. (Pipelined mode is delta-rs only.) The other
crash points of test_crash.py are not repeated here, each child costing 40-90 s of a JVM start and Spark
MERGEs: before a batch's commits nothing of the batch reached either table, so its replay is Spark's alone;
after both commits the replay is skipped by the committed version read from the table's log, which
test_delta_spark.py's frame-path test checks in-process (the delta-rs test kills the process there).

Sized for delta-spark: the same history in two 90-change batches (not 6 or 7: each is a few Spark MERGEs),
killed in the second, so one batch is committed whole before the crash and one replayed; a per-child deadline of 600 s (a delta-spark child reached its crash point after more than 300 s
on the 2-core machine under load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from cdc.backends.local import LocalLog
from tests.sinks.delta.test_crash import (
    SCHEMA,
    check_table,
    read_calls,
    run_child,
    run_here,
    txn_versions,
    write_history,
)

DEADLINE_S = 600


@pytest.mark.slow
def test_kill_9_mid_batch_then_restart_on_delta_spark(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASH_CHILD_ENGINE", "delta-spark")
    monkeypatch.setenv("CRASH_CHILD_MAX_RECORDS", "90")
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source = write_history(log)
    table, ck, markers = tmp_path / "table", tmp_path / "ck", tmp_path / "markers"
    markers.mkdir()
    args = [str(tmp_path / "log"), str(table), str(ck), str(markers)]
    run_child([*args, "--hold-between-commits", "1"], markers / "holding", deadline_s=DEADLINE_S)
    app = txn_versions(table)[0][0]
    main_txn, state_txn = DeltaTable(str(table)).transaction_version(app), DeltaTable(
        str(table / "_cdc_state")).transaction_version(app)
    assert (main_txn, state_txn) == (1, 0), "killed between the two commits of batch 1"
    run_here(spark, args, deadline_s=DEADLINE_S)  # the engine and batch size from the environment, as the children
    calls = read_calls(markers)
    assert len({pid for pid, _ in calls}) == 2
    batches = [b for _, b in calls]
    # Spark really replayed batch 1 (killed after its main commit), batch 0 ran once.
    assert [batches.count(b) for b in "01"] == [1, 2], batches
    check_table(table, source, calls)
