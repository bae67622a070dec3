"""Pulsar source throughput on Apache Pulsar standalone: the cdc source into Spark's ``noop`` sink vs a plain
pulsar-client Reader loop.

The benchmark starts its own Apache Pulsar standalone (``make pulsar-standalone`` resolves it), creates a topic
with 2 partitions and produces ~200-byte messages. The reference reads both partitions concurrently (one
process per partition, like Spark's two local Python workers), one Reader per partition topic, and builds the
same Arrow columns the source returns (value, key, topic, message id, publish and event time, properties).
The source runs with default options (``reader.topic=auto`` picks per-partition readers and asks the broker
for heads). The cdc figure includes planning and Spark's job overhead; Spark's session start and a warm-up
job are excluded. Also printed: produce rate, and the source's rate as a stream with a
``maxRecordsPerTrigger`` budget (the driver then reads the ids each budget needs, from the batch's start on
each partition topic). Last line:
``ratio <reader seconds / cdc seconds>``.

    python benchmarks/pulsar_source.py            # 1M messages
    python benchmarks/pulsar_source.py --quick    # 100k messages
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time

import click
from record import append_record

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

TOPIC = "persistent://public/default/bench"
RECEIVER_QUEUE = 1000  # pulsar-client's default, and the cdc source's receiverQueueSize
BUDGET = 100_000  # maxRecordsPerTrigger of the streaming figure
PARTITIONS = 2


def produce(url: str, topic: str, n: int, size: int) -> float:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=5,
        block_if_queue_full=True,
        max_pending_messages=20_000,
    )
    body = b"x" * (size - 12)
    start = time.perf_counter()
    for i in range(n):
        producer.send_async(b"%012d" % i + body, None, partition_key=f"k{i % 64}")
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    client.close()
    return elapsed


def read_partition(url: str, topic: str, last: tuple[int, int, int]) -> tuple[int, int]:
    """One partition topic from earliest to its last message (id ``last``), building the source's columns
    per 8192 messages; returns (messages, payload bytes). Runs in a process of its own."""
    import pulsar
    import pyarrow as pa

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE)
    count = nbytes = 0
    msgs = []
    done = False
    while not done:
        msg = reader.read_next(30_000)
        mid = msg.message_id()
        done = (mid.ledger_id(), mid.entry_id(), mid.batch_index()) >= last
        msgs.append(msg)
        count += 1
        if len(msgs) == 8192 or done:
            values = pa.array([m.data() for m in msgs], type=pa.binary())
            nbytes += values.nbytes
            pa.RecordBatch.from_arrays(
                [
                    values,
                    pa.array([m.partition_key() or None for m in msgs], type=pa.string()),
                    pa.repeat(pa.scalar(topic), len(msgs)),
                    pa.array([m.message_id().serialize() for m in msgs], type=pa.binary()),
                    pa.array([m.publish_timestamp() * 1000 for m in msgs], type=pa.timestamp("us", "UTC")),
                    pa.array([m.event_timestamp() * 1000 or None for m in msgs], type=pa.timestamp("us", "UTC")),
                    pa.array([list(m.properties().items()) for m in msgs], type=pa.map_(pa.string(), pa.string())),
                ],
                names=["value", "__key", "__topic", "__messageId", "__publishTime", "__eventTime", "__properties"],
            )
            msgs = []
    reader.close()
    client.close()
    return count, nbytes


def last_ids(admin_url: str, topic: str) -> list[tuple[int, int, int]]:
    """Each partition's last message id (admin ``lastMessageId``), so that each reference reader knows where
    to stop."""
    import json
    import urllib.request

    rest = topic.split("://", 1)[1]
    out = []
    for p in range(PARTITIONS):
        with urllib.request.urlopen(f"{admin_url}/admin/v2/persistent/{rest}-partition-{p}/lastMessageId") as r:
            answer = json.loads(r.read())
        out.append((int(answer["ledgerId"]), int(answer["entryId"]), int(answer.get("batchIndex", -1))))
    return out


def reader_loop(pool: object, url: str, admin_url: str, topic: str) -> tuple[float, int, int]:
    """The reference: both partitions read concurrently, one process each. Returns (seconds, messages, bytes)."""
    lasts = last_ids(admin_url, topic)
    start = time.perf_counter()
    results = pool.starmap(  # type: ignore[attr-defined]
        read_partition, [(url, f"{topic}-partition-{p}", lasts[p]) for p in range(PARTITIONS)]
    )
    return time.perf_counter() - start, sum(r[0] for r in results), sum(r[1] for r in results)


def cdc_parts(url: str, topic: str) -> tuple[float, float, int]:
    """Breakdown without Spark: driver planning, then reading every range here, one after another."""
    from cdc.backend import open_backend
    from cdc.planner import Planner

    backend = open_backend(
        "pulsar", {"service.url": url, "topic": topic}
    )
    start = time.perf_counter()
    planner = Planner(backend)
    first = planner.initial("earliest")
    end = planner.next(first, None, planner.until("latest"), respect_lineage=False)
    t_plan = time.perf_counter() - start
    start = time.perf_counter()
    reader = backend.reader()
    rows = sum(b.num_rows for r in planner.ranges(first, end) for b in reader.read(r.channel, r.start, r.end))
    backend.close()
    return t_plan, time.perf_counter() - start, rows


def cdc_frame(spark: object, url: str, topic: str) -> object:
    return (
        spark.read.format("cdc")  # type: ignore[attr-defined]
        .option("backend", "pulsar")
        .option("service.url", url)
        .option("topic", topic)
        .load()
    )


def cdc_noop(spark: object, url: str, topic: str) -> tuple[float, int]:
    """Seconds and rows of one cdc read into ``noop``; the rows are counted by an Observation on the same
    run (a cheap JVM-side count), so the figure cannot come from a partial read."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observed = Observation("rows")
    start = time.perf_counter()
    df = cdc_frame(spark, url, topic).observe(observed, F.count(F.lit(1)).alias("n"))  # type: ignore[attr-defined]
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - start
    return elapsed, int(observed.get["n"])


def cdc_stream_budget(spark: object, url: str, topic: str, n: int) -> tuple[float, int]:
    """Seconds and micro-batches of a stream (``Trigger.AvailableNow``) over the topic with
    ``maxRecordsPerTrigger``; checks that every message was read."""
    with tempfile.TemporaryDirectory() as ck:
        df = (
            spark.readStream.format("cdc")  # type: ignore[attr-defined]
            .option("backend", "pulsar").option("service.url", url).option("topic", topic)
            .option("maxRecordsPerTrigger", str(BUDGET)).load()
        )
        start = time.perf_counter()
        query = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        batches = len([p for p in query.recentProgress if p["numInputRows"]])
    if rows != n:
        raise SystemExit(f"the budgeted stream read {rows} rows, not {n}")
    return elapsed, batches


@click.command()
@click.option("--quick", is_flag=True, help="100k messages instead of 1M.")
@click.option("--messages", type=int, default=None)
@click.option("--size", type=int, default=200, show_default=True)
def main(quick: bool, messages: int | None, size: int) -> None:
    import cdc
    from cdc.servers.pulsar import ApachePulsar
    from tests.conftest import spark_builder

    n = messages or (100_000 if quick else 1_000_000)
    # The reference's processes start before any client exists here (pulsar-client is not fork-safe).
    pool = multiprocessing.get_context("spawn").Pool(PARTITIONS)
    pool.map(abs, range(PARTITIONS))  # started and imported
    with ApachePulsar(heap="512m") as broker:
        print(f"Apache Pulsar standalone ready in {broker.last_start_s:.1f} s")
        broker.create_partitioned_topic(TOPIC, PARTITIONS)
        broker.create_partitioned_topic(TOPIC + "-warmup", PARTITIONS)
        t = produce(broker.url, TOPIC, n, size)
        print(f"produced {n} x {size} B in {t:.1f} s ({n / t:,.0f} msg/s) to {PARTITIONS} partitions")
        produce(broker.url, TOPIC + "-warmup", 1000, size)

        spark = spark_builder("pulsar-source-benchmark").config("spark.ui.showConsoleProgress", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        cdc_noop(spark, broker.url, TOPIC + "-warmup")  # JVM, Python workers, imports
        reader_loop(pool, broker.url, broker.admin_url, TOPIC + "-warmup")

        t_reader, got, nbytes = reader_loop(pool, broker.url, broker.admin_url, TOPIC)
        print(f"reader loop (2 processes): {got} messages ({nbytes / 1e6:.0f} MB) in {t_reader:.2f} s "
              f"({got / t_reader:,.0f} msg/s)")
        t_plan, t_read, rows = cdc_parts(broker.url, TOPIC)
        print(f"breakdown without Spark: planning {t_plan:.2f} s, reading {rows} rows one range after another "
              f"{t_read:.2f} s")
        t_cdc, counted = cdc_noop(spark, broker.url, TOPIC)
        print(f"cdc source -> noop (default options): {counted} messages in {t_cdc:.2f} s ({counted / t_cdc:,.0f} msg/s)")
        if counted != n or got != n:
            raise SystemExit(f"the cdc source read {counted} rows and the reference {got}, not {n}: the figures are void")
        t_budget, batches = cdc_stream_budget(spark, broker.url, TOPIC, n)
        print(f"cdc stream with maxRecordsPerTrigger={BUDGET}: {n} messages in {batches} batches, {t_budget:.2f} s "
              f"({n / t_budget:,.0f} msg/s)")
        spark.stop()
    pool.close()
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    append_record("pulsar_source", {"pulsar-client Reader (reference)": (n / t_reader, "msg/s"), "cdc source -> noop": (n / t_cdc, "msg/s")}, ratio=t_reader / t_cdc, params={"messages": n})
    print(f"ratio {t_reader / t_cdc:.3f}")


if __name__ == "__main__":
    main()
