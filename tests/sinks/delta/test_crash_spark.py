"""The ``kill -9`` exactly-once test of test_crash.py on the delta-spark engine: the child's query merges each
batch inside Spark (Delta's idempotent-write confs carry the application transaction), is killed after a
Delta commit and before one, and the restarted query must leave the table equal to the source with every
batch id committed once. (Pipelined mode is delta-rs only.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.backends.local import LocalLog
from tests.sinks.delta.test_crash import SCHEMA, check_table, read_calls, run_child, write_history


@pytest.mark.slow
def test_kill_9_mid_batch_then_restart_on_delta_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASH_CHILD_ENGINE", "delta-spark")
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source = write_history(log)
    table, ck, markers = tmp_path / "table", tmp_path / "ck", tmp_path / "markers"
    markers.mkdir()
    args = [str(tmp_path / "log"), str(table), str(ck), str(markers)]
    run_child([*args, "--hold-after-commit", "2"], markers / "holding")
    (markers / "holding").unlink()
    run_child([*args, "--hold-before-commit", "3"], markers / "holding")
    run_child(args, None)
    calls = read_calls(markers)
    assert len({pid for pid, _ in calls}) == 3
    batches = [b for _, b in calls]
    assert batches.count("2") == 2 and batches.count("3") == 2, batches  # Spark really replayed them
    check_table(table, source, calls)
