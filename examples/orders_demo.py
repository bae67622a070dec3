"""Orders demo: an orders table streams from a change log into a Delta Lake table, full data then changes.

1. Creates a local change log of orders (2 channels) holding an existing history of changes.
2. Starts a streaming query with ``startingOffsets=snapshot``: the table's rows at a consistent cut arrive
   first (``_op = snapshot``), then every change after the cut, applied to a Delta table by
   ``DeltaUpsertSink`` (MERGE by key, ordered by ``_seq``, deletes, one Delta commit per batch, exactly once).
   A writer thread keeps inserting, updating and deleting orders the whole time.
3. Splits a channel mid-run (its key range moves to two children), then stops the writer, lets the query
   drain, and prints the Delta table next to the source table: they must be equal.

Run with ``make demo`` (no external service needed).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import cdc  # noqa: E402
from cdc.backends.local import LocalLog  # noqa: E402
from sinks.delta import DeltaUpsertSink, read  # noqa: E402

SCHEMA = [("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("status", pa.string())]


class OrderSource:
    """A pretend OLTP orders table whose every change goes to the change log."""

    def __init__(self, log: LocalLog, seed: int = 7) -> None:
        self.log, self.rng, self.rows, self.next_id = log, random.Random(seed), {}, 1
        self.changes = 0

    def burst(self, n: int, commit_ts: datetime | None = None) -> None:
        """Make ``n`` random changes (half inserts, 40% updates, 10% deletes), committed at ``commit_ts``."""
        batch = []
        for _ in range(n):
            roll = self.rng.random()
            if roll < 0.5 or len(self.rows) < 10:
                oid, self.next_id = self.next_id, self.next_id + 1
                row = {"order_id": oid, "customer": f"cust-{self.rng.randint(1, 40)}",
                       "amount": round(self.rng.uniform(5, 500), 2), "status": "new"}
                self.rows[oid] = row
                batch.append({**row, "_op": "insert"})
            elif roll < 0.9:
                oid = self.rng.choice(list(self.rows))
                row = {**self.rows[oid], "status": self.rng.choice(["paid", "shipped", "returned"]),
                       "amount": round(self.rows[oid]["amount"] * self.rng.uniform(0.9, 1.1), 2)}
                self.rows[oid] = row
                batch.append({**row, "_op": "update"})
            else:
                oid = self.rng.choice(list(self.rows))
                del self.rows[oid]
                batch.append({"order_id": oid, "_op": "delete"})
        self.log.append(batch, commit_ts=commit_ts)
        self.changes += n


def demo_session(app_name: str) -> SparkSession:
    """The examples' Spark session: local, 2 cores, UTC, quiet, with the ``cdc`` data source registered."""
    spark = (SparkSession.builder.master("local[2]").appName(app_name)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    return spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="demo-output", help="where the log, lake and checkpoint go")
    ap.add_argument("--seconds", type=float, default=12.0, help="how long the writer runs")
    args = ap.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    log = LocalLog.create(root / "orders-log", SCHEMA, keys=["order_id"], channels=2)
    source = OrderSource(log)
    for _ in range(10):
        source.burst(1000)  # the table's history before the pipeline starts
    print(f"change log at {log.path}: channels {log.open_channels()}, {source.changes} changes of history, "
          f"{len(source.rows)} orders")

    spark = demo_session("cdc-orders-demo")

    lake, ck = root / "lake" / "orders", root / "checkpoint"
    sink = DeltaUpsertSink(str(lake), keys=["order_id"], sequence_by="_seq")
    arrived = {"snapshot": 0, "changes": 0, "batches": 0}

    def apply(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        batch = batch.persist()  # counted and merged: read the source once
        counts = {r["_op"]: r["n"] for r in batch.groupBy("_op").agg(F.count("*").alias("n")).collect()}
        sink(batch, batch_id)
        batch.unpersist()
        arrived["snapshot"] += counts.pop("snapshot", 0)
        arrived["changes"] += sum(counts.values())
        arrived["batches"] += 1

    changes = (spark.readStream.format("cdc").option("backend", "local").option("path", str(log.path))
               .option("startingOffsets", "snapshot").option("maxRecordsPerTrigger", 2000).load())
    query = (changes.writeStream.foreachBatch(apply).option("checkpointLocation", str(ck))
             .trigger(processingTime="1 second").start())

    stop = threading.Event()

    def writer() -> None:
        split_done = False
        started = time.monotonic()
        while not stop.is_set():
            source.burst(300)
            if not split_done and time.monotonic() - started > args.seconds / 2:
                kids = log.split(log.open_channels()[0])
                print(f"split a channel mid-run: children {kids}; open channels now {log.open_channels()}")
                split_done = True
            time.sleep(0.25)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(args.seconds)
    stop.set()
    t.join()
    print(f"writer stopped after {source.changes} changes; draining the stream")
    query.processAllAvailable()
    query.stop()

    print(f"\nsnapshot rows delivered: {arrived['snapshot']}   changes after the cut: {arrived['changes']}   "
          f"batches: {arrived['batches']}   channels: {[c.id for c in log.channels()]}")
    lake_table = read(spark, str(lake)).select("order_id", "customer", "amount", "status")
    lake_rows = {r["order_id"]: r.asDict() for r in lake_table.collect()}
    source_table = spark.createDataFrame(list(source.rows.values()), lake_table.schema)
    print(f"Delta table: {len(lake_rows)} rows        source table: {len(source.rows)} rows")
    left = lake_table.orderBy("order_id").limit(8).collect()
    right = source_table.orderBy("order_id").limit(8).collect()
    print(f"{'Delta (lake)':<44}| source")
    for a, b in zip(left, right, strict=False):
        fmt = "{order_id:>6} {customer:<9} {amount:>9.2f} {status:<9}"
        print(f"{fmt.format(**a.asDict()):<44}| {fmt.format(**b.asDict())}")
    ok = lake_rows == source.rows
    print("RESULT:", "the Delta table equals the source table" if ok else "MISMATCH")
    spark.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
