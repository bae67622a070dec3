"""How much does the cdc source cost over Spark's own Parquet reader?

The same rows (2M by default, 6 table columns plus the change model's 5) are read
(a) through ``spark.readStream.format("cdc")`` from a local change log (Trigger.AvailableNow, one batch)
    into Spark's ``noop`` sink, and
(b) through ``spark.read.parquet`` of the same rows into ``noop``,
alternately, best of ``--repeat`` runs each after a warm-up. A bounded ``spark.read.format("cdc")`` read is
reported too. The last line is ``ratio <cdc rate / parquet rate>`` for the like-for-like bounded reads
(``spark.read.format("cdc")`` vs ``spark.read.parquet``, target >= 0.8). The streaming figure includes
Spark's fixed cost of starting a streaming query (offset and commit logs, the driver-side Python planner
process: about 2 s here), which no per-row work of the source can remove; it is printed separately.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from record import append_record  # noqa: E402

import cdc  # noqa: E402
from cdc.backends.local import LocalLog  # noqa: E402

SCHEMA = [
    ("order_id", pa.int64()),
    ("customer", pa.string()),
    ("amount", pa.float64()),
    ("status", pa.string()),
    ("qty", pa.int32()),
    ("placed_at", pa.timestamp("us", tz="UTC")),
]


def make_rows(n: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    base = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6)
    return pa.table(
        {
            "order_id": pa.array(np.arange(n, dtype=np.int64)),
            "customer": pa.array([f"cust-{i}" for i in rng.integers(0, 50_000, n)]),
            "amount": pa.array(rng.uniform(1, 1000, n)),
            "status": pa.array(np.array(["new", "paid", "shipped", "returned"])[rng.integers(0, 4, n)]),
            "qty": pa.array(rng.integers(1, 20, n).astype(np.int32)),
            "placed_at": pa.array(base + rng.integers(0, 10**12, n), pa.timestamp("us", tz="UTC")),
            "_op": pa.array(["insert"] * n),
        }
    )


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="300k rows, 2 repeats (under a minute)")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.repeat = 300_000, 2
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    try:
        log = LocalLog.create(work / "log", SCHEMA, ["order_id"], channels=2)
        rows = make_rows(args.rows)
        t = timed(lambda: log.append(rows))
        print(f"wrote {args.rows:,} changes to the local log in {t:.1f} s ({args.rows / t:,.0f}/s)")
        # The Parquet reference holds exactly the rows the source yields (metadata columns included),
        # in as many files as the log has channels.
        full = log.read_all()
        pq_dir = work / "parquet"
        pq_dir.mkdir()
        half = full.num_rows // 2
        pq.write_table(full.slice(0, half), pq_dir / "part-0.parquet")
        pq.write_table(full.slice(half), pq_dir / "part-1.parquet")

        spark = (
            SparkSession.builder.master("local[2]").appName("cdc-bench")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2").getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)

        def cdc_stream() -> None:
            ck = work / f"ck-{time.monotonic_ns()}"
            q = (spark.readStream.format("cdc").option("backend", "local").option("path", str(log.path)).load()
                 .writeStream.format("noop").option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            assert q.lastProgress["numInputRows"] == args.rows, q.lastProgress

        def cdc_batch() -> None:
            spark.read.format("cdc").option("backend", "local").option("path", str(log.path)).load().write.format("noop").mode("overwrite").save()

        def parquet() -> None:
            spark.read.parquet(str(pq_dir)).write.format("noop").mode("overwrite").save()

        for fn in (cdc_stream, cdc_batch, parquet):  # warm-up: JVM JIT, Python workers
            fn()
        best = {"cdc stream": float("inf"), "cdc batch": float("inf"), "parquet": float("inf")}
        for _ in range(args.repeat):
            best["cdc stream"] = min(best["cdc stream"], timed(cdc_stream))
            best["cdc batch"] = min(best["cdc batch"], timed(cdc_batch))
            best["parquet"] = min(best["parquet"], timed(parquet))
        for name, secs in best.items():
            print(f"{name:>11}: {args.rows / secs:>12,.0f} rows/s  ({secs:.2f} s, best of {args.repeat})")
        print(f"cdc stream / parquet (includes the streaming query's fixed start cost): "
              f"{best['parquet'] / best['cdc stream']:.2f}")
        spark.stop()
        ratio = best["parquet"] / best["cdc batch"]
        append_record(
            "source_overhead",
            {name: (args.rows / secs, "rows/s") for name, secs in best.items()},
            ratio=ratio, target=">= 0.8", params={"rows": args.rows, "repeat": args.repeat},
        )
        print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"ratio {ratio:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
