"""The pipeline on a Spark standalone cluster (a master and two workers on loopback, ``spark_cluster``): the
source read on executors, the orders pipeline end to end into Delta, ``kill -9`` of a worker mid-batch and of
the driver, restarts (the restarted driver on the delta-spark engine: its MERGE runs in the cluster); the table
equals the source, no batch committed twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from cdc.backends.local import LocalLog
from sinks.delta.layout import DELETED_AT
from sinks.delta.session import delta_jars
from tests.cluster.traced_source import DELAY_ENV, TRACE_ENV
from tests.streaming import committed_batches, wait_for

ROOT = Path(__file__).parents[2]
DRIVER = ROOT / "tests" / "drivers" / "cluster_orders.py"
sys.path.insert(0, str(ROOT / "examples"))
from orders_demo import SCHEMA, OrderSource  # noqa: E402

pytestmark = pytest.mark.slow

def _driver(cluster: Any, conf: dict[str, str], log: LocalLog, table: Path, ck: Path, mode: str,
            logfile: Path, engine: str = "delta-rs", max_records: int = 800) -> subprocess.Popen[bytes]:
    with open(logfile, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps({**cluster.session_conf(), **conf}), str(log.path), str(table),
             str(ck), mode, engine, str(max_records)],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )


DELTA_SPARK = {
    # The jars `make delta-spark` resolved (make test runs it first); delta_jars() names the command if not.
    "spark.jars": ",".join(str(j) for j in delta_jars()),
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta's log reads sized to this cluster's 2 cores (its default of 50 partitions is for large ones;
    # the README's cluster section says so): as configure_delta does for local[...].
    "spark.databricks.delta.snapshotPartitions": "2",
}
"""The session settings of the delta-spark engine on the cluster (its jars shipped to the executors)."""


def _live(table: Path) -> dict[int, dict[str, Any]]:
    data = DeltaTable(str(table)).to_pyarrow_table()
    if DELETED_AT in data.column_names:  # tombstones, where the table keeps them
        data = data.filter(data[DELETED_AT].is_null())
    cols = [name for name, _ in SCHEMA]
    return {r["order_id"]: r for r in data.select(cols).to_pylist()}


def _txns(table: Path) -> list[tuple[str, int]]:
    """Every (application id, batch id) the table's commits carry, in commit order."""
    out = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out.append((action["txn"]["appId"], action["txn"]["version"]))
    return out


def _writers(table: Path) -> list[tuple[str, str]]:
    """Each commit's (operation, writer): its ``engineInfo`` (``delta-rs:...`` or ``Apache-Spark/... Delta-Lake/...``)."""
    out = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                out.append((info.get("operation", ""), info.get("engineInfo", "")))
    return out


def _reads(trace: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in trace.glob("*.jsonl") for line in f.read_text().splitlines()]


def test_orders_pipeline_on_the_cluster_through_worker_and_driver_kills(spark_cluster: Any, tmp_path: Path) -> None:
    """The first driver runs the delta-rs engine (the MERGE on the driver) through a worker's kill and its own;
    the restarted driver runs the delta-spark engine on the same table and checkpoint (the MERGE on the
    executors, as ``engine="auto"`` picks on a cluster for a table a local run began): it replays the batch
    the kill interrupted and merges the changes written after it. One driver start for each engine (a driver
    start on the cluster costs a driver JVM, two executor JVMs and their Python workers); delta-spark's table
    creation and several of its batches are tests/sinks/delta's (a delta-spark MERGE on 1-core workers costs
    tens of seconds)."""
    cluster = spark_cluster
    trace = tmp_path / "trace"
    trace.mkdir()
    conf = {f"spark.executorEnv.{TRACE_ENV}": str(trace), f"spark.executorEnv.{DELAY_ENV}": "1",
            "spark.task.maxFailures": "8"}
    log = LocalLog.create(tmp_path / "orders-log", SCHEMA, keys=["order_id"], channels=2)
    source = OrderSource(log, seed=13)
    for _ in range(4):
        source.burst(500)  # history before the pipeline: arrives as a snapshot
    table, ck, driver_log = tmp_path / "lake" / "orders", tmp_path / "ck", tmp_path / "driver.log"

    driver = _driver(cluster, conf, log, table, ck, "forever", driver_log)
    try:
        wait_for(lambda: committed_batches(ck) >= 2, 240, "two batches committed on the cluster")
        source.burst(400)
        # Mid-batch: one of worker 0's executor reads is running (each sleeps 1 s) when the worker dies; the
        # batch's tasks move to the other worker.
        killed_pid = cluster.workers[0].pid
        since = time.time()
        wait_for(lambda: any(killed_pid in r["chain"] and r["t"] > since for r in _reads(trace)), 120,
                 "a read on worker 0 in a new batch")
        cluster.kill_worker(0)
        done = committed_batches(ck)
        source.burst(400)
        wait_for(lambda: committed_batches(ck) > done + 1, 240, "batches committed after the worker was killed")
        cluster.start_worker(0)
        cluster.wait_for_workers(2, 120)
        source.burst(400)
        wait_for(lambda: committed_batches(ck) > done + 2, 240, "a batch after the worker came back")
        os.killpg(driver.pid, signal.SIGKILL)  # kill -9 of the driver, mid-stream
        driver.wait(30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
    source.burst(400)
    merged_by_rs = len(_writers(table))
    again = _driver(cluster, {**conf, **DELTA_SPARK}, log, table, ck, "once", driver_log, engine="delta-spark")
    assert again.wait(600) == 0, driver_log.read_text()[-3000:]  # a driver start and delta-spark MERGEs, loaded

    assert _live(table) == source.rows
    txns = _txns(table)
    assert len(txns) == len(set(txns)), "a batch was committed twice"
    assert len({app for app, _ in txns}) == 1  # one query id across the driver's restart
    reads = _reads(trace)
    worker_pids = {killed_pid, *(w.pid for w in cluster.workers)}
    # Every read ran in a Python worker under an executor under a worker JVM, never in a driver.
    assert reads and all(set(r["chain"]) & worker_pids for r in reads)
    assert all(driver.pid not in r["chain"] and again.pid not in r["chain"] for r in reads)
    assert cluster.workers[1].pid in {p for r in reads for p in r["chain"]}  # the other worker read too
    writers = _writers(table)
    assert all(w.startswith("delta-rs") for _, w in writers[:merged_by_rs]), writers[:merged_by_rs]
    # The restarted driver merged the last changes with delta-spark (Spark's Delta writes engineInfo)
    assert any(op == "MERGE" and "Delta-Lake" in w for op, w in writers[merged_by_rs:]), writers[merged_by_rs:]

