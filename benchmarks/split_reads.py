"""``minPartitions``: one channel's backlog read by 2 Spark tasks instead of 1, on a 2-core ``local[2]`` Spark.

A change log with **one** channel holding 2M records (the 6 table columns of source_overhead.py plus the change
model's 5) is read by ``spark.read.format("cdc")`` into Spark's ``noop`` sink, without ``minPartitions`` (one
task reads the channel's range) and with ``minPartitions=2`` (the range is cut at a segment boundary and two
tasks read the halves). Each round runs both reads back to back, in alternating order; a round's ratio is
(1-task seconds) / (2-task seconds), and the figures printed are medians over the rounds (rates swing
between rounds on a shared machine; a paired round compares like with like). Every read's rows are counted
by Spark's own scan metric of the same run (read from its UI's REST API after the read, so the count adds no
work to the measured read): a partial read voids the figures.

With ``--pulsar`` (the default) the same is measured on Apache Pulsar standalone (``make pulsar-standalone``):
one non-partitioned topic with the same number of ~200-byte messages, produced in batches, read with
``admin.url`` (a range is cut before a ledger entry the admin API lists).

Last line: ``ratio <local log: median of the rounds' 1-task / 2-task seconds>`` (target >= 1.5).

    python benchmarks/split_reads.py                 # 2M records, 5 rounds, local log and Pulsar
    python benchmarks/split_reads.py --quick         # 300k records, 3 rounds
    python benchmarks/split_reads.py --no-pulsar
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
from record import append_record

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

TOPIC = "persistent://public/default/split-reads"


def _executions(spark: Any) -> list[dict[str, Any]]:
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/sql?details=true"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def rows_scanned(spark: Any, after: int) -> int:
    """The rows the scan of ``format("cdc")`` output in the first SQL execution after id ``after``, from Spark's
    own metrics (its UI's REST API): a count that adds no work to the measured read (an ``observe()`` would
    aggregate every row). The UI learns of an execution's end a moment after it: wait for it (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        for execution in sorted(_executions(spark), key=lambda e: e["id"]):
            if execution["id"] <= after or execution.get("status") != "COMPLETED":
                continue
            for node in execution["nodes"]:
                if node["nodeName"].startswith("BatchScan"):
                    for metric in node["metrics"]:
                        if metric["name"] == "number of output rows":
                            return int(metric["value"].replace(",", ""))
        if time.monotonic() > deadline:
            raise SystemExit(f"no scan row count in Spark's metrics after execution {after}: the figures are void")
        time.sleep(0.1)


def timed_read(spark: Any, options: Mapping[str, str], expected: int) -> float:
    """Seconds of one batch read into ``noop``, its rows counted on the same run (Spark's scan metric)."""
    reader = spark.read.format("cdc")
    for k, v in options.items():
        reader = reader.option(k, v)
    after = max((e["id"] for e in _executions(spark)), default=-1)
    start = time.perf_counter()
    reader.load().write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - start
    got = rows_scanned(spark, after)
    if got != expected:
        raise SystemExit(f"a read with {dict(options)} gave {got} rows, not {expected}: the figures are void")
    return elapsed


def paired_rounds(read: Callable[[int | None], float], rounds: int) -> tuple[float, float, float]:
    """(median 1-task seconds, median 2-task seconds, median of the rounds' ratios): each round reads both ways,
    the first of the two alternating between rounds."""
    one: list[float] = []
    two: list[float] = []
    for r in range(rounds):
        for parts in ((None, 2) if r % 2 == 0 else (2, None)):
            (one if parts is None else two).append(read(parts))
    ratios = [a / b for a, b in zip(one, two, strict=True)]
    return statistics.median(one), statistics.median(two), statistics.median(ratios)


def report(name: str, n: int, rounds: int, result: tuple[float, float, float], figures: dict[str, Any]) -> None:
    t1, t2, ratio = result
    print(f"{name}, 1 task:  {n / t1:>12,.0f} records/s ({t1:.2f} s, median of {rounds} rounds)")
    print(f"{name}, 2 tasks: {n / t2:>12,.0f} records/s ({t2:.2f} s, median of {rounds} rounds)")
    print(f"{name}, 2 tasks / 1 task: {ratio:.3f} (median of {rounds} paired rounds)")
    figures[f"{name}, 1 task"] = (n / t1, "records/s")
    figures[f"{name}, 2 tasks"] = (n / t2, "records/s")
    figures[f"{name}, 2 tasks / 1 task"] = (ratio, "x")


def local_log(spark: Any, work: Path, n: int, rounds: int) -> tuple[float, float, float]:
    from source_overhead import SCHEMA, make_rows

    from cdc.backends.local import LocalLog

    log = LocalLog.create(work / "log", SCHEMA, ["order_id"], channels=1)
    start = time.perf_counter()
    log.append(make_rows(n))
    segments = len(log.channel("c0").segments)
    print(f"wrote {n:,} changes to one channel of the local log ({segments} segments) in {time.perf_counter() - start:.1f} s")
    base = {"backend": "local", "path": str(log.path)}
    read = lambda parts: timed_read(spark, base if parts is None else {**base, "minPartitions": str(parts)}, n)  # noqa: E731
    read(None), read(2)  # warm-up: JIT, Python workers, page cache
    return paired_rounds(read, rounds)


def pulsar(spark: Any, n: int, rounds: int, size: int = 200) -> tuple[float, float, float]:
    import pulsar as client_lib

    from cdc.servers.pulsar import ApachePulsar

    with ApachePulsar(heap="512m") as broker:
        print(f"Apache Pulsar standalone ready in {broker.last_start_s:.1f} s")
        client = client_lib.Client(broker.url, logger=client_lib.ConsoleLogger(client_lib.LoggerLevel.Error))
        producer = client.create_producer(
            TOPIC, batching_enabled=True, batching_max_messages=1000, batching_max_publish_delay_ms=5,
            block_if_queue_full=True, max_pending_messages=20_000,
        )
        body = b"x" * (size - 12)
        start = time.perf_counter()
        for i in range(n):
            producer.send_async(b"%012d" % i + body, None, partition_key=f"k{i % 64}")
        producer.flush()
        producer.close()
        client.close()
        print(f"produced {n:,} x {size} B to one topic in {time.perf_counter() - start:.1f} s")
        base = {"backend": "pulsar", "service.url": broker.url, "topic": TOPIC, "admin.url": broker.admin_url}
        read = lambda parts: timed_read(spark, base if parts is None else {**base, "minPartitions": str(parts)}, n)  # noqa: E731
        read(None), read(2)
        return paired_rounds(read, rounds)


@click.command()
@click.option("--records", type=int, default=2_000_000, show_default=True, help="Records in the channel.")
@click.option("--rounds", type=int, default=5, show_default=True, help="Paired rounds (both reads each).")
@click.option("--quick", is_flag=True, help="300k records, 3 rounds.")
@click.option("--pulsar/--no-pulsar", "with_pulsar", default=True, show_default=True,
              help="Measure Apache Pulsar standalone too.")
def main(records: int, rounds: int, quick: bool, with_pulsar: bool) -> None:
    from pyspark.sql import SparkSession

    import cdc
    from cdc.servers.ports import free_port

    if quick:
        records, rounds = 300_000, 3
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-split-"))
    figures: dict[str, Any] = {}
    try:
        spark = (SparkSession.builder.master("local[2]").appName("split-reads-benchmark")
                 .config("spark.ui.port", str(free_port())).config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        local = local_log(spark, work, records, rounds)
        report("local log", records, rounds, local, figures)
        if with_pulsar:
            report("pulsar", records, rounds, pulsar(spark, records, rounds), figures)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    append_record("split_reads", figures, ratio=local[2], target=">= 1.5",
                  params={"records": records, "rounds": rounds, "pulsar": with_pulsar})
    print(f"ratio {local[2]:.3f}")


if __name__ == "__main__":
    main()
