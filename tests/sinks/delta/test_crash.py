"""Exactly-once under a real crash: a streaming query is killed with SIGKILL mid-batch and restarted.

The child process (tests/drivers/delta_crash_child.py) runs ``readStream.format("cdc")`` from a local change log into
``DeltaUpsertSink``. It is killed either after the sink's Delta commit but before Spark records the batch
(so Spark replays the batch on restart and the sink must skip it), or before the sink commits (so the
replay must apply it), or between the main table's commit and the state table's (so the replay must commit
the state alone), or, in pipelined mode, after Spark recorded the batch as done but before its
background MERGE committed (so the staged copy must be merged on restart; in both of the sink's modes). Either way the table must equal the source table and every batch id must be
committed exactly once on each of the two tables (their Delta logs' application-transaction actions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.backends.local import LocalLog

ROOT = Path(__file__).resolve().parents[3]
CHILD = ROOT / "tests" / "drivers" / "delta_crash_child.py"
SCHEMA = [("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64())]


def write_history(log: LocalLog) -> dict[int, tuple[str, int]]:
    """Several appends of inserts, updates and deletes (with a channel split); returns the source table."""
    source: dict[int, tuple[str, int]] = {}
    step = 0
    for round_ in range(6):
        rows: list[dict[str, Any]] = []
        for i in range(30):
            step += 1
            key = (i * 7 + round_ * 3) % 45
            if step % 5 == 0 and key in source:
                rows.append({"_op": "delete", "id": key})
                del source[key]
            else:
                op = "update" if key in source else "insert"
                rows.append({"_op": op, "id": key, "name": f"n{step}", "qty": step})
                source[key] = (f"n{step}", step)
        log.append(rows)
        if round_ == 2:
            log.split(log.open_channels()[0])
    return source


def txn_versions(table: Path) -> list[tuple[str, int]]:
    out = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out.append((action["txn"]["appId"], action["txn"]["version"]))
    return out


def run_child(args: list[str], wait_for: Path | None, then: Path | None = None, pipelined: bool = False,
              deadline_s: float = 300) -> None:
    """Run the child; with ``wait_for``, kill it (-9, its whole process group) once that marker appears
    (and ``then``), failing after ``deadline_s`` seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
           "CRASH_CHILD_PIPELINED": "1" if pipelined else "0"}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), *args], env=env, cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        if wait_for is None:
            _, err = proc.communicate(timeout=deadline_s)
            assert proc.returncode == 0, err.decode()[-3000:]
            return
        deadline = time.monotonic() + deadline_s
        while not wait_for.exists():
            assert proc.poll() is None, f"the child exited early: {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}"
            assert time.monotonic() < deadline, "the child never reached the crash point"
            time.sleep(0.1)
        while then is not None and not then.exists():
            assert time.monotonic() < deadline, f"{then} never appeared"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # the child, its JVM and its Python workers: a real crash
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def run_here(spark: Any, args: list[str], pipelined: bool = False, deadline_s: float = 300) -> None:
    """The run after the kills, which nothing kills: the same query in the tests' own Spark session (it
    recovers from the checkpoint as a new driver would, without the cost of a child's JVM)."""
    from tests.drivers.delta_crash_child import run

    run(spark, *args, pipelined=pipelined, timeout_s=deadline_s)


def check_table(table: Path, source: dict[int, tuple[str, int]], calls: list[tuple[str, ...]],
                ordered: bool = False) -> None:
    """Each batch id committed exactly once, under one application id that survived the restarts, and the
    table equals the source table. Ordered mode: the table alone (it has no state table)."""
    if ordered:
        assert not (table / "_cdc_state").exists()
    for log_of in (table,) if ordered else (table, table / "_cdc_state"):
        txns = txn_versions(log_of)
        apps = {a for a, _ in txns}
        assert len(apps) == 1 and next(iter(apps)).startswith("cdc-tunnel-")
        versions = [v for _, v in txns]
        assert versions == sorted(set(versions)), f"a batch was committed twice to {log_of}: {versions}"
        assert versions[-1] == max(int(b) for _, b in calls)
    from deltalake import DeltaTable

    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert {r["id"]: (r["name"], r["qty"]) for r in rows} == source, "the table (live rows only) equals the source"


def read_calls(markers: Path) -> list[tuple[str, ...]]:
    return [tuple(line.split()) for line in (markers / "calls.txt").read_text().splitlines()]


@pytest.mark.slow
def test_kill_9_mid_batch_then_restart(spark: Any, tmp_path: Path) -> None:
    """Run 1 is killed after batch 2's Delta commits (before Spark's), run 2 before batch 3's Delta commits,
    run 3 between batch 4's main and state commits, run 4 finishes. Spark replays the three batches: the
    first replay must be skipped, the second applied, the third applied to the state table only."""
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source = write_history(log)
    table, ck, markers = tmp_path / "table", tmp_path / "ck", tmp_path / "markers"
    markers.mkdir()
    args = [str(tmp_path / "log"), str(table), str(ck), str(markers)]
    run_child([*args, "--hold-after-commit", "2"], markers / "holding")
    (markers / "holding").unlink()
    run_child([*args, "--hold-before-commit", "3"], markers / "holding")
    (markers / "holding").unlink()
    run_child([*args, "--hold-between-commits", "4"], markers / "holding")
    from deltalake import DeltaTable

    main_txn = DeltaTable(str(table)).transaction_version(txn_versions(table)[0][0])
    state_txn = DeltaTable(str(table / "_cdc_state")).transaction_version(txn_versions(table)[0][0])
    assert (main_txn, state_txn) == (4, 3), "killed between the two commits of batch 4"
    run_here(spark, args)
    calls = read_calls(markers)
    assert len({pid for pid, _ in calls}) == 4
    batches = [b for _, b in calls]
    assert [batches.count(b) for b in "234"] == [2, 2, 2], batches  # Spark really replayed them
    check_table(table, source, calls)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["safe", "ordered"])
def test_kill_9_pipelined_after_spark_commit_then_restart(spark: Any, tmp_path: Path, mode: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined mode: killed once Spark has recorded batch 2 as done (its commit log entry) while the
    batch's MERGE waits in the background: only the staged copy can bring batch 2 to the table. In both of the
    sink's modes (ordered: one commit per batch, no state table)."""
    monkeypatch.setenv("CRASH_CHILD_ORDERED", "1" if mode == "ordered" else "0")  # the child and the run here
    log = LocalLog.create(tmp_path / "log", SCHEMA, ["id"], channels=2)
    source = write_history(log)
    table, ck, markers = tmp_path / "table", tmp_path / "ck", tmp_path / "markers"
    markers.mkdir()
    args = [str(tmp_path / "log"), str(table), str(ck), str(markers)]
    run_child([*args, "--hold-in-background-merge", "2"], markers / "holding", then=ck / "commits" / "2")
    assert any((table / "_cdc_staging").rglob("*.arrow"))
    run_here(spark, args, pipelined=True)
    calls = read_calls(markers)
    assert len({pid for pid, _ in calls}) == 2
    assert [b for _, b in calls].count("2") == 1  # Spark does not replay a batch it recorded as done
    assert not any((table / "_cdc_staging").rglob("*.arrow"))
    check_table(table, source, calls, ordered=mode == "ordered")
