"""Orders demo: order changes stream from a local change log into a lake, across a channel split.

1. Creates a local change log of orders (2 channels) and writes an initial burst of changes.
2. Starts a streaming query (``spark.readStream.format("cdc")``, ``maxRecordsPerTrigger``) that appends
   every change to a Parquet table; a writer thread keeps inserting, updating and deleting orders.
3. Splits a channel mid-run (its key range moves to two children), keeps writing, then stops the writer,
   lets the query drain and compares the lake with the source: every change exactly once, and the orders
   table rebuilt from the changes equals the source's own state.

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
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession, Window  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import cdc  # noqa: E402
from cdc.backends.local import LocalLog  # noqa: E402

SCHEMA = [("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("status", pa.string())]


class OrderSource:
    """A pretend OLTP orders table whose every change goes to the change log."""

    def __init__(self, log: LocalLog, seed: int = 7) -> None:
        self.log, self.rng, self.rows, self.next_id = log, random.Random(seed), {}, 1
        self.changes = 0

    def burst(self, n: int) -> None:
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
        self.log.append(batch)
        self.changes += n


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
    source.burst(2000)
    print(f"change log at {log.path}: channels {log.open_channels()}, {source.changes} changes written")

    spark = (SparkSession.builder.master("local[2]").appName("cdc-orders-demo")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)

    lake, ck = root / "lake" / "order_changes", root / "checkpoint"
    changes = (spark.readStream.format("cdc").option("backend", "local").option("path", str(log.path))
               .option("maxRecordsPerTrigger", 1500).load())
    query = (changes.writeStream.format("parquet").option("path", str(lake))
             .option("checkpointLocation", str(ck)).trigger(processingTime="1 second").start())

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
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        query.processAllAvailable()
        if spark.read.parquet(str(lake)).count() >= source.changes:
            break
    query.stop()

    arrived = spark.read.parquet(str(lake))
    total = arrived.count()
    distinct = arrived.select("_channel", "_position").distinct().count()
    print(f"\nchanges written: {source.changes}   arrived: {total}   distinct: {distinct}   "
          f"batches: {len(list((ck / 'commits').iterdir()))}")
    print("changes per channel:")
    arrived.groupBy("_channel").agg(F.count("*").alias("changes"), F.min("_seq").alias("first_seq"),
                                    F.max("_seq").alias("last_seq")).orderBy("_channel").show()

    latest = Window.partitionBy("order_id").orderBy(F.col("_seq").desc())
    table = (arrived.withColumn("rn", F.row_number().over(latest)).where("rn = 1 and _op != 'delete'")
             .select("order_id", "customer", "amount", "status"))
    lake_rows = {r["order_id"]: r.asDict() for r in table.collect()}
    print(f"orders table rebuilt from the lake: {len(lake_rows)} rows; source table: {len(source.rows)} rows")
    table.orderBy("order_id").show(5)
    ok = total == distinct == source.changes and lake_rows == source.rows
    print("RESULT:", "exactly once, and the lake equals the source" if ok else "MISMATCH")
    spark.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
