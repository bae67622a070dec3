"""Windowed order aggregation: the same change log feeds a streaming job and a batch job, and they agree.

1. An orders table's changes go to a local change log (2 channels) while the job runs. Each burst of changes is
   committed 15 seconds of (simulated) event time after the previous one.
2. A streaming query aggregates the changes into 1-minute event-time windows of ``_commit_ts``: orders placed
   (inserts), their revenue, status changes (updates) and cancellations (deletes). A 2-minute watermark closes
   windows; a closed window is appended once to a Parquet table (output mode ``append``).
3. Once the query has run a batch, the writer also sends late changes: committed an hour before the history
   began, far behind the watermark. Spark drops them; the demo counts them from the query's progress
   (``stateOperators[].numRowsDroppedByWatermark``) and checks that count against the writer's own.
4. A batch job reads the same log with ``spark.read.format("cdc")`` and computes the same windows. Every
   window the stream closed must equal the batch job's over the same log minus the dropped changes; windows
   still open at the end are not yet emitted.
5. It draws the windows (orders placed and revenue per minute; open windows hatched) into ``windows.png``
   next to the output table.

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
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from orders_demo import SCHEMA, OrderSource, demo_session  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from cdc.backends.local import LocalLog  # noqa: E402
from cdc.checkpoint import last_committed  # noqa: E402

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=15)
LATE = EPOCH - timedelta(hours=1)
"""Late changes are committed from here back, one per minute: each alone in its window, so Spark's count of
rows dropped by the watermark (taken after partial aggregation: one row per window and partition) counts
changes."""


def windows(changes: DataFrame) -> DataFrame:
    """Per 1-minute window of commit time: orders placed, their revenue, status changes, cancellations."""
    return changes.groupBy(F.window("_commit_ts", "1 minute").alias("window")).agg(
        F.count(F.when(F.col("_op") == "insert", 1)).alias("placed"),
        F.round(F.sum(F.when(F.col("_op") == "insert", F.col("amount"))), 2).alias("revenue"),
        F.count(F.when(F.col("_op") == "update", 1)).alias("status_changes"),
        F.count(F.when(F.col("_op") == "delete", 1)).alias("cancelled"),
    )


def draw(streamed: dict[datetime, dict[str, Any]], batch: dict[datetime, dict[str, Any]], path: Path) -> Path:
    """Orders placed and revenue per 1-minute window: closed windows (the stream's) solid, open ones hatched."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    starts = sorted(batch)
    closed = [s in streamed for s in starts]
    labels = [f"{s:%H:%M}" for s in starts]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for ax, key, colour, title in ((top, "placed", "#4c72b0", "orders placed"),
                                   (bottom, "revenue", "#dd8452", "revenue")):
        values = [(streamed.get(s) or batch[s])[key] or 0 for s in starts]
        bars = ax.bar(labels, values, color=colour)
        for bar, is_closed in zip(bars, closed, strict=True):
            if not is_closed:
                bar.set_alpha(0.35)
                bar.set_hatch("//")
        ax.set_ylabel(title)
    top.set_title("Orders per 1-minute window of commit time (hatched: still open, not yet emitted)")
    bottom.set_xlabel(f"window start, {starts[0]:%Y-%m-%d} UTC" if starts else "window start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
    late: list[datetime] = []

    def send_late() -> None:
        ts = LATE - timedelta(minutes=len(late))
        log.append([{"order_id": 10_000_000 + len(late), "customer": "late", "amount": 1.0, "status": "new",
                     "_op": "insert"}], commit_ts=ts)
        late.append(ts)

    def writer() -> None:
        bursts = 0
        while not stop.is_set():
            burst()
            bursts += 1
            # A late change is late only once the watermark exists: after the query's first batch.
            if bursts % 3 == 0 and query.lastProgress is not None:
                send_late()
            time.sleep(0.25)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(args.seconds)
    stop.set()
    t.join()
    query.processAllAvailable()
    for _ in range(3):  # on a slow machine the writer may have finished before the first batch did
        send_late()
    query.processAllAvailable()
    # The progress of the last batch is recorded just after its commit: wait for it before adding up.
    last = last_committed(ck).batch_id
    deadline = time.monotonic() + 60
    while (query.lastProgress or {}).get("batchId", -1) < last and time.monotonic() < deadline:
        time.sleep(0.1)
    dropped = sum(op["numRowsDroppedByWatermark"] for p in query.recentProgress for op in p.stateOperators)
    query.stop()
    print(f"{source.changes} changes over {(clock['t'] - EPOCH).total_seconds() / 60:.1f} minutes of event time")
    print(f"late changes sent by the writer: {len(late)}; dropped by the watermark (query progress): {dropped}")

    streamed = {r["window"]["start"]: r.asDict() for r in spark.read.parquet(str(table)).collect()}
    batch_changes = spark.read.format("cdc").option("backend", "local").option("path", str(log.path)).load()
    kept = batch_changes.filter(~F.col("_commit_ts").isin(late))  # the same log minus the dropped changes
    batch = {r["window"]["start"]: r.asDict() for r in windows(kept).collect()}
    print(f"windows closed by the stream: {len(streamed)}; windows in the batch job: {len(batch)} "
          f"(the last ones are still open: the watermark has not passed them)")
    print(f"{'window start':<22}{'placed':>8}{'revenue':>12}{'updates':>9}{'cancelled':>10}   batch job agrees")
    for start in sorted(batch):
        b, s = batch[start], streamed.get(start)
        verdict = "yes" if s == b else ("(open)" if s is None else "NO")
        print(f"{start:%Y-%m-%d %H:%M:%S}   {b['placed']:>8}{b['revenue']:>12.2f}{b['status_changes']:>9}"
              f"{b['cancelled']:>10}   {verdict}")
    picture = draw(streamed, batch, root / "windows.png")
    print(f"picture of the windows: {picture}")
    ok = bool(streamed) and all(batch.get(start) == row for start, row in streamed.items())
    ok = ok and dropped == len(late) > 0
    print("RESULT:", "every closed window equals the batch job's, and every late change was dropped"
          if ok else "MISMATCH")
    spark.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
