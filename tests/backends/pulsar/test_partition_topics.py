"""``reader.topic=partition`` (what ``auto`` picks on Apache Pulsar): partitions read as topics of their own,
and planning without a record budget that asks each partition for its last message id instead of reading
every id. On the session's Apache Pulsar standalone, heads through the durable subscription's consumers and
through the real admin API; on pulsar-lite, what only it does: answer a partition as a partitioned topic
of its own (``auto`` then picks ``parent``; ``partition`` is a clear error)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.backends.pulsar import PulsarBackend
from cdc.backends.pulsar.connection import Channel
from cdc.errors import OptionError
from cdc.planner import Planner
from cdc.servers.pulsar import ApachePulsar, EmbeddedBroker
from tests.backends.pulsar.helpers import backend, drain, produce

Key = tuple[int, int, int]


@pytest.fixture
def partition_broker(apache_pulsar: ApachePulsar) -> ApachePulsar:
    return apache_pulsar


@pytest.fixture
def partitioned(topic: str) -> str:
    return topic  # conftest's topic has 2 partitions


def last_ids(ids: list[Any]) -> dict[int, Key]:
    out: dict[int, Key] = {}
    for mid in ids:
        k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        out[mid.partition()] = max(out.get(mid.partition(), (-1, -1, -1)), k)
    return out


def read_all(b: PulsarBackend, channel: str, start: Any, end: Any) -> list[bytes]:
    return [v for batch in b.reader().read(channel, start, end) for v in batch.column("value").to_pylist()]


def test_heads_come_from_the_broker_not_from_reading_ids(partition_broker: ApachePulsar, partitioned: str) -> None:
    url = partition_broker.url
    payloads = [f"m{i}".encode() for i in range(300)]
    ids = produce(url, partitioned, payloads[:200], [f"k{i % 7}" for i in range(200)], batching=True)
    ids += produce(url, partitioned, payloads[200:], [f"k{i % 7}" for i in range(100)], batching=False)
    expected = last_ids(ids)
    b = backend(url, partitioned)
    channels = b.list_channels()
    assert [c.id for c in channels] == [f"{partitioned}-partition-{p}" for p in (0, 1)]
    got: list[bytes] = []
    for ch in channels:
        p = Channel.parse(ch.id).partition
        assert tuple(b.latest(ch.id)) == expected[p]  # exact, batch index included
        start = b.earliest(ch.id)
        planned = b.plan(ch.id, start)
        assert tuple(planned.end) == expected[p] and planned.records >= 1
        got += read_all(b, ch.id, start, planned.end)
    assert sorted(got) == sorted(payloads)
    assert b._indexes == {}  # no message id was read on the driver

    # With a record budget the plan is exact: the ids the budget needs are read from the start on the
    # partition's topic (cdc.backends.pulsar.budget), not the topic-wide index.
    ch = channels[0].id
    budgeted = b.plan(ch, b.earliest(ch), max_records=7)
    assert budgeted.records == 7 and len(read_all(b, ch, b.earliest(ch), budgeted.end)) == 7
    assert b._indexes == {} and b._budget.delivered >= 7


def test_batched_heads_resolve_to_the_last_message_of_the_entry(partition_broker: ApachePulsar,
                                                                  partitioned: str) -> None:
    """The head inside a batch is a real message id (Apache Pulsar answers the batch index; a broker that
    leaves it out gets that one entry read), so an executor stops there (no wait for more)."""
    ids = produce(partition_broker.url, partitioned, [b"x"] * 48, ["same-key"] * 48, batching=True)
    (p, head), = last_ids(ids).items()
    assert head[2] > 0  # the last message sits inside a batch (the helper batches 7 messages)
    b = backend(partition_broker.url, partitioned, pollTimeoutMs=3000)
    b.list_channels()
    assert tuple(b.latest(f"{partitioned}-partition-{p}")) == head
    table, offset = drain(b)
    assert table.num_rows == 48
    # Nothing new: the next round plans nothing, at once.
    again, _ = drain(b, offset)
    assert again.num_rows == 0


def test_empty_partitions_and_later_messages(partition_broker: ApachePulsar, partitioned: str) -> None:
    b = backend(partition_broker.url, partitioned)
    planner = Planner(b)
    start = planner.initial("latest")
    empty, offset = drain(b, start)
    assert empty.num_rows == 0
    produce(partition_broker.url, partitioned, [b"a", b"b", b"c"], ["x", "y", "z"])
    later, _ = drain(b, offset)
    assert sorted(later.column("value").to_pylist()) == [b"a", b"b", b"c"]


def test_heads_through_the_admin_api(partition_broker: ApachePulsar, partitioned: str) -> None:
    """With admin.url, heads come from GET .../lastMessageId: no subscription exists before the first commit."""
    ids = produce(partition_broker.url, partitioned, [b"v"] * 40, [f"k{i}" for i in range(40)], batching=True)
    heads = last_ids(ids)
    b = backend(partition_broker.url, partitioned, **{"admin.url": partition_broker.admin_url})
    for ch in b.list_channels():
        assert tuple(b.latest(ch.id)) == heads[Channel.parse(ch.id).partition]
    assert not b._subscription._consumers
    table, _ = drain(b)
    assert table.num_rows == 40


def test_on_a_broker_that_does_not_serve_partitions_auto_reads_parents_and_partition_is_a_clear_error(
    lite_topic: str
) -> None:
    """pulsar-lite with default_partitions > 0 answers <topic>-partition-N as a new partitioned topic."""
    with EmbeddedBroker(partitions=2) as lite:
        produce(lite.url, lite_topic, [b"a", b"b", b"c"], ["k", "l", "m"])
        b = backend(lite.url, lite_topic, **{"reader.topic": "partition"})
        with pytest.raises(OptionError, match=r"reader.topic.*serves each partition as a topic.*auto, parent, partition"):
            b.list_channels()
        auto = backend(lite.url, lite_topic, receiverQueueSize=20000, reopenAfterMs=500)
        table, _ = drain(auto)
        assert sorted(table.column("value").to_pylist()) == [b"a", b"b", b"c"]
        assert not auto.partition_mode


def test_byte_budget_estimate_without_an_index_yet(partition_broker: ApachePulsar, partitioned: str) -> None:
    """maxBytesPerTrigger asks for an estimate before a batch is planned (also right after a restart, when
    this mode has built no id index): the estimate reads the ids then, rather than answering 'none yet'."""
    produce(partition_broker.url, partitioned, [b"z" * 250] * 20, [f"k{i}" for i in range(20)])
    b = backend(partition_broker.url, partitioned)
    assert b.average_record_bytes() == 250.0
