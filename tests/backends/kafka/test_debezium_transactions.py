"""Debezium transaction metadata through real Kafka Connect (``debezium.transactionTopic``): Debezium's
PostgreSQL connector with ``provide.transaction.metadata=true`` (its own prefix, slot and publication on the
session's Connect worker) captures multi-row transactions over two tables, each table's topic with 2
partitions (keys spread over both), BEGIN/END on ``<prefix>.transaction``. Read with a record budget of 2,
every batch holds whole transactions (told by each event's ``transaction.id``), and the batches together
hold every change, whose last images equal ``SELECT *`` of each table."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg.conninfo import conninfo_to_dict

from cdc.planner import Planner
from cdc.servers.kafka import ApacheKafka, KafkaConnect, postgres_connector
from cdc.testing import batches
from tests.backends.kafka.helpers import backend
from tests.backends.kafka.test_debezium import wait_for_messages

VALUE_SCHEMA = json.dumps({"type": "record", "name": "row", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]},
    {"name": "qty", "type": ["null", "long"]}]})
# each item one PostgreSQL transaction: (SQL statements, data change events it makes, tombstones)
TRANSACTIONS = [
    (["INSERT INTO a SELECT i, 'a' || i, i FROM generate_series(4, 7) i",
      "INSERT INTO b SELECT i, 'b' || i, i FROM generate_series(3, 4) i"], 6, 0),
    (["UPDATE a SET qty = 100 WHERE id <= 3", "UPDATE b SET qty = qty + 1"], 7, 0),
    (["INSERT INTO a VALUES (8, 'eight', 8)"], 1, 0),
    (["DELETE FROM b WHERE id = 1", "INSERT INTO a SELECT i, 'a' || i, i FROM generate_series(9, 11) i"], 4, 1),
    (["UPDATE a SET name = 'x' || id WHERE id BETWEEN 4 AND 9", "UPDATE b SET name = NULL WHERE id = 2"], 7, 0),
]
SNAPSHOT = 3 + 2


class Captured:
    def __init__(self, prefix: str, rows: dict[str, list[tuple[Any, ...]]], events: dict[tuple[str, int], str | None]):
        self.prefix, self.rows, self.events = prefix, rows, events


def _events(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], str | None]:
    """(channel, offset) -> the PostgreSQL transaction (``transaction.id``'s txId) of every change event."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tx-events", "enable.partition.eof": True})
    parts = [TopicPartition(t, p, 0) for t in topics for p in (0, 1)]
    consumer.assign(parts)
    out: dict[tuple[str, int], str | None] = {}
    left = {(t.topic, t.partition) for t in parts}
    try:
        while left:
            m = consumer.poll(5)
            assert m is not None, f"no end of {left}"
            if m.error() is not None:
                left.discard((m.topic(), m.partition()))
                continue
            if m.value():
                block = json.loads(m.value())["transaction"]
                out[(f"{m.topic()}:{m.partition()}", m.offset())] = None if block is None else block["id"].split(":")[0]
    finally:
        consumer.close()
    return out


@pytest.fixture(scope="module")
def captured(kafka_connect: KafkaConnect, apache_kafka: ApacheKafka, postgres_server: Any,
             request: pytest.FixtureRequest) -> Iterator[Captured]:
    name = "dbz_tx_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    topics = [f"{name}.public.a", f"{name}.public.b"]
    for t in topics:
        apache_kafka.create_topic(t, 2)
    apache_kafka.create_topic(f"{name}.transaction", 1)
    dsn = str(postgres_server.create_database(name))
    info = conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as db:
        for table in ("a", "b"):
            db.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, name text, qty bigint)")
        db.execute("INSERT INTO a SELECT i, 'a' || i, i FROM generate_series(1, 3) i")
        db.execute("INSERT INTO b SELECT i, 'b' || i, i FROM generate_series(1, 2) i")
        config = postgres_connector(host="127.0.0.1", port=int(info.get("port", 5432)), user=str(info["user"]),
                                    database=name, name=name, tables=["public.a", "public.b"], schemas=False,
                                    transactions=True)
        kafka_connect.create(name, config)
        try:
            kafka_connect.wait_running(name)
            wait_for_messages(apache_kafka, topics[0], 3)
            wait_for_messages(apache_kafka, topics[1], 2)
            for statements, _, _ in TRANSACTIONS:
                with db.transaction():
                    for sql in statements:
                        db.execute(sql)
            wait_for_messages(apache_kafka, f"{name}.transaction", 2 * len(TRANSACTIONS))  # BEGIN and END each
            events = SNAPSHOT + sum(n + t for _, n, t in TRANSACTIONS)
            wait_for_messages(apache_kafka, topics[0], 20)
            wait_for_messages(apache_kafka, topics[1], events - 20)
            rows = {t: db.execute(f"SELECT id, name, qty FROM {t} ORDER BY id").fetchall() for t in ("a", "b")}
            found = _events(apache_kafka.bootstrap, topics)
            assert len(found) == events - sum(t for _, _, t in TRANSACTIONS)  # tombstones have no value
            yield Captured(name, rows, found)
        finally:
            kafka_connect.delete(name)
            for t in [*topics, f"{name}.transaction"]:
                apache_kafka.delete_topic(t)


def test_every_batch_holds_whole_transactions_over_partitions_and_tables(captured: Captured,
                                                                          apache_kafka: ApacheKafka) -> None:
    sizes = Counter(tx for tx in captured.events.values() if tx is not None)
    assert len(sizes) == len(TRANSACTIONS) and sorted(sizes.values()) == sorted(n for _, n, _ in TRANSACTIONS)
    # transactions spread over both partitions of a topic, and over both tables
    spread = {tx: {c for (c, _), t in captured.events.items() if t == tx} for tx in sizes}
    assert any(len({c.split(":")[0] for c in chans}) == 2 for chans in spread.values())
    assert any(len([c for c in chans if ".public.a:" in c]) == 2 for chans in spread.values())
    b = backend(apache_kafka.bootstrap, f"{captured.prefix}.public.a,{captured.prefix}.public.b",
                valueFormat="debezium", valueSchema=VALUE_SCHEMA, changeKeys="id",
                **{"debezium.transactionTopic": f"{captured.prefix}.transaction"})
    got: list[Counter[str | None]] = []
    last: dict[str, dict[int, tuple[Any, ...] | None]] = {"a": {}, "b": {}}
    seen: list[tuple[str, int]] = []
    for _, table in batches(b, Planner(b).initial("earliest"), 2):
        in_batch: Counter[str | None] = Counter()
        for r in table.to_pylist():
            key = (r["_channel"], r["_position"])
            seen.append(key)
            in_batch[captured.events[key]] += 1
            t = r["_channel"].split(":")[0].rsplit(".", 1)[1]
            last[t][r["id"]] = None if r["_op"] == "delete" else (r["id"], r["name"], r["qty"])
        got.append(in_batch)
    for in_batch in got:
        whole = {tx: n for tx, n in in_batch.items() if tx is not None}
        assert whole == {tx: sizes[tx] for tx in whole}, got  # a batch ends only between transactions
    assert any(sum(c.values()) > 2 for c in got), got  # the budget of 2 was exceeded to take a transaction whole
    assert len(got) > len(TRANSACTIONS) // 2, got
    assert sorted(seen) == sorted(captured.events)  # every change once
    for t in ("a", "b"):
        assert sorted(v for v in last[t].values() if v is not None) == [tuple(r) for r in captured.rows[t]]
