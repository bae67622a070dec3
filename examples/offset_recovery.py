"""Offset recovery: a query killed mid-stream resumes exactly where it was, and a new query can start where an
old one stopped.

1. A change log of orders (2 channels) holds 20,000 changes. A streaming query (its own process) copies every
   change into a Parquet table (Spark's file sink) in batches of 4,000.
2. After a few batches the query's process is killed with SIGKILL, in the middle of its work. Meanwhile the
   log keeps growing and one channel is split into two children.
3. The query is restarted with the same checkpoint, here in this process (only the kill needs a process of
   its own; a driver restarted elsewhere does the same): Spark replays the batch it had planned from the
   offsets in its own offset log (``cdc offsets`` shows them), then reads the rest. Every change is in the
   table exactly once: no loss, no duplicate, no side table.
4. A *new* query (new checkpoint, new table) starts where the old one stopped, with the ``startingOffsets``
   that ``cdc offsets --starting-offsets`` derives from the old checkpoint. It reads only the changes
   appended after that point.

    python examples/offset_recovery.py [--dir offset-recovery-output]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # noqa: E402
from orders_demo import demo_session  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from cdc.backends.local import LocalLog  # noqa: E402
from cdc.checkpoint import CheckpointError, last_committed, read_batch, starting_offsets  # noqa: E402

SCHEMA = [("order_id", pa.int64()), ("amount", pa.float64())]
BATCH = 4_000


def append_orders(log: LocalLog, first: int, n: int) -> None:
    log.append([{"order_id": i, "amount": float(i % 500), "_op": "insert"} for i in range(first, first + n)])


def run_query(spark: SparkSession, log_path: str, out: str, checkpoint: str, starting: str, drain: bool) -> None:
    """The streaming job: copy every change into a Parquet table; ``drain`` stops once caught up."""
    changes = (spark.readStream.format("cdc").option("backend", "local").option("path", log_path)
               .option("startingOffsets", starting).option("maxRecordsPerTrigger", BATCH).load())
    writer = changes.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    if drain:
        query = writer.trigger(availableNow=True).start()
    else:  # runs until it is killed
        query = writer.trigger(processingTime="200 milliseconds").start()
    query.awaitTermination()
    query.stop()


def start_child(*args: str, log_file: Path | None = None) -> subprocess.Popen[bytes]:
    """The query in its own process; with ``log_file``, its Spark log goes there instead of the terminal."""
    stderr = None if log_file is None else log_file.open("wb")
    try:
        return subprocess.Popen([sys.executable, __file__, "--child", *args], env={**os.environ}, stderr=stderr)
    finally:
        if stderr is not None:
            stderr.close()  # the child holds its own copy


def committed_batches(checkpoint: Path) -> int:
    try:
        return last_committed(checkpoint).batch_id + 1
    except CheckpointError:  # no batch committed yet
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="offset-recovery-output", help="where the log, tables and checkpoints go")
    ap.add_argument("--child", nargs=5, metavar=("LOG", "OUT", "CHECKPOINT", "STARTING", "DRAIN"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        log_path, out, ck, starting, drain = args.child
        run_query(demo_session("cdc-offset-recovery"), log_path, out, ck, starting, drain == "drain")
        return

    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = LocalLog.create(root / "log", SCHEMA, keys=["order_id"], channels=2)
    append_orders(log, 0, 20_000)
    table, ck = root / "table", root / "checkpoint"

    print(f"1. {log.path}: 20000 changes on channels {log.open_channels()}; starting the query")
    # The killed run's Spark log holds stack traces that are expected (the JVM, losing its driver mid-batch,
    # aborts the batch it was writing: "FileFormatWriter: Aborting job ... NullPointerException"); they would
    # look like a failure here, so they go to a file.
    killed_log = root / "killed-query.log"
    child = start_child(str(log.path), str(table), str(ck), "earliest", "run", log_file=killed_log)
    deadline = time.monotonic() + 600
    while committed_batches(ck) < 2:
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()  # never left running: it would stream on, holding this program's output open
            raise SystemExit(f"the query stopped early or took too long (exit {child.poll()})")
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"2. killed the query (SIGKILL) after {committed_batches(ck)} committed batches; its Spark log is in "
          f"{killed_log} (stack traces there are expected: Spark aborting the batch it was writing when killed)")

    kids = log.split(log.open_channels()[0])
    append_orders(log, 20_000, 5_000)
    print(f"   meanwhile: split a channel into {kids}, appended 5000 more changes")
    last = read_batch(ck)
    print(f"   its checkpoint: last batch {last.batch_id} {'committed' if last.committed else 'planned, not committed'};"
          f" `cdc offsets {ck}` shows each channel's position")

    print("3. restarting the query with the same checkpoint (drain everything available)")
    spark = demo_session("cdc-offset-recovery")
    run_query(spark, str(log.path), str(table), str(ck), "earliest", drain=True)

    resume = starting_offsets(last_committed(ck).source())
    append_orders(log, 25_000, 3_000)
    print(f"4. appended 3000 changes; a new query starts from the old checkpoint's offsets: {json.dumps(resume)}")
    table2, ck2 = root / "table-new", root / "checkpoint-new"
    run_query(spark, str(log.path), str(table2), str(ck2), json.dumps(resume), drain=True)

    from pyspark.sql import functions as F

    def summary(path: Path) -> tuple[int, int, int, int]:
        df = spark.read.parquet(str(path))  # reads through the file sink's log: committed files only
        row = df.agg(F.count("*").alias("n"), F.countDistinct("_channel", "_position").alias("d"),
                     F.min("order_id").alias("lo"), F.max("order_id").alias("hi")).first()
        return int(row["n"]), int(row["d"]), int(row["lo"]), int(row["hi"])

    n, distinct, lo, hi = summary(table)
    print(f"\nrecovered query: {n} rows, {distinct} distinct (channel, position), orders {lo}..{hi}")
    n2, distinct2, lo2, hi2 = summary(table2)
    print(f"new query:       {n2} rows, {distinct2} distinct (channel, position), orders {lo2}..{hi2}")
    spark.stop()
    ok = (n, distinct, lo, hi) == (25_000, 25_000, 0, 24_999) and (n2, distinct2, lo2, hi2) == (3_000, 3_000, 25_000, 27_999)
    print("RESULT:", "every change exactly once, and the new query started where the old one stopped" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
