"""Pulsar source throughput: the cdc source into Spark's ``noop`` sink vs a plain pulsar-client Reader loop.

Both read the same topic (2 partitions, ~200-byte messages) from an embedded pulsar-lite broker in one run.
The cdc figure includes planning (the driver reads message ids, see cdc.backends.pulsar.client) and Spark's
job overhead; Spark's session start and a warm-up job are excluded. Last line: ``ratio <cdc/reader>``.

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


def reader_loop(url: str, topic: str, n: int) -> tuple[float, int]:
    """The reference: one Reader on the partitioned topic from earliest, touching each payload."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=50_000)
    seen: set[tuple[int, int, int, int]] = set()
    nbytes = 0
    start = time.perf_counter()
    while len(seen) < n:
        msg = reader.read_next(30_000)
        mid = msg.message_id()
        key = (mid.partition(), mid.ledger_id(), mid.entry_id(), mid.batch_index())
        if key not in seen:  # pulsar-lite may redeliver; count each message once
            seen.add(key)
            nbytes += len(msg.data())
    elapsed = time.perf_counter() - start
    reader.close()
    client.close()
    return elapsed, nbytes


def cdc_noop(spark: object, url: str, topic: str, n: int) -> float:
    start = time.perf_counter()
    df = (
        spark.read.format("cdc")  # type: ignore[attr-defined]
        .option("backend", "pulsar")
        .option("service.url", url)
        .option("topic", topic)
        .option("catchUpMs", "100")
        .load()
    )
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


@click.command()
@click.option("--quick", is_flag=True, help="100k messages instead of 1M.")
@click.option("--messages", type=int, default=None)
@click.option("--size", type=int, default=200, show_default=True)
def main(quick: bool, messages: int | None, size: int) -> None:
    import cdc
    from cdc.backends.pulsar import EmbeddedBroker
    from tests.conftest import spark_builder

    n = messages or (100_000 if quick else 1_000_000)
    with EmbeddedBroker(partitions=2) as broker:
        t = produce(broker.url, TOPIC, n, size)
        print(f"produced {n} x {size} B in {t:.1f} s ({n / t:,.0f} msg/s)")
        produce(broker.url, TOPIC + "-warmup", 1000, size)

        spark = spark_builder("pulsar-source-benchmark").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        cdc_noop(spark, broker.url, TOPIC + "-warmup", 1000)  # JVM, Python workers, imports

        t_reader, nbytes = reader_loop(broker.url, TOPIC, n)
        print(f"reader loop: {n} messages ({nbytes / 1e6:.0f} MB) in {t_reader:.2f} s ({n / t_reader:,.0f} msg/s)")
        t_cdc = cdc_noop(spark, broker.url, TOPIC, n)
        print(f"cdc source -> noop: {n} messages in {t_cdc:.2f} s ({n / t_cdc:,.0f} msg/s)")
        spark.stop()
    print(f"ratio {t_reader / t_cdc:.3f}")


if __name__ == "__main__":
    main()
