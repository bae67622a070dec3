"""Kafka source throughput on Apache Kafka (KRaft): the cdc source into Spark's ``noop`` sink against a plain
confluent-kafka consumer and against Spark's own Kafka source, and Debezium over Kafka into Delta.

The benchmark starts its own Apache Kafka (``make kafka`` resolves it), creates a topic with 2 partitions and
produces ~200-byte records. Each round runs, back to back on the same topic:

* the reference: one plain confluent-kafka consumer per partition, each in a process of its own (like Spark's
  two local Python workers), assigned its partition from the start and reading to its end, building the same
  Arrow columns the source returns (key, value, topic, partition, offset, timestamp, timestampType);
* the cdc source (``spark.read.format("cdc")``, default options) into ``noop``; rows counted by an Observation;
* Spark's own ``spark.read.format("kafka")`` (JVM consumer, the ``spark-sql-kafka-0-10`` jar) into ``noop``.

Spark's session start and a warm-up job are excluded; the cdc and Spark figures include planning and Spark's
job overhead. Figures are medians of the rounds' ratios (each round pairs the runs, on a machine whose speed
swings between rounds). Then Debezium change events (JSON envelopes as Debezium's JSON converter writes them,
PostgreSQL-shaped: inserts, updates and deletes over a key range) go through ``backend=kafka`` into a Delta
table with ``DeltaUpsertSink``, and with ``--pulsar`` the same events through ``backend=pulsar`` on Apache
Pulsar standalone, for changes per second side by side. Printed last:

    kafka/spark-kafka-source <Spark's seconds / ours>     (above 1: ours is faster)
    kafka/confluent-consumer <reference seconds / ours>   (target >= 0.8)
    ratio <the same>

    python benchmarks/kafka_source.py                  # 1M records, 3 rounds, 200k Debezium changes
    python benchmarks/kafka_source.py --quick          # 100k records, 1 round, 20k changes
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import click
from record import append_record

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

TOPIC = "bench"
PARTITIONS = 2
ROWS_PER_BATCH = 8192


def produce(bootstrap: str, topic: str, n: int, size: int) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 500_000, "compression.type": "none"})
    body = b"x" * (size - 12)
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=b"%012d" % i + body, key=b"k%d" % (i % 64))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return time.perf_counter() - start


def read_partition(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """One partition from its start to its end with a plain consumer, building the source's columns per 8192
    records; returns (records, value bytes). Runs in a process of its own."""
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-reference", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    consumer.assign([TopicPartition(topic, partition, low)])
    count = nbytes = 0
    done = high <= low
    while not done:
        kept = []
        for m in consumer.consume(ROWS_PER_BATCH, 1.0):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    done = True
                    break
                raise RuntimeError(m.error().str())
            kept.append(m)
            if m.offset() + 1 >= high:
                done = True
                break
        if kept:
            times = [m.timestamp() for m in kept]
            values = [m.value() for m in kept]
            batch = pa.RecordBatch.from_arrays([
                pa.array([m.key() for m in kept], pa.binary()), pa.array(values, pa.binary()),
                pa.repeat(pa.scalar(topic, pa.string()), len(kept)), pa.repeat(pa.scalar(partition, pa.int32()), len(kept)),
                pa.array([m.offset() for m in kept], pa.int64()),
                pa.array([t[1] * 1000 for t in times], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array([max(t[0] - 1, 0) for t in times], pa.int32()),
            ], names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"])
            count += batch.num_rows
            nbytes += sum(len(v) for v in values)
    consumer.close()
    return count, nbytes


def reference(pool: Any, bootstrap: str, topic: str) -> tuple[float, int]:
    start = time.perf_counter()
    results = pool.starmap(read_partition, [(bootstrap, topic, p) for p in range(PARTITIONS)])
    return time.perf_counter() - start, sum(r[0] for r in results)


def to_noop(df: Any) -> tuple[float, int]:
    """Seconds and rows of one read into ``noop``, rows counted by an Observation on the same run."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observed = Observation("rows")
    start = time.perf_counter()
    df.observe(observed, F.count(F.lit(1)).alias("n")).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start, int(observed.get["n"])


def cdc_frame(spark: Any, bootstrap: str, topic: str) -> Any:
    return (spark.read.format("cdc").option("backend", "kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).load())


def spark_frame(spark: Any, bootstrap: str, topic: str) -> Any:
    return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())


# ---------------------------------------------------------------------- Debezium into Delta
ROW_SCHEMA = json.dumps({"type": "record", "name": "orders", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": ["null", "string"]},
    {"name": "amount", "type": ["null", "double"]}, {"name": "status", "type": ["null", "string"]}]})


def debezium_events(n: int, keys: int = 50_000) -> list[tuple[bytes, bytes]]:
    """(key, value) of ``n`` PostgreSQL-shaped envelopes (Debezium's JSON converter, schemas.enable=false):
    inserts of new keys, then updates and deletes of existing ones."""
    rng = random.Random(11)
    live: set[int] = set()
    out = []
    for i in range(n):
        ts = 1_700_000_000_000_000 + i
        source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg", "ts_ms": ts // 1000,
                  "ts_us": ts, "db": "shop", "schema": "public", "table": "orders", "txId": 1000 + i, "lsn": 10_000 + i}
        k = rng.randrange(keys)
        row = {"id": k, "customer": f"customer {k % 977}", "amount": round(rng.uniform(1, 500), 2),
               "status": rng.choice(["new", "paid", "shipped"])}
        if k not in live:
            op, before, after = "c", None, row
            live.add(k)
        elif rng.random() < 0.1:
            op, before, after = "d", {"id": k, "customer": None, "amount": None, "status": None}, None
            live.discard(k)
        else:
            op, before, after = "u", None, row
        value = {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts // 1000 + 3,
                 "transaction": None}
        out.append((json.dumps({"id": k}).encode(), json.dumps(value).encode()))
    return out


def into_delta(spark: Any, options: dict[str, str], n: int) -> float:
    """Seconds for a stream of ``n`` Debezium changes (Trigger.AvailableNow) into a new Delta table."""
    from sinks.delta import DeltaUpsertSink

    with tempfile.TemporaryDirectory() as work:
        reader = spark.readStream.format("cdc")
        for k, v in {**options, "valueFormat": "debezium", "valueSchema": ROW_SCHEMA, "changeKeys": "id",
                     "maxRecordsPerTrigger": "100000"}.items():
            reader = reader.option(k, v)
        start = time.perf_counter()
        q = (reader.load().writeStream.foreachBatch(DeltaUpsertSink(f"{work}/orders", keys=["id"]))
             .option("checkpointLocation", f"{work}/ck").trigger(availableNow=True).start())
        q.awaitTermination()
        elapsed = time.perf_counter() - start
        rows = sum(p["numInputRows"] for p in q.recentProgress)
    if rows != n:
        raise SystemExit(f"the Debezium stream read {rows} changes, not {n}")
    return elapsed


def pulsar_debezium(spark: Any, events: list[tuple[bytes, bytes]]) -> float:
    from cdc.servers.pulsar import ApachePulsar
    from tests.backends.pulsar.helpers import produce as pulsar_produce

    with ApachePulsar(heap="512m") as broker:
        topic = "persistent://public/default/dbz-bench"
        broker.create_partitioned_topic(topic, PARTITIONS)
        pulsar_produce(broker.url, topic, [v for _, v in events], [k.decode() for k, _ in events], batching=True)
        return into_delta(spark, {"backend": "pulsar", "service.url": broker.url, "topic": topic}, len(events))


@click.command()
@click.option("--quick", is_flag=True, help="100k records, 1 round, 20k Debezium changes.")
@click.option("--records", type=int, default=None, help="Records of ~--size bytes (default 1M).")
@click.option("--size", type=int, default=200, show_default=True)
@click.option("--rounds", type=int, default=None, help="Paired rounds (default 3).")
@click.option("--changes", type=int, default=None, help="Debezium changes into Delta (default 200k).")
@click.option("--pulsar/--no-pulsar", default=True, show_default=True,
              help="Also stream the Debezium changes through Apache Pulsar standalone into Delta.")
def main(quick: bool, records: int | None, size: int, rounds: int | None, changes: int | None, pulsar: bool) -> None:
    import cdc
    from cdc.servers.kafka import ApacheKafka
    from tests.backends.kafka.helpers import produce as kafka_produce
    from tests.conftest import spark_builder

    n = records or (100_000 if quick else 1_000_000)
    rounds = rounds or (1 if quick else 3)
    n_changes = changes or (20_000 if quick else 200_000)
    pool = multiprocessing.get_context("spawn").Pool(PARTITIONS)
    pool.map(abs, range(PARTITIONS))
    figures: dict[str, Any] = {}
    with ApacheKafka(heap="1g") as kafka:
        print(f"Apache Kafka ready in {kafka.last_start_s:.1f} s")
        kafka.create_topic(TOPIC, PARTITIONS)
        kafka.create_topic(TOPIC + "-warmup", PARTITIONS)
        t = produce(kafka.bootstrap, TOPIC, n, size)
        print(f"produced {n} x {size} B in {t:.1f} s ({n / t:,.0f} records/s) to {PARTITIONS} partitions")
        produce(kafka.bootstrap, TOPIC + "-warmup", 1000, size)
        spark = spark_builder("kafka-source-benchmark").config("spark.ui.showConsoleProgress", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        to_noop(cdc_frame(spark, kafka.bootstrap, TOPIC + "-warmup"))  # JVM, Python workers, imports
        to_noop(spark_frame(spark, kafka.bootstrap, TOPIC + "-warmup"))
        reference(pool, kafka.bootstrap, TOPIC + "-warmup")
        by_reference, by_spark = [], []
        for r in range(rounds):
            t_ref, got = reference(pool, kafka.bootstrap, TOPIC)
            t_cdc, counted = to_noop(cdc_frame(spark, kafka.bootstrap, TOPIC))
            t_spark, spark_counted = to_noop(spark_frame(spark, kafka.bootstrap, TOPIC))
            if {got, counted, spark_counted} != {n}:
                raise SystemExit(f"reads of {got}, {counted}, {spark_counted} records, not {n}: the figures are void")
            by_reference.append(t_ref / t_cdc)
            by_spark.append(t_spark / t_cdc)
            print(f"round {r + 1}: confluent consumer {n / t_ref:,.0f} records/s, cdc source {n / t_cdc:,.0f} records/s, "
                  f"Spark's Kafka source {n / t_spark:,.0f} records/s")
            figures |= {"confluent-consumer (reference)": (n / t_ref, "records/s"), "cdc source -> noop": (n / t_cdc, "records/s"),
                        "spark kafka source -> noop": (n / t_spark, "records/s")}
        events = debezium_events(n_changes)
        kafka.create_topic("dbz-bench", PARTITIONS)
        kafka_produce(kafka.bootstrap, "dbz-bench", [v for _, v in events], [k for k, _ in events])
        t_kafka = into_delta(spark, {"backend": "kafka", "kafka.bootstrap.servers": kafka.bootstrap,
                                     "subscribe": "dbz-bench"}, n_changes)
        print(f"kafka/debezium->delta {n_changes / t_kafka:,.0f} changes/s ({n_changes} changes, delta-rs)")
        figures["kafka debezium -> delta"] = (n_changes / t_kafka, "changes/s")
    if pulsar:
        t_pulsar = pulsar_debezium(spark, events)
        print(f"pulsar/debezium->delta {n_changes / t_pulsar:,.0f} changes/s (the same changes, Apache Pulsar)")
        figures["pulsar debezium -> delta"] = (n_changes / t_pulsar, "changes/s")
    spark.stop()
    pool.close()
    ratio = statistics.median(by_reference)
    spark_ratio = statistics.median(by_spark)
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    append_record("kafka_source", {**figures, "kafka/spark-kafka-source": spark_ratio}, ratio=ratio, target=">= 0.8",
                  params={"records": n, "size": size, "rounds": rounds, "changes": n_changes, "pulsar": pulsar})
    print(f"kafka/spark-kafka-source {spark_ratio:.3f}")
    print(f"kafka/confluent-consumer {ratio:.3f}")
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
