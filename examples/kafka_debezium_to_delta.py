"""Debezium over Kafka into Delta Lake: a PostgreSQL table captured by Debezium's connector in Kafka Connect,
streamed by ``backend=kafka`` into a Delta table.

1. Starts what it is not given (on loopback): PostgreSQL (``cdc.servers.postgres``), Apache Kafka in KRaft mode
   and Kafka Connect with Debezium's PostgreSQL connector (``cdc.servers.kafka``; ``make kafka`` resolves them).
2. Creates ``orders`` with some rows and registers a Debezium connector for it: its snapshot and every change
   go to the Kafka topic ``<prefix>.public.orders`` as JSON with schemas.
3. Streams the topic into a Delta table with ``DeltaUpsertSink`` while a writer runs inserts, updates (some
   changing the key) and deletes on PostgreSQL.
4. Stops the writer, writes a last row, drains with ``Trigger.AvailableNow`` until that row has arrived, and
   compares the Delta table with ``SELECT *``.

    python examples/kafka_debezium_to_delta.py --seconds 10
    python examples/kafka_debezium_to_delta.py --bootstrap 127.0.0.1:9092 --connect http://127.0.0.1:8083 \\
        --postgres 'host=127.0.0.1 port=5432 user=postgres dbname=postgres'    # servers of your own
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import cdc  # noqa: E402
from cdc.servers.kafka import ApacheKafka, KafkaConnect, postgres_connector  # noqa: E402
from cdc.servers.kafka.connect import ConnectClient  # noqa: E402
from cdc.servers.postgres import PostgresServer  # noqa: E402
from sinks.delta import DeltaUpsertSink, read  # noqa: E402

COLUMNS = ("order_id", "customer", "amount", "status")
LAST = 10**9  # the key of the row written after the writer stopped


def writer(dsn: str, stop: threading.Event, counts: dict[str, int]) -> None:
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_id = 1000
        while not stop.is_set():
            with conn.transaction():
                next_id += 1
                conn.execute("INSERT INTO orders VALUES (%s, %s, %s, 'new')",
                             (next_id, f"customer \"{rng.randrange(50)}\" \\ o'neil", round(rng.uniform(1, 500), 2)))
                conn.execute("UPDATE orders SET status = %s, amount = amount + 1 WHERE order_id = %s",
                             (rng.choice(["paid", "shipped"]), rng.randrange(1, next_id)))
                if rng.random() < 0.2:
                    conn.execute("DELETE FROM orders WHERE order_id = %s", (rng.randrange(1, next_id),))
                if rng.random() < 0.1:  # a key change: Debezium sends a delete and a create
                    old = rng.randrange(1, next_id)
                    conn.execute("UPDATE orders SET order_id = %s WHERE order_id = %s", (old + 5_000_000, old))
            counts["transactions"] += 1
            time.sleep(0.01)


@contextlib.contextmanager
def servers(args: argparse.Namespace, work: Path) -> Iterator[tuple[str, str, ConnectClient]]:
    """(PostgreSQL DSN, Kafka bootstrap servers, Kafka Connect): the given ones, or new ones on loopback."""
    with contextlib.ExitStack() as stack:
        if args.postgres:
            dsn = args.postgres
        else:
            pg = stack.enter_context(PostgresServer())
            dsn = str(pg.create_database("shop"))
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            kafka = stack.enter_context(ApacheKafka(work / "kafka"))
            bootstrap = kafka.bootstrap
        if args.connect:
            connect: ConnectClient = ConnectClient(args.connect)
        else:
            if args.bootstrap:
                raise SystemExit("--bootstrap needs --connect (a Kafka Connect worker writing to those brokers)")
            connect = stack.enter_context(KafkaConnect(kafka, work / "connect"))
        yield dsn, bootstrap, connect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/cdc-kafka-example")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--bootstrap", help="Kafka's bootstrap servers (default: start Apache Kafka here)")
    parser.add_argument("--connect", help="Kafka Connect's REST URL, its worker writing to --bootstrap")
    parser.add_argument("--postgres", help="a PostgreSQL DSN with wal_level=logical (default: start one here)")
    args = parser.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prefix = f"shop_{uuid.uuid4().hex[:8]}"  # the connector's name, topic prefix, slot and publication
    with servers(args, work) as (dsn, bootstrap, connect):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (order_id bigint PRIMARY KEY, customer text, amount double precision, "
                         "status text)")
            conn.execute("INSERT INTO orders SELECT g, 'customer ' || g, g * 1.5, 'new' FROM generate_series(1, 1000) g")
        info = conninfo_to_dict(dsn)
        connect.create(prefix, postgres_connector(
            host=str(info.get("host", "127.0.0.1")), port=int(info.get("port", 5432)), user=str(info["user"]),
            password=str(info.get("password", "unused")), database=str(info["dbname"]), name=prefix,
            tables=["public.orders"]))
        try:
            connect.wait_running(prefix)
            print(f"Debezium's PostgreSQL connector {prefix} writes {prefix}.public.orders to Kafka at {bootstrap}")
            run(work, dsn, bootstrap, f"{prefix}.public.orders", args.seconds)
        finally:
            connect.delete(prefix)


def run(work: Path, dsn: str, bootstrap: str, topic: str, seconds: float) -> None:
    spark = (SparkSession.builder.master("local[2]").appName("kafka-debezium-to-delta")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    table, checkpoint = str(work / "orders"), str(work / "checkpoint")

    def stream() -> Any:
        return (spark.readStream.format("cdc").option("backend", "kafka")
                .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
                .option("valueFormat", "debezium").option("changeKeys", "order_id")
                .option("maxOffsetsPerTrigger", "2000").load()
                .writeStream.foreachBatch(DeltaUpsertSink(table, keys=["order_id"]))
                .option("checkpointLocation", checkpoint))

    wait_for_topic(bootstrap, topic)
    query = stream().trigger(processingTime="1 second").start()
    stop, counts = threading.Event(), {"transactions": 0}
    thread = threading.Thread(target=writer, args=(dsn, stop, counts))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    query.stop()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders VALUES (%s, 'last', 0, 'done')", (LAST,))
        rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM orders").fetchall()
    print(f"the writer ran {counts['transactions']} transactions; draining what Debezium wrote to Kafka")
    lake: list[Any] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until the last row, written after every other change, is in the table
        q = stream().trigger(availableNow=True).start()
        q.awaitTermination()
        if q.exception() is not None and "Python worker failed to connect back" in str(q.exception()):
            # Spark gives a Python worker a fixed 10 s to start: on a busy machine, run the query again (its
            # checkpoint makes the new run carry on exactly once)
            continue
        if q.exception() is not None:
            raise SystemExit(f"the query failed: {q.exception()}")
        lake = read(spark, table).select(*COLUMNS).collect()
        if any(r["order_id"] == LAST for r in lake):
            break
        time.sleep(1)
    spark.stop()
    if not any(r["order_id"] == LAST for r in lake):
        raise SystemExit("RESULT: the last row did not reach the Delta table within 300 s")
    expected = sorted(tuple(r) for r in rows)
    got = sorted(tuple(r) for r in lake)
    if got != expected:
        missing, extra = set(expected) - set(got), set(got) - set(expected)
        raise SystemExit(f"RESULT: MISMATCH: {len(missing)} rows missing, {len(extra)} unexpected; e.g. "
                         f"{sorted(missing)[:3]} / {sorted(extra)[:3]}")
    print(f"RESULT: the Delta table equals SELECT * of the PostgreSQL table ({len(got)} rows after "
          f"{counts['transactions']} transactions through Debezium and Kafka)")


def wait_for_topic(bootstrap: str, topic: str, timeout: float = 120) -> None:
    """Debezium creates the topic with the snapshot's first event; the query subscribes to it by name."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while topic not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise SystemExit(f"Debezium wrote nothing to {topic} within {timeout} s")
        time.sleep(0.5)


if __name__ == "__main__":
    main()
