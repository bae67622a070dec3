"""Debezium over Kafka, end to end with real parts: Debezium's PostgreSQL connector in Kafka Connect (the
session's worker) captures a table of the tests' PostgreSQL into the session's Kafka (JSON converter with
schemas), and the Delta table built from it equals ``SELECT *``: through ``backend=kafka``, and through
Spark's own ``format("kafka")`` decoded by :func:`cdc.backends.kafka.spark.spark_kafka_changes`.

Column ``big`` is stored out of line (TOAST): an update that does not touch it carries Debezium's placeholder,
which must become an unchanged column, never the value."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc.backends.kafka.spark import spark_kafka_changes
from cdc.formats.debezium import record_schema_of
from cdc.servers.kafka import ApacheKafka, KafkaConnect, postgres_connector
from sinks.delta import DeltaUpsertSink, read
from tests.backends.kafka.helpers import backend, drain
from tests.streaming import await_with_retries

pytestmark = pytest.mark.spark

COLUMNS = ("id", "name", "qty", "price", "ok", "day", "at", "big")
BIG = "repeat('big \\ \"'' ', 500)"  # 3,500 characters: out of line with STORAGE EXTERNAL


class Captured:
    def __init__(self, topic: str, rows: list[tuple[Any, ...]], events: int, dsn: str) -> None:
        self.topic, self.rows, self.events, self.dsn = topic, rows, events, dsn


def _messages(kafka: ApacheKafka, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "count"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta.partitions)
    finally:
        consumer.close()


def wait_for_messages(kafka: ApacheKafka, topic: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (have := _messages(kafka, topic)) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: {have} of {n} Debezium events after {timeout} s")
        time.sleep(0.5)


def capture_table(kafka_connect: KafkaConnect, postgres_server: Any, name: str, *, schemas: bool = True) -> Iterator[
        tuple[str, str, Any]]:
    """A database ``name`` with table ``items``, and a Debezium connector capturing it (removed afterwards):
    yields (DSN, the table's topic, a connection)."""
    dsn = str(postgres_server.create_database(name))
    info = conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("CREATE TABLE items (id integer PRIMARY KEY, name text, qty bigint, price double precision, "
                   "ok boolean, day date, at timestamp(6), big text)")
        db.execute("ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL")
        db.execute("INSERT INTO items SELECT i, 'row ' || i, i * 10, i / 4.0, i % 2 = 0, DATE '2024-01-01' + i, "
                   "TIMESTAMP '2024-01-01 00:00:00.000001' + i * INTERVAL '1 hour 1 microsecond', "
                   f"CASE WHEN i IN (2, 3) THEN {BIG} END FROM generate_series(1, 5) i")
        config = postgres_connector(host="127.0.0.1", port=int(info.get("port", 5432)), user=str(info["user"]),
                                    database=name, name=name, tables=["public.items"], schemas=schemas)
        kafka_connect.create(name, config)
        try:
            kafka_connect.wait_running(name)
            yield dsn, f"{name}.public.items", db
        finally:
            kafka_connect.delete(name)


@pytest.fixture(scope="module")
def captured(kafka_connect: KafkaConnect, apache_kafka: ApacheKafka, postgres_server: Any,
             request: pytest.FixtureRequest) -> Iterator[Captured]:
    name = "dbz_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    for dsn, topic, db in capture_table(kafka_connect, postgres_server, name):
        wait_for_messages(apache_kafka, topic, 5)
        db.execute("INSERT INTO items VALUES (6, 'six', NULL, NULL, NULL, NULL, NULL, NULL), "
                   "(7, 'se\"v''en\\\\', 70, -1.5e300, true, DATE '1969-12-31', TIMESTAMP '1960-06-01 12:00:00.5', "
                   "NULL)")
        db.execute("UPDATE items SET name = NULL, qty = qty + 1 WHERE id = 2")
        db.execute("UPDATE items SET price = 2.25, ok = NOT ok, day = day + 400 WHERE id = 3")
        db.execute("DELETE FROM items WHERE id = 4")  # delete + tombstone
        db.execute("UPDATE items SET id = 50 WHERE id = 5")  # delete + tombstone + create
        db.execute("TRUNCATE items")
        db.execute(f"INSERT INTO items (id, name, big) VALUES (2, 'two again', NULL), (8, 'eight', {BIG})")
        db.execute("UPDATE items SET qty = 3 WHERE id = 8")  # big: the placeholder; the lake keeps the value
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM items ORDER BY id").fetchall()
        events = 5 + 2 + 1 + 1 + 2 + 3 + 1 + 2 + 1
        wait_for_messages(apache_kafka, topic, events)
        yield Captured(topic, rows, events, dsn)


def _source_rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for row in rows:
        values = [row[c] for c in COLUMNS]
        at = values[COLUMNS.index("at")]
        if at is not None and at.tzinfo:  # Delta holds UTC timestamps; the PostgreSQL column has no zone
            values[COLUMNS.index("at")] = at.astimezone(UTC).replace(tzinfo=None)
        out.append(tuple(values))
    return sorted(out)


def test_every_kind_of_event_decodes(captured: Captured, apache_kafka: ApacheKafka) -> None:
    b = backend(apache_kafka.bootstrap, captured.topic, valueFormat="debezium", changeKeys="id",
                **{"debezium.truncate": "apply"})
    table, _ = drain(b)
    assert table.column("_op").to_pylist() == ["snapshot"] * 5 + ["insert", "insert", "update", "update", "delete",
                                                                   "delete", "insert", "truncate", "insert", "insert",
                                                                   "update"]
    offsets = table.column("_position").to_pylist()
    assert offsets == sorted(offsets) and table.column("_seq").to_pylist() == offsets
    assert table.column("name").to_pylist()[6] == "se\"v'en\\\\"
    # Updates that leave big alone: its placeholder is an unchanged column, never a value
    assert table.column("_unchanged").to_pylist()[7:9] == [["big"], ["big"]]
    assert table.column("big").to_pylist()[7:9] == [None, None]
    assert table.column("_unchanged").to_pylist()[-1] == ["big"]
    # The key change 5 -> 50: the create carries the deleted key
    assert table.column("_old_key").to_pylist()[10:12] == [None, {"id": 5}]


def test_real_events_stream_into_delta_equal_to_the_table(captured: Captured, apache_kafka: ApacheKafka, spark: Any,
                                                          tmp_path: Path) -> None:
    reader = (spark.readStream.format("cdc").option("backend", "kafka")
              .option("kafka.bootstrap.servers", apache_kafka.bootstrap).option("subscribe", captured.topic)
              .option("valueFormat", "debezium").option("changeKeys", "id").option("debezium.truncate", "apply")
              .option("maxOffsetsPerTrigger", "6"))  # 3 batches: the key change 5 -> 50 ends one, starts the next
    q = await_with_retries(lambda: reader.load().writeStream.foreachBatch(
        DeltaUpsertSink(str(tmp_path / "items"), keys=["id"])).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start())
    assert q.exception() is None
    assert _source_rows(read(spark, str(tmp_path / "items")).collect()) == _source_rows(
        [dict(zip(COLUMNS, r, strict=True)) for r in captured.rows])


def test_spark_kafka_source_output_into_delta_equal_to_the_table(captured: Captured, apache_kafka: ApacheKafka,
                                                                 spark: Any, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": apache_kafka.bootstrap, "group.id": "schema"})
    consumer.assign([TopicPartition(captured.topic, 0, 0)])
    first = consumer.poll(30)
    consumer.close()
    value_schema = record_schema_of(json.loads(first.value())["schema"])
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", apache_kafka.bootstrap)
           .option("subscribe", captured.topic).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", "7").load())  # 3 batches
    changes = spark_kafka_changes(raw, change_keys="id", value_schema=value_schema, truncate="apply")
    q = await_with_retries(lambda: changes.writeStream.foreachBatch(
        DeltaUpsertSink(str(tmp_path / "items"), keys=["id"])).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start())
    assert q.exception() is None
    assert _source_rows(read(spark, str(tmp_path / "items")).collect()) == _source_rows(
        [dict(zip(COLUMNS, r, strict=True)) for r in captured.rows])
