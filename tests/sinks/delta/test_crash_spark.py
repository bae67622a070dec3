"""The ``kill -9`` exactly-once test of test_crash.py on the delta-spark engine: the child's query merges each
batch inside Spark (Delta's idempotent-write confs carry the application transaction) and is killed after a
batch's two Delta commits and between the main table's commit and the state table's; the restarted query must
leave the table equal to the source with every batch id committed once to each table. (Pipelined mode is
delta-rs only.) The third crash point of test_crash.py, before a batch's commits, is not repeated here: nothing
of the batch reached either table, so its replay is Spark's alone and takes no engine-specific path (the
delta-rs test covers it; each child here costs 40-60 s of a JVM start and Spark MERGEs).

Sized for delta-spark: the same history in 45-change batches (4 or 5 batches, not 6 to 7: each is a few Spark
MERGEs), and a per-child deadline of 600 s (a delta-spark child reached its crash point after more than 300 s
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
    monkeypatch.setenv("CRASH_CHILD_MAX_RECORDS", "45")
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source = write_history(log)
    table, ck, markers = tmp_path / "table", tmp_path / "ck", tmp_path / "markers"
    markers.mkdir()
    args = [str(tmp_path / "log"), str(table), str(ck), str(markers)]
    run_child([*args, "--hold-after-commit", "1"], markers / "holding", deadline_s=DEADLINE_S)
    (markers / "holding").unlink()
    run_child([*args, "--hold-between-commits", "3"], markers / "holding", deadline_s=DEADLINE_S)
    app = txn_versions(table)[0][0]
    main_txn, state_txn = DeltaTable(str(table)).transaction_version(app), DeltaTable(
        str(table / "_cdc_state")).transaction_version(app)
    assert (main_txn, state_txn) == (3, 2), "killed between the two commits of batch 3"
    run_here(spark, args, deadline_s=DEADLINE_S)  # the engine and batch size from the environment, as the children
    calls = read_calls(markers)
    assert len({pid for pid, _ in calls}) == 3
    batches = [b for _, b in calls]
    # Spark really replayed batches 1 and 3 (each killed after a commit), batch 2 ran once.
    assert [batches.count(b) for b in "123"] == [2, 1, 2], batches
    check_table(table, source, calls)
