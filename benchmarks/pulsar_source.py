"""Pulsar source throughput: the cdc source into Spark's ``noop`` sink vs a plain pulsar-client Reader loop.

Both read the same topic (2 partitions, ~200-byte messages) from an embedded pulsar-lite broker in one run.
The cdc figure includes planning and Spark's job overhead; Spark's session start and a warm-up job are
excluded. Last line: ``ratio <cdc/reader>``.

The broker is set up like an Apache Pulsar cluster: auto-created topics are not partitioned and the
partitioned topic is created explicitly (pulsar-lite has no admin API: ``create_partitioned_topic``
restarts it). It then serves each partition as a topic of its own, and the source reads with
``reader.topic=partition``: one Reader per partition on the executors, and planning asks each partition's
last message id instead of reading every id (``--reader-topic parent`` measures the other mode: the driver
reads every message id, each executor reads the partitioned topic).

    python benchmarks/pulsar_source.py            # 1M messages
    python benchmarks/pulsar_source.py --quick    # 100k messages, under a minute
"""

from __future__ import annotations

import os
import sys
import time

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

TOPIC = "persistent://public/default/bench"
RECEIVER_QUEUE = 20_000  # the cdc source's default receiverQueueSize
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


def reader_loop(url: str, topic: str, n: int) -> tuple[float, int, int]:
    """The reference: a Reader on the partitioned topic from earliest, touching each payload.

    Hardened the way pulsar-lite needs (see docs/notes), as well as a hand-written loop would be: a message
    whose id is not above the last one of its partition is a redelivery and skipped, and when the broker
    stalls the reader (0.5 s of silence before all ``n`` messages came) it is replaced by one Reader per
    partition, each starting at the entry of that partition's last message (a Reader on the parent topic
    started at one partition's id is served that partition only), read in turn. It uses the same receiver
    queue as the cdc source's default (``RECEIVER_QUEUE``; with pulsar-client's default of 1000 pulsar-lite
    redelivers heavily and both sides would be slower). Returns (seconds, payload bytes, reopen count).
    """
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    last: dict[int, tuple[int, int, int]] = {}
    count = nbytes = reopens = 0
    start = time.perf_counter()
    readers = [client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE)]
    current, silent_since = 0, None
    while count < n:
        try:
            msg = readers[current].read_next(0 if len(readers) > 1 else 100)
        except pulsar.Timeout:
            current = (current + 1) % len(readers)
            now = time.perf_counter()
            silent_since = silent_since or now
            if now - silent_since < 0.5:
                continue
            for r in readers:
                r.close()
            readers = [
                client.create_reader(
                    topic,
                    pulsar.MessageId(p, ledger, entry, -1),
                    receiver_queue_size=RECEIVER_QUEUE,
                    start_message_id_inclusive=True,
                )
                for p, (ledger, entry, _) in sorted(last.items())
            ]
            if len(last) < PARTITIONS:  # a partition with nothing read yet: from earliest
                readers.append(client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE))
            current, silent_since = 0, None
            reopens += 1
            continue
        silent_since = None
        mid = msg.message_id()
        key = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        if key > last.get(mid.partition(), (-1, -1, -1)):
            last[mid.partition()] = key
            count += 1
            nbytes += len(msg.data())
    elapsed = time.perf_counter() - start
    for r in readers:
        r.close()
    client.close()
    return elapsed, nbytes, reopens


def cdc_parts(url: str, topic: str, reader_topic: str) -> tuple[float, float, int]:
    """Breakdown without Spark: driver planning, then reading every range here, one after another."""
    from cdc.backend import open_backend
    from cdc.planner import Planner

    backend = open_backend(
        "pulsar", {"service.url": url, "topic": topic, "catchUpMs": "100", "reader.topic": reader_topic}
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


def cdc_frame(spark: object, url: str, topic: str, reader_topic: str) -> object:
    return (
        spark.read.format("cdc")  # type: ignore[attr-defined]
        .option("backend", "pulsar")
        .option("service.url", url)
        .option("topic", topic)
        .option("catchUpMs", "100")
        .option("reader.topic", reader_topic)
        .load()
    )


def cdc_noop(spark: object, url: str, topic: str, reader_topic: str) -> tuple[float, int]:
    """Seconds and rows of one cdc read into ``noop``; the rows are counted by an Observation on the same
    run (a cheap JVM-side count), so the figure cannot come from a partial read."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observed = Observation("rows")
    start = time.perf_counter()
    df = cdc_frame(spark, url, topic, reader_topic).observe(observed, F.count(F.lit(1)).alias("n"))  # type: ignore[attr-defined]
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - start
    return elapsed, int(observed.get["n"])


@click.command()
@click.option("--quick", is_flag=True, help="100k messages instead of 1M.")
@click.option("--messages", type=int, default=None)
@click.option("--size", type=int, default=200, show_default=True)
@click.option(
    "--reader-topic",
    type=click.Choice(["partition", "parent"]),
    default="partition",
    show_default=True,
    help="The source's reader.topic; parent also makes the broker auto-create partitioned topics.",
)
def main(quick: bool, messages: int | None, size: int, reader_topic: str) -> None:
    import cdc
    from cdc.servers.pulsar import EmbeddedBroker
    from tests.conftest import spark_builder

    n = messages or (100_000 if quick else 1_000_000)
    by_partition = reader_topic == "partition"
    with EmbeddedBroker(partitions=0 if by_partition else PARTITIONS) as broker:
        if by_partition:
            broker.create_partitioned_topic(TOPIC, PARTITIONS)
        t = produce(broker.url, TOPIC, n, size)
        print(f"produced {n} x {size} B in {t:.1f} s ({n / t:,.0f} msg/s) to {PARTITIONS} partitions")
        produce(broker.url, TOPIC + "-warmup", 1000, size)

        spark = spark_builder("pulsar-source-benchmark").config("spark.ui.showConsoleProgress", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        cdc_noop(spark, broker.url, TOPIC + "-warmup", reader_topic)  # JVM, Python workers, imports

        t_reader, nbytes, reopens = reader_loop(broker.url, TOPIC, n)
        print(
            f"reader loop: {n} messages ({nbytes / 1e6:.0f} MB) in {t_reader:.2f} s ({n / t_reader:,.0f} msg/s, "
            f"{reopens} reopens after broker stalls)"
        )
        t_plan, t_read, rows = cdc_parts(broker.url, TOPIC, reader_topic)
        print(
            f"breakdown without Spark (reader.topic={reader_topic}): planning {t_plan:.2f} s, reading {rows} rows "
            f"one range after another {t_read:.2f} s"
        )
        if rows != n:
            print(f"WARNING: the breakdown's plan held {rows} of {n} messages (a broker stall cut planning short)")
        t_cdc, counted = cdc_noop(spark, broker.url, TOPIC, reader_topic)
        print(f"cdc source -> noop: {counted} messages in {t_cdc:.2f} s ({counted / t_cdc:,.0f} msg/s)")
        if counted != n:
            raise SystemExit(f"the cdc source read {counted} rows, not {n}: the figures above are void")
        spark.stop()
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    print(f"ratio {t_reader / t_cdc:.3f}")


if __name__ == "__main__":
    main()
