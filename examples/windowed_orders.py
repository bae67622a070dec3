"""Windowed order aggregation: the same change log feeds a streaming job and a batch job, and they agree.

1. An orders table's changes go to a local change log (2 channels) while the job runs. Each burst of changes is
   committed 15 seconds of (simulated) event time after the previous one.
2. A streaming query aggregates the changes into 1-minute event-time windows of ``_commit_ts``: orders placed
   (inserts), their revenue, status changes (updates) and cancellations (deletes). A 2-minute watermark closes
   windows; a closed window is appended once to a Parquet table (output mode ``append``).
3. A batch job reads the same log with ``spark.read.format("cdc")`` and computes the same windows. Every
   window the stream closed must equal the batch job's; windows still open at the end are not yet emitted.

    python examples/windowed_orders.py [--dir windowed-output] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from orders_demo import SCHEMA, OrderSource, demo_session  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from cdc.backends.local import LocalLog  # noqa: E402

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=15)


def windows(changes: DataFrame) -> DataFrame:
    """Per 1-minute window of commit time: orders placed, their revenue, status changes, cancellations."""
    return changes.groupBy(F.window("_commit_ts", "1 minute").alias("window")).agg(
        F.count(F.when(F.col("_op") == "insert", 1)).alias("placed"),
        F.round(F.sum(F.when(F.col("_op") == "insert", F.col("amount"))), 2).alias("revenue"),
        F.count(F.when(F.col("_op") == "update", 1)).alias("status_changes"),
        F.count(F.when(F.col("_op") == "delete", 1)).alias("cancelled"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="windowed-output", help="where the log, table and checkpoint go")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the writer runs")
    args = ap.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    log = LocalLog.create(root / "orders-log", SCHEMA, keys=["order_id"], channels=2)
    source = OrderSource(log, seed=11)
    clock = {"t": EPOCH}

    def burst() -> None:
        source.burst(200, commit_ts=clock["t"])
        clock["t"] += STEP

    for _ in range(8):  # two minutes of history before the job starts
        burst()

    spark = demo_session("cdc-windowed-orders")

    table, ck = root / "windows", root / "checkpoint"
    changes = spark.readStream.format("cdc").option("backend", "local").option("path", str(log.path)).load()
    query = (windows(changes.withWatermark("_commit_ts", "2 minutes"))
             .writeStream.outputMode("append").format("parquet")
             .option("path", str(table)).option("checkpointLocation", str(ck))
             .trigger(processingTime="1 second").start())

    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            burst()
            time.sleep(0.25)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(args.seconds)
    stop.set()
    t.join()
    query.processAllAvailable()
    query.stop()
    print(f"{source.changes} changes over {(clock['t'] - EPOCH).total_seconds() / 60:.1f} minutes of event time")

    streamed = {r["window"]["start"]: r.asDict() for r in spark.read.parquet(str(table)).collect()}
    batch_changes = spark.read.format("cdc").option("backend", "local").option("path", str(log.path)).load()
    batch = {r["window"]["start"]: r.asDict() for r in windows(batch_changes).collect()}
    print(f"windows closed by the stream: {len(streamed)}; windows in the batch job: {len(batch)} "
          f"(the last ones are still open: the watermark has not passed them)")
    print(f"{'window start':<22}{'placed':>8}{'revenue':>12}{'updates':>9}{'cancelled':>10}   batch job agrees")
    for start in sorted(batch):
        b, s = batch[start], streamed.get(start)
        verdict = "yes" if s == b else ("(open)" if s is None else "NO")
        print(f"{start:%Y-%m-%d %H:%M:%S}   {b['placed']:>8}{b['revenue']:>12.2f}{b['status_changes']:>9}"
              f"{b['cancelled']:>10}   {verdict}")
    ok = bool(streamed) and all(batch.get(start) == row for start, row in streamed.items())
    print("RESULT:", "every closed window equals the batch job's" if ok else "MISMATCH")
    spark.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
