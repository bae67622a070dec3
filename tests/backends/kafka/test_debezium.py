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
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc.backends.kafka.spark import spark_kafka_changes
from cdc.errors import MalformedRecordError, OptionError
from cdc.formats.debezium import record_schema_of
from cdc.servers.kafka import ApacheKafka, KafkaConnect, postgres_connector
from sinks.delta import DeltaUpsertSink, read
from tests.backends.kafka.helpers import backend, drain
from tests.streaming import await_with_retries

pytestmark = pytest.mark.spark

COLUMNS = ("id", "name", "qty", "price", "ok", "day", "at", "big")
BIG = "repeat('big \\ \"'' ', 500)"  # 3,500 characters: out of line with STORAGE EXTERNAL
TEXT_KEYS = ('a"b\\c\'d', '\\"x"\\\\', 'new "k" \\n')  # quotes and backslashes inside a text key


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


def capture_table(kafka_connect: KafkaConnect, postgres_server: Any, name: str, *, schemas: bool = True,
                  tags: bool = False) -> Iterator[tuple[str, str, Any]]:
    """A database ``name`` with table ``items`` (and ``tags``, keyed by text, when ``tags``), and a Debezium
    connector capturing it (removed afterwards): yields (DSN, the items topic, a connection)."""
    dsn = str(postgres_server.create_database(name))
    info = conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("CREATE TABLE items (id integer PRIMARY KEY, name text, qty bigint, price double precision, "
                   "ok boolean, day date, at timestamp(6), big text)")
        db.execute("ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL")
        db.execute("INSERT INTO items SELECT i, 'row ' || i, i * 10, i / 4.0, i % 2 = 0, DATE '2024-01-01' + i, "
                   "TIMESTAMP '2024-01-01 00:00:00.000001' + i * INTERVAL '1 hour 1 microsecond', "
                   f"CASE WHEN i IN (2, 3) THEN {BIG} END FROM generate_series(1, 5) i")
        if tags:
            db.execute("CREATE TABLE tags (k text PRIMARY KEY, v integer)")
            db.execute("INSERT INTO tags VALUES (%s, 1), (%s, 2)", TEXT_KEYS[:2])
        config = postgres_connector(host="127.0.0.1", port=int(info.get("port", 5432)), user=str(info["user"]),
                                    database=name, name=name, tables=["public.items", *(["public.tags"] if tags else [])],
                                    schemas=schemas)
        kafka_connect.create(name, config)
        try:
            kafka_connect.wait_running(name)
            yield dsn, f"{name}.public.items", db
        finally:
            kafka_connect.delete(name)


def _make_changes(db: Any) -> int:
    """Every kind of change on ``items`` after its snapshot of 5 rows; returns the events Debezium writes for
    them (tombstones included)."""
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
    return 5 + 2 + 1 + 1 + 2 + 3 + 1 + 2 + 1


def _change_tags(db: Any) -> int:
    """An update, a key change and a delete on ``tags`` after its snapshot of 2 rows; returns the events."""
    db.execute("UPDATE tags SET v = 10 WHERE k = %s", TEXT_KEYS[:1])
    db.execute("UPDATE tags SET k = %s WHERE k = %s", TEXT_KEYS[2:0:-1])  # delete + tombstone + create
    db.execute("DELETE FROM tags WHERE k = %s", TEXT_KEYS[:1])  # delete + tombstone
    return 2 + 1 + 3 + 2


def _capture(kafka_connect: KafkaConnect, apache_kafka: ApacheKafka, postgres_server: Any, name: str,
             schemas: bool, tags: bool = False) -> Iterator[Captured]:
    for dsn, topic, db in capture_table(kafka_connect, postgres_server, name, schemas=schemas, tags=tags):
        wait_for_messages(apache_kafka, topic, 5)
        events = _make_changes(db)
        if tags:
            wait_for_messages(apache_kafka, tags_topic(topic), 2)
            wait_for_messages(apache_kafka, tags_topic(topic), _change_tags(db))
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM items ORDER BY id").fetchall()
        wait_for_messages(apache_kafka, topic, events)
        yield Captured(topic, rows, events, dsn)


@pytest.fixture(scope="module")
def captured(kafka_connect: KafkaConnect, apache_kafka: ApacheKafka, postgres_server: Any,
             request: pytest.FixtureRequest) -> Iterator[Captured]:
    name = "dbz_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    yield from _capture(kafka_connect, apache_kafka, postgres_server, name, schemas=True)


@pytest.fixture(scope="module")
def schemaless(kafka_connect: KafkaConnect, apache_kafka: ApacheKafka, postgres_server: Any,
               request: pytest.FixtureRequest) -> Iterator[Captured]:
    """The same changes through a second connector of the session's Connect, its converters writing JSON
    without schemas (``schemas.enable=false``), and table ``tags`` keyed by text."""
    name = "dbz_nos_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    yield from _capture(kafka_connect, apache_kafka, postgres_server, name, schemas=False, tags=True)


def tags_topic(items_topic: str) -> str:
    return items_topic.removesuffix(".items") + ".tags"


def _source_rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for row in rows:
        values = [row[c] for c in COLUMNS]
        at = values[COLUMNS.index("at")]
        if at is not None and at.tzinfo:  # Delta holds UTC timestamps; the PostgreSQL column has no zone
            values[COLUMNS.index("at")] = at.astimezone(UTC).replace(tzinfo=None)
        out.append(tuple(values))
    return sorted(out)


def _assert_every_kind(table: Any) -> None:
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


def test_every_kind_of_event_decodes(captured: Captured, apache_kafka: ApacheKafka) -> None:
    b = backend(apache_kafka.bootstrap, captured.topic, valueFormat="debezium", changeKeys="id",
                **{"debezium.truncate": "apply"})
    table, _ = drain(b)
    _assert_every_kind(table)


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


# ------------------------------------------------------------------ JSON without schemas (schemas.enable=false)
# What a user writes for the items table: Debezium's JSON holds dates as days since 1970 and timestamp(6) as
# microseconds since 1970 (io.debezium.time.MicroTimestamp), the record schema's logical types say so.
ITEMS_SCHEMA = json.dumps({"type": "record", "name": "items", "fields": [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "qty", "type": ["null", "long"]},
    {"name": "price", "type": ["null", "double"]},
    {"name": "ok", "type": ["null", "boolean"]},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "big", "type": ["null", "string"]}]})
TAGS_SCHEMA = json.dumps({"type": "record", "name": "tags", "fields": [
    {"name": "k", "type": "string"}, {"name": "v", "type": ["null", "int"]}]})


def test_schemaless_events_without_value_schema_fail_naming_it(schemaless: Captured,
                                                               apache_kafka: ApacheKafka) -> None:
    with pytest.raises(OptionError) as err:
        backend(apache_kafka.bootstrap, schemaless.topic, valueFormat="debezium", changeKeys="id")
    assert err.value.option == "valueSchema"
    assert str(err.value).startswith(f"option 'valueSchema' is required: {schemaless.topic}:0 offset 0 is a "
                                     "Debezium event without a schema (JSON converter with schemas.enable=false)")


def test_schemaless_events_decode_with_the_given_value_schema(schemaless: Captured,
                                                              apache_kafka: ApacheKafka) -> None:
    b = backend(apache_kafka.bootstrap, schemaless.topic, valueFormat="debezium", changeKeys="id",
                valueSchema=ITEMS_SCHEMA, **{"debezium.truncate": "apply"})
    table, _ = drain(b)
    _assert_every_kind(table)
    rows = table.select(["_op", *COLUMNS]).to_pylist()
    assert rows[0] == {"_op": "snapshot", "id": 1, "name": "row 1", "qty": 10, "price": 0.25, "ok": False,
                       "day": date(2024, 1, 2), "at": datetime(2024, 1, 1, 1, 0, 0, 2, tzinfo=UTC), "big": None}
    assert rows[1]["big"] == rows[-2]["big"] == "big \\ \"' " * 500  # out of line, whole in a create
    assert rows[5] == {"_op": "insert", "id": 6, "name": "six", "qty": None, "price": None, "ok": None,
                       "day": None, "at": None, "big": None}
    assert rows[6] == {"_op": "insert", "id": 7, "name": "se\"v'en\\\\", "qty": 70, "price": -1.5e300, "ok": True,
                       "day": date(1969, 12, 31), "at": datetime(1960, 6, 1, 12, 0, 0, 500000, tzinfo=UTC),
                       "big": None}


def test_schemaless_text_keys_with_quotes_and_backslashes(schemaless: Captured, apache_kafka: ApacheKafka) -> None:
    b = backend(apache_kafka.bootstrap, tags_topic(schemaless.topic), valueFormat="debezium", changeKeys="k",
                valueSchema=TAGS_SCHEMA)
    table, _ = drain(b)
    k1, k2, k3 = TEXT_KEYS
    assert table.select(["_op", "k", "v", "_old_key"]).to_pylist() == [
        {"_op": "snapshot", "k": k1, "v": 1, "_old_key": None},
        {"_op": "snapshot", "k": k2, "v": 2, "_old_key": None},
        {"_op": "update", "k": k1, "v": 10, "_old_key": None},
        {"_op": "delete", "k": k2, "v": None, "_old_key": None},
        {"_op": "insert", "k": k3, "v": 2, "_old_key": {"k": k2}},
        {"_op": "delete", "k": k1, "v": None, "_old_key": None},
    ]


def test_a_value_schema_that_does_not_fit_the_events_fails_naming_the_column(schemaless: Captured,
                                                                              apache_kafka: ApacheKafka) -> None:
    wrong = json.loads(ITEMS_SCHEMA)
    wrong["fields"][5]["type"] = ["null", "string"]  # day: Debezium sends a number of days
    b = backend(apache_kafka.bootstrap, schemaless.topic, valueFormat="debezium", changeKeys="id",
                valueSchema=json.dumps(wrong))
    with pytest.raises(MalformedRecordError, match=rf"{schemaless.topic}.* offset 0 .*field 'day': expected a string"):
        drain(b)


def test_schemaless_events_stream_into_delta_equal_to_the_table(schemaless: Captured, apache_kafka: ApacheKafka,
                                                                spark: Any, tmp_path: Path) -> None:
    reader = (spark.readStream.format("cdc").option("backend", "kafka")
              .option("kafka.bootstrap.servers", apache_kafka.bootstrap).option("subscribe", schemaless.topic)
              .option("valueFormat", "debezium").option("changeKeys", "id").option("valueSchema", ITEMS_SCHEMA)
              .option("debezium.truncate", "apply").option("maxOffsetsPerTrigger", "6"))
    q = await_with_retries(lambda: reader.load().writeStream.foreachBatch(
        DeltaUpsertSink(str(tmp_path / "items"), keys=["id"])).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start())
    assert q.exception() is None
    assert _source_rows(read(spark, str(tmp_path / "items")).collect()) == _source_rows(
        [dict(zip(COLUMNS, r, strict=True)) for r in schemaless.rows])
