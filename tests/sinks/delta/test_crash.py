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
from deltalake import DeltaTable

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


def run_child(args: list[str], wait_for: Path | None, then: Path | list[Path] | None = None, pipelined: bool = False,
              deadline_s: float = 300) -> None:
    """Run the child; with ``wait_for``, kill it (-9, its whole process group) once that marker appears
    (and ``then``: one or more paths), failing after ``deadline_s`` seconds."""
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
        for path in [then] if isinstance(then, Path) else then or []:
            while not path.exists():
                assert proc.poll() is None, f"the child exited early: {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}"
                assert time.monotonic() < deadline, f"{path} never appeared"
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
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert {r["id"]: (r["name"], r["qty"]) for r in rows} == source, "the table (live rows only) equals the source"


def read_calls(markers: Path) -> list[tuple[str, ...]]:
    return [tuple(line.split()) for line in (markers / "calls.txt").read_text().splitlines()]


CRASH_POINTS = {
    # name: (the child's crash point, batch, pipelined, ordered)
    "after-commit": ("--hold-after-commit", 2, False, False),  # both Delta commits made, Spark's not: skipped
    "before-commit": ("--hold-before-commit", 3, False, False),  # nothing committed: applied
    "between-commits": ("--hold-between-commits", 4, False, False),  # the main table's made: the state's alone
    "pipelined-safe": ("--hold-in-background-merge", 2, True, False),  # Spark's made, the MERGE's not: staged
    "pipelined-ordered": ("--hold-in-background-merge", 2, True, True),
}


@pytest.mark.slow
def test_kill_9_at_every_crash_point_then_restart(spark: Any, tmp_path: Path) -> None:
    """One driver runs a query per crash point, each on its own log, table and checkpoint, and one ``kill -9``
    crashes them all once each holds at its point (a driver start per crash point costs ~30 s of a JVM):

    * after batch 2's Delta commits, before Spark's: Spark replays the batch and the sink must skip it;
    * before batch 3's Delta commits: the replay must apply it;
    * between batch 4's main and state commits: the replay must commit the state alone;
    * pipelined, in both of the sink's modes (ordered: one commit per batch, no state table): once Spark has
      recorded batch 2 as done while its MERGE waits in the background, only the staged copy can bring the
      batch to the table (Spark does not replay it).

    The queries then restart in the tests' own session, one after the other (as a new driver would, from their
    checkpoints)."""
    queries, sources = {}, {}
    for name, (hold, batch, pipelined, ordered) in CRASH_POINTS.items():
        log = LocalLog.create(tmp_path / name / "log", SCHEMA, ["id"], channels=2)
        sources[name] = write_history(log)
        (tmp_path / name / "markers").mkdir()
        queries[name] = {"log_path": str(tmp_path / name / "log"), "table": str(tmp_path / name / "table"),
                         "checkpoint": str(tmp_path / name / "ck"), "markers": str(tmp_path / name / "markers"),
                         "hold": hold, "hold_batch": batch, "pipelined": pipelined, "ordered": ordered}
    marks = [Path(q["markers"]) / "holding" for q in queries.values()]
    pipelined = [q for q in queries.values() if q["pipelined"]]
    spark_done = [Path(q["checkpoint"]) / "commits" / "2" for q in pipelined]
    spark_done += [Path(q["markers"]) / "next-held" for q in pipelined]
    run_child(["--queries", json.dumps(list(queries.values()))], marks[0], then=[*marks[1:], *spark_done])

    def table(name: str) -> Path:
        return tmp_path / name / "table"

    app = txn_versions(table("between-commits"))[0][0]
    main_txn = DeltaTable(str(table("between-commits"))).transaction_version(app)
    state_txn = DeltaTable(str(table("between-commits") / "_cdc_state")).transaction_version(app)
    assert (main_txn, state_txn) == (4, 3), "killed between the two commits of batch 4"
    for name in ("pipelined-safe", "pipelined-ordered"):
        assert any((table(name) / "_cdc_staging").rglob("*.arrow")), name

    from tests.drivers.delta_crash_child import finish, start

    for q in queries.values():  # one after the other (see the child's note on starting sources)
        finish([start(spark, **{k: v for k, v in q.items() if k not in ("hold", "hold_batch")})], timeout_s=300)
    for name, (_, crashed, pipelined, ordered) in CRASH_POINTS.items():
        calls = read_calls(tmp_path / name / "markers")
        assert len({pid for pid, _ in calls}) == 2, name
        batches = [b for _, b in calls]
        # Spark really replayed the batch it had not recorded as done, and does not replay one it had
        assert batches.count(str(crashed)) == (1 if pipelined else 2), (name, batches)
        if pipelined:
            assert not any((table(name) / "_cdc_staging").rglob("*.arrow")), name
        check_table(table(name), sources[name], calls, ordered=ordered)
