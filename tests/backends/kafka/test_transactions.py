"""Debezium transaction metadata on Kafka (``debezium.transactionTopic``): the driver's offset index over a
real topic, and batches planned over it.

The events follow the PostgreSQL connector's output with ``provide.transaction.metadata=true``; a
transactional producer writes them, so the data partitions hold commit markers and the records of an
aborted transaction (offsets the index must treat as gaps, never as data). Real Debezium through Kafka
Connect is ``tests/backends/kafka/test_debezium_transactions.py``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from cdc.backends.kafka.positions import Partition
from cdc.errors import OptionError
from cdc.planner import Planner
from cdc.servers.kafka import ApacheKafka
from cdc.testing import batches
from tests.backends.kafka.helpers import backend

ROW = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]})
SOURCE = {"version": "3.4.3.Final", "connector": "postgresql", "name": "pg", "db": "app", "schema": "public",
          "table": "items", "ts_ms": 1700000000123}


def event(tx: str | None, row_id: int) -> bytes:
    block = None if tx is None else {"id": tx, "total_order": 1, "data_collection_order": 1}
    return json.dumps({"before": None, "after": {"id": row_id, "name": f"r{row_id}"}, "source": SOURCE,
                       "transaction": block, "op": "c" if tx else "r", "ts_ms": 1700000009999}).encode()


def end(tx: str, n: int) -> bytes:
    return json.dumps({"status": "END", "id": tx, "ts_ms": 1700000009999, "event_count": n,
                       "data_collections": [{"data_collection": "public.items", "event_count": n}]}).encode()


def begin(tx: str) -> bytes:
    return json.dumps({"status": "BEGIN", "id": tx, "ts_ms": 1700000009999}).encode()


class Written:
    """What a transactional producer wrote: the offsets of committed and of aborted records per partition."""

    def __init__(self) -> None:
        self.committed: dict[int, list[int]] = {0: [], 1: []}
        self.aborted: dict[int, list[int]] = {0: [], 1: []}


def _write(bootstrap: str, topic: str, txs: list[tuple[list[tuple[int, bytes]], bool]], out: Written) -> None:
    """Each item one Kafka transaction of (partition, value) records, committed or aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for records, commit in txs:
        producer.begin_transaction()
        got: list[tuple[int, int]] = []
        for partition, value in records:
            producer.produce(topic, value=value, partition=partition,
                             on_delivery=lambda err, m, got=got: got.append((m.partition(), m.offset())))
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
        for partition, offset in got:
            (out.committed if commit else out.aborted)[partition].append(offset)


@pytest.fixture
def captured(kafka: ApacheKafka, topic: str) -> Iterator[tuple[str, Written]]:
    """Source transactions "10" (3 events over both partitions), "11" (2), "12" (1), a snapshot read before
    them; a Kafka transaction carrying events of "99" is aborted (its END never written either)."""
    marks = f"{topic}.transaction"
    kafka.create_topic(marks, 1)
    written = Written()
    _write(kafka.bootstrap, topic, [
        ([(0, event(None, 1))], True),
        ([(0, event("10:1", 2)), (1, event("10:2", 3)), (1, event("10:3", 4))], True),
        ([(0, event("99:1", 90)), (1, event("99:2", 91))], False),
        ([(1, event("11:1", 5)), (0, event("11:2", 6))], True),
        ([(0, event("12:1", 7))], True),
    ], written)
    _write(kafka.bootstrap, marks, [([(0, begin("10:0")), (0, end("10:9", 3)), (0, begin("11:0")),
                                      (0, end("11:9", 2)), (0, begin("12:0")), (0, end("12:9", 1))], True)],
           Written())
    yield marks, written
    kafka.delete_topic(marks)


def _backend(kafka: ApacheKafka, topic: str, marks: str) -> Any:
    return backend(kafka.bootstrap, topic, valueFormat="debezium", valueSchema=ROW, changeKeys="id",
                   **{"debezium.transactionTopic": marks})


def test_the_index_holds_committed_records_only_with_their_transactions(kafka: ApacheKafka, topic: str,
                                                                         captured: tuple[str, Written]) -> None:
    marks, written = captured
    b = _backend(kafka, topic, marks)
    b.list_channels()
    for p in (0, 1):
        b.plan(f"{topic}:{p}", 0)
    index = b._transactions
    assert index is not None
    for p in (0, 1):
        entries = index.entries(Partition(topic, p))
        # aborted records and commit markers are gaps: the index holds exactly the committed records
        assert list(entries.keys) == written.committed[p]
        assert not set(entries.keys) & set(written.aborted[p])
        assert entries.upto == b.latest(f"{topic}:{p}")  # the head, past the last commit marker
        assert "99" not in entries.marks
    assert index.entries(Partition(topic, 0)).marks == [None, "10", "11", "12"]
    assert index.entries(Partition(topic, 1)).marks == ["10", "10", "11"]
    assert index.log.frontier == 2  # every transaction complete


def test_batches_hold_whole_transactions_over_both_partitions(kafka: ApacheKafka, topic: str,
                                                              captured: tuple[str, Written]) -> None:
    marks, written = captured
    b = _backend(kafka, topic, marks)
    tx_of = {1: None, 2: "10", 3: "10", 4: "10", 5: "11", 6: "11", 7: "12"}
    sizes = Counter(tx_of.values())
    got = [table.column("id").to_pylist() for _, table in batches(b, Planner(b).initial("earliest"), 1)]
    # a budget of 1 record: each batch takes the transactions it holds whole, on both partitions
    for ids in got:
        in_batch = Counter(tx_of[i] for i in ids if tx_of[i] is not None)
        assert in_batch == {t: sizes[t] for t in in_batch}, got
    assert sorted(i for ids in got for i in ids) == list(range(1, 8))
    assert len(got) >= 3 and any(len(ids) > 1 for ids in got), got


def test_a_bound_inside_a_transaction_moves_the_end_back(kafka: ApacheKafka, topic: str,
                                                         captured: tuple[str, Written]) -> None:
    marks, written = captured
    b = _backend(kafka, topic, marks)
    b.list_channels()
    # endingOffsets right after transaction 10's event on partition 1 (offset 0): the end moves back before it
    planned = b.plan(f"{topic}:1", 0, None, written.committed[1][0] + 1)
    assert (planned.end, planned.records) == (0, 0)
    b.list_channels()
    planned = b.plan(f"{topic}:1", 0, None, written.committed[1][1] + 1)
    assert (planned.end, planned.records) == (written.committed[1][1] + 1, 2)


def test_a_transaction_whose_end_is_missing_is_not_taken(kafka: ApacheKafka, topic: str) -> None:
    marks = f"{topic}.transaction"
    kafka.create_topic(marks, 1)
    try:
        _end_arrives_later(kafka, topic, marks)
    finally:
        kafka.delete_topic(marks)


def _end_arrives_later(kafka: ApacheKafka, topic: str, marks: str) -> None:
    _write(kafka.bootstrap, topic, [([(0, event("20:1", 1)), (1, event("20:2", 2))], True)], Written())
    b = _backend(kafka, topic, marks)
    b.list_channels()
    assert [b.plan(f"{topic}:{p}", 0, 10).records for p in (0, 1)] == [0, 0]
    _write(kafka.bootstrap, marks, [([(0, end("20:9", 2))], True)], Written())
    b.list_channels()
    assert [b.plan(f"{topic}:{p}", 0, 10).records for p in (0, 1)] == [1, 1]


def test_bad_transaction_topic_options_name_it(kafka: ApacheKafka, topic: str) -> None:
    with pytest.raises(OptionError, match="debezium.transactionTopic.*not a data topic"):
        _backend(kafka, topic, topic)
    with pytest.raises(OptionError, match="needs valueFormat=debezium"):
        backend(kafka.bootstrap, topic, **{"debezium.transactionTopic": "x.transaction"})
    with pytest.raises(OptionError, match="a Kafka topic name"):
        _backend(kafka, topic, "a/b")
    kafka.create_topic(f"{topic}.tx2", 2)
    try:
        b = _backend(kafka, topic, f"{topic}.tx2")
        with pytest.raises(OptionError, match="has 2 partitions.*one partition"):
            b.list_channels()
    finally:
        kafka.delete_topic(f"{topic}.tx2")
    b = _backend(kafka, topic, f"{topic}.missing")
    with pytest.raises(OptionError, match="does not exist"):
        b.list_channels()


def test_planned_entries_are_dropped_and_read_again_when_planning_goes_back(
        kafka: ApacheKafka, topic: str, captured: tuple[str, Written], monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc.backends.kafka import transactions

    monkeypatch.setattr(transactions, "TRIM_AT", 1)
    marks, written = captured
    b = _backend(kafka, topic, marks)
    first = [table.column("id").to_pylist() for _, table in batches(b, Planner(b).initial("earliest"), 2)]
    assert b._transactions is not None
    entries = b._transactions.entries(Partition(topic, 0))
    # the last round planned from the head: every entry below it is dropped
    assert list(entries.keys) == [] and entries.floor == b.latest(f"{topic}:0")
    # planning from earliest again reads the partitions again, and cuts the same batches
    again = [table.column("id").to_pylist() for _, table in batches(b, Planner(b).initial("earliest"), 2)]
    assert again == first and sorted(i for ids in first for i in ids) == list(range(1, 8))
