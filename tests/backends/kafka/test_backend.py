"""backend=kafka against the session's Apache Kafka: what offsets mean (transactions, compaction, retention),
partitions added mid-stream, Spark's offset JSON, the consumer group's offsets, lag, and errors that name
what to fix."""

from __future__ import annotations

import json
import pickle
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc.backends.kafka import FetchTimeoutError, KafkaOptions
from cdc.backends.kafka.reader import KafkaRangeReader
from cdc.errors import DataLossError, MalformedRecordError, OptionError
from cdc.options import parse, split_and_parse
from cdc.planner import Planner
from cdc.servers.kafka import ApacheKafka
from cdc.testing.harness import read_range
from tests.backends.kafka.helpers import backend, drain, options, produce


def _values(table: Any) -> list[bytes]:
    return table.column("value").to_pylist()


def test_transactions_read_committed_skips_aborted_and_control_records(kafka: ApacheKafka, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(60)
    for i, outcome in enumerate(["commit", "abort", "commit", "abort"]):
        producer.begin_transaction()
        for j in range(3):
            producer.produce(topic, value=f"{outcome}-{i}-{j}".encode(), partition=0)
        producer.flush(30)  # sent before the outcome: an abort then leaves aborted records in the log
        (producer.commit_transaction if outcome == "commit" else producer.abort_transaction)(60)
    b = backend(kafka.bootstrap, topic)
    table, _ = drain(b)
    assert _values(table) == [f"commit-{i}-{j}".encode() for i in (0, 2) for j in range(3)]
    # 12 records and 4 markers take 16 offsets; a range spans offsets, its records are fewer
    assert b.latest(f"{topic}:0") == 16
    planned = b.plan(f"{topic}:0", 0, max_records=5)
    assert (planned.end, planned.records) == (5, 5)
    assert read_range(b, f"{topic}:0", 0, 5).num_rows == 3  # commit-0-*, its marker, then aborted ones
    # read_uncommitted delivers the aborted records too, never the markers
    loose = backend(kafka.bootstrap, topic, **{"kafka.isolation.level": "read_uncommitted"})
    assert len(drain(loose)[0]) == 12


def test_read_committed_plans_no_further_than_an_open_transaction(kafka: ApacheKafka, topic: str) -> None:
    produce(kafka.bootstrap, topic, [b"before"], partition=0)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"open-{topic}"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    produce(kafka.bootstrap, topic, [b"after"], partition=0)
    b = backend(kafka.bootstrap, topic)
    assert b.latest(f"{topic}:0") == 1  # the last stable offset: the open transaction's first record
    assert _values(drain(b)[0]) == [b"before"]
    producer.commit_transaction(60)
    b2 = backend(kafka.bootstrap, topic)
    assert _values(drain(b2)[0]) == [b"before", b"open", b"after"]


def test_a_compacted_topic_replays_fewer_records_and_its_gaps_are_not_data_loss(kafka: ApacheKafka) -> None:
    topic = f"compacted-{time.monotonic_ns()}"
    kafka.create_topic(topic, 1, {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                                  "delete.retention.ms": "100", "min.compaction.lag.ms": "0"})
    produce(kafka.bootstrap, topic, [f"v{i}".encode() for i in range(30)], [f"k{i % 3}" for i in range(30)])
    b = backend(kafka.bootstrap, topic)
    channel = f"{topic}:0"
    first = read_range(b, channel, 0, 30)
    assert first.num_rows == 30
    # Compaction runs on closed segments: roll the active one with more writes until the cleaner removed some.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        produce(kafka.bootstrap, topic, [b"roll"], [b"roller"])
        time.sleep(1)
        again = read_range(b, channel, 0, 30)
        if again.num_rows < 30:
            break
    else:
        pytest.fail("the log cleaner did not compact the topic within 120 s")
    # The replayed range holds fewer records: the superseded ones are gone, the last of each key stays.
    last = {k: v for k, v in zip(first.column("key").to_pylist(), _values(first), strict=True)}
    replayed = dict(zip(again.column("key").to_pylist(), _values(again), strict=True))
    assert replayed == last
    offsets = again.column("offset").to_pylist()
    assert offsets == sorted(offsets) and offsets[-1] == 29
    assert b.earliest(channel) == 0  # the gaps are not retention: nothing is data loss
    assert b.plan(channel, 0).end == b.latest(channel)


def test_retention_makes_an_old_start_data_loss(kafka: ApacheKafka, topic: str) -> None:
    from confluent_kafka import TopicPartition as TP

    produce(kafka.bootstrap, topic, [f"v{i}".encode() for i in range(10)], partition=1)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_records([TP(topic, 1, 6)], request_timeout=30)[TP(topic, 1, 6)].result(timeout=60)
    b = backend(kafka.bootstrap, topic)
    channel = f"{topic}:1"
    assert b.earliest(channel) == 6
    with pytest.raises(DataLossError, match=r"offsets \[2, 6\) are no longer held"):
        b.plan(channel, 2)
    with pytest.raises(DataLossError, match=r"no longer held|out of the partition's range"):
        list(pickle.loads(pickle.dumps(b.reader())).read(channel, 2, 10))
    # failOnDataLoss=false: the planner logs and skips to the earliest offset held
    planner = Planner(b, fail_on_data_loss=False)
    start = {"channels": {f"{topic}:0": {"pos": 0}, channel: {"pos": 2}}}
    end = planner.next(start)
    assert end["channels"][channel] == {"pos": 10, "from": 6}


def test_a_partition_added_mid_stream_is_a_new_channel_after_the_older_ones(kafka: ApacheKafka, topic: str) -> None:
    produce(kafka.bootstrap, topic, [f"a{i}".encode() for i in range(20)], [f"k{i}" for i in range(20)])
    b = backend(kafka.bootstrap, topic)
    planner = Planner(b)
    offset = planner.initial("earliest")
    offset = planner.next(offset, 4)  # a backlog is left in partitions 0 and 1
    kafka.add_partitions(topic, 3)
    produce(kafka.bootstrap, topic, [b"new"], [b"x"], partition=2)
    end = planner.next(offset, 4)
    new = f"{topic}:2"
    entry = end["channels"][new]
    # registered at its first offset, waiting for the older partitions' heads as they were when it appeared
    assert entry["pos"] == 0 and set(entry["after"]) == {f"{topic}:0", f"{topic}:1"}
    seen_new_at = None
    for n in range(30):
        nxt = planner.next(end, 4)
        if nxt == end:
            break
        if nxt["channels"][new]["pos"] > 0 and seen_new_at is None:
            seen_new_at = n
            # by then every record of the older partitions that existed when it appeared was delivered
            assert all(nxt["channels"][f"{topic}:{p}"]["pos"] >= entry["after"][f"{topic}:{p}"]
                       for p in (0, 1))
            assert all(end["channels"][f"{topic}:{p}"]["pos"] >= entry["after"][f"{topic}:{p}"]
                       for p in (0, 1))
        end = nxt
    assert seen_new_at is not None and end["channels"][new] == {"pos": 1}
    # a restarted driver plans the same from the offset: the wait is in the offset, not in memory
    assert "after" not in json.dumps(end)


def test_spark_style_starting_and_ending_offsets(kafka: ApacheKafka, topic: str) -> None:
    produce(kafka.bootstrap, topic, [f"v{i}".encode() for i in range(6)], partition=0)
    produce(kafka.bootstrap, topic, [f"w{i}".encode() for i in range(4)], partition=1)
    b = backend(kafka.bootstrap, topic)
    planner = Planner(b)
    start = planner.initial(json.dumps({topic: {"0": 2, "1": -2}}))
    assert {c: e["pos"] for c, e in start["channels"].items()} == {f"{topic}:0": 2, f"{topic}:1": 0}
    end = planner.batch_end(start, json.dumps({topic: {"0": 5, "1": -1}}))
    assert {c: e["pos"] for c, e in end["channels"].items()} == {f"{topic}:0": 5, f"{topic}:1": 4}
    latest = planner.initial(json.dumps({topic: {"0": -1}}))
    assert latest["channels"][f"{topic}:0"]["pos"] == 6
    with pytest.raises(OptionError, match="startingOffsets"):
        planner.initial(json.dumps({topic: {"zero": 1}}))


def test_subscribe_pattern_and_assign(kafka: ApacheKafka, topic: str) -> None:
    produce(kafka.bootstrap, topic, [b"a", b"b"], partition=1)
    by_pattern = backend(kafka.bootstrap, subscribePattern=topic.split("-")[0] + r"-\d+")
    assert f"{topic}:1" in [c.id for c in by_pattern.list_channels()]
    assigned = backend(kafka.bootstrap, assign=json.dumps({topic: [1]}))
    assert [c.id for c in assigned.list_channels()] == [f"{topic}:1"]
    assert _values(drain(assigned)[0]) == [b"a", b"b"]


def test_offsets_are_committed_to_the_consumer_group_after_a_batch(kafka: ApacheKafka, topic: str) -> None:
    produce(kafka.bootstrap, topic, [b"x"] * 5, partition=0)
    b = backend(kafka.bootstrap, topic, **{"kafka.group.id": f"lag-{topic}"})
    _, ends = drain(b)
    b.acknowledge({c: e["pos"] for c, e in ends[-1]["channels"].items()})
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"lag-{topic}"})
    committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    consumer.close()
    assert [tp.offset for tp in committed] == [5, 0]
    produce(kafka.bootstrap, topic, [b"y"] * 3, partition=0)
    heads = b.heads({f"{topic}:0": 5, f"{topic}:1": 0})
    assert heads[f"{topic}:0"].behind == 3 and heads[f"{topic}:1"].behind == 0


def test_partitions_added_together_take_part_one_after_another(kafka: ApacheKafka, topic: str) -> None:
    """Two partitions added between two batches: the higher-numbered one waits for the lower one's head (keys
    move from partition to partition as the count grows), never the other way round (no deadlock)."""
    planner = Planner(backend(kafka.bootstrap, topic))
    offset = planner.initial("earliest")  # two empty partitions
    kafka.add_partitions(topic, 4)
    produce(kafka.bootstrap, topic, [b"a", b"b"], [b"x", b"y"], partition=2)
    produce(kafka.bootstrap, topic, [b"c"], [b"z"], partition=3)
    p2, p3 = f"{topic}:2", f"{topic}:3"
    end = planner.next(offset, 1)
    assert end["channels"][p3]["after"] == {f"{topic}:0": 0, f"{topic}:1": 0, p2: 2}
    assert p3 not in end["channels"][p2].get("after", {})
    current = end
    for _ in range(10):
        nxt = planner.next(current, 1)
        if nxt == current:
            break
        if nxt["channels"][p3]["pos"] > current["channels"][p3]["pos"]:
            assert current["channels"][p2]["pos"] >= 2, "partition 3 read before partition 2's records"
        current = nxt
    assert current["channels"][p2]["pos"] == 2 and current["channels"][p3]["pos"] == 1


def test_a_read_the_broker_cannot_finish_names_the_partition(kafka: ApacheKafka, topic: str) -> None:
    produce(kafka.bootstrap, topic, [b"only"], partition=1)
    b = backend(kafka.bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "1500"})
    with pytest.raises(FetchTimeoutError, match=rf"channel '{topic}:1'.*offsets \[1, 5\)"):
        list(b.reader().read(f"{topic}:1", 0, 5))


def test_options_name_what_is_wrong() -> None:
    def opts(**extra: Any) -> KafkaOptions:
        return parse(KafkaOptions, options("127.0.0.1:1", "t", **extra), what="backend 'kafka'")

    with pytest.raises(OptionError, match="kafka.bootstrap.servers"):
        parse(KafkaOptions, {"subscribe": "t"}, what="backend 'kafka'")
    with pytest.raises(OptionError, match="exactly one of options 'subscribe', 'subscribePattern', 'assign'"):
        opts(assign='{"t": [0]}')
    with pytest.raises(OptionError, match="kafka.ssl.ca.location"):
        opts(**{"kafka.ssl.truststore.location": "/x.jks"})
    with pytest.raises(OptionError, match="read_committed, read_uncommitted"):
        opts(**{"kafka.isolation.level": "serializable"})
    with pytest.raises(OptionError, match="changeKeys"):
        opts(valueFormat="debezium")
    with pytest.raises(OptionError, match=r"debezium\.unavailableValuePlaceholder.*hexadecimal"):
        opts(valueFormat="debezium", changeKeys="id", **{"debezium.unavailableValuePlaceholder": "hex:zz"})
    # the placeholder the connector was told reaches the executors' decoder: a column holding it is unchanged
    row = json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
                                                                {"name": "s", "type": ["null", "string"]}]})
    told = opts(valueFormat="debezium", changeKeys="id", valueSchema=row,
                **{"debezium.unavailableValuePlaceholder": "hex:2d2d"})
    decoder = pickle.loads(pickle.dumps(KafkaRangeReader(told, row)))._decoder()
    update = decoder.decode(b'{"op": "u", "after": {"id": 1, "s": "--"}}', 0)
    assert update is not None and (update.values, update.unchanged) == ([1, None], ["s"])
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="cdc" '
            'password="s3cr3t-pw";')
    o = opts(**{"kafka.sasl.jaas.config": jaas, "kafka.sasl.mechanism": "SCRAM-SHA-512"})
    assert o.setting("sasl.username") == "cdc" and o.setting("sasl.password") == "s3cr3t-pw"
    assert "s3cr3t-pw" not in repr(o) and "s3cr3t-pw" not in str(o.model_dump())
    # Spark's maxOffsetsPerTrigger is the source's record budget
    source, _ = split_and_parse({**options("127.0.0.1:1", "t"), "maxOffsetsPerTrigger": "7"}, KafkaOptions, "kafka")
    assert source.max_records_per_trigger == 7
    # a setting librdkafka does not know fails naming it, not its value
    from cdc.backends.kafka.connection import consumer

    with pytest.raises(OptionError, match=r"'kafka.no.such.setting'") as err:
        consumer(opts(**{"kafka.no.such.setting": "v4lue"}))
    assert "v4lue" not in str(err.value)


def test_starting_timestamp_starts_each_partition_at_its_first_record_at_or_after_it(kafka: ApacheKafka,
                                                                                    topic: str) -> None:
    from datetime import UTC, datetime

    base = int(time.time() * 1000) - 60_000  # record timestamps the producer sets (CreateTime), a minute ago
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    failed: list[Any] = []
    for i, (partition, ms) in enumerate([(0, base), (0, base + 10), (0, base + 20), (1, base + 5)]):
        p.produce(topic, value=f"v{i}".encode(), partition=partition, timestamp=ms,
                  on_delivery=lambda err, _: failed.append(err) if err else None)
    assert p.flush(30) == 0 and not failed, failed
    planner = Planner(backend(kafka.bootstrap, topic))
    start = planner.initial("earliest", at=datetime.fromtimestamp((base + 10) / 1000, UTC))
    # partition 0 from its record at base+10; partition 1 holds none at or after it: its head
    assert {c: e["pos"] for c, e in start["channels"].items()} == {f"{topic}:0": 1, f"{topic}:1": 1}


def test_a_malformed_event_fails_naming_its_offset_or_is_quarantined_whole(kafka: ApacheKafka, topic: str) -> None:
    row = json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]})
    good = json.dumps({"op": "c", "after": {"id": 1}}).encode()
    produce(kafka.bootstrap, topic, [good, b'{"op": "c", "after": {"id": "not a number"', good], [b"a", b"bad", b"c"],
            partition=0)
    debezium = {"valueFormat": "debezium", "changeKeys": "id", "valueSchema": row}
    with pytest.raises(MalformedRecordError, match=rf"channel '{topic}:0' offset 1 \(key b'bad'\)"):
        drain(backend(kafka.bootstrap, topic, **debezium))
    quarantine = f"{topic}-quarantine"
    kafka.create_topic(quarantine, 1)
    table, _ = drain(backend(kafka.bootstrap, topic, onMalformed="quarantine", quarantineTopic=quarantine, **debezium))
    assert table.column("_position").to_pylist() == [0, 2]  # nothing else lost
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"q-{topic}", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(quarantine, 0, 0)])
    m = c.poll(30)
    c.close()
    assert m is not None and m.error() is None and m.key() == b"bad" and m.value().startswith(b'{"op": "c"')
    headers = dict(m.headers() or [])
    assert (headers["cdc.topic"], headers["cdc.partition"], headers["cdc.offset"]) == (topic.encode(), b"0", b"1")
    kafka.delete_topic(quarantine)
