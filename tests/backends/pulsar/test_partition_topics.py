"""``reader.topic=partition``: partitions read as topics of their own, and planning without a record budget
that asks each partition for its last message id instead of reading every id.

pulsar-lite serves a partition as a topic (``<topic>-partition-N``) when its auto-created topics are not
partitioned, Apache Pulsar's default too; its partitioned topics are then made with
:meth:`EmbeddedBroker.create_partitioned_topic`. The admin API's ``lastMessageId`` (pulsar-lite has none) is
served on loopback with answers in the documented form, naming ids of the real broker's messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.backends.pulsar import PulsarBackend
from cdc.backends.pulsar.client import Channel
from cdc.errors import OptionError
from cdc.planner import Planner
from cdc.servers.pulsar import EmbeddedBroker
from tests.backends.pulsar.admin_api import RecordedAdmin, serve_admin
from tests.backends.pulsar.helpers import backend, drain, produce

Key = tuple[int, int, int]


@pytest.fixture
def admin_api() -> Iterator[type[RecordedAdmin]]:
    with serve_admin() as handler:
        yield handler


@pytest.fixture(scope="module")
def partition_broker() -> Iterator[EmbeddedBroker]:
    """Like conftest's plain_broker, but this module's own: create_partitioned_topic restarts it."""
    with EmbeddedBroker(partitions=0) as b:
        yield b


@pytest.fixture
def partitioned(partition_broker: EmbeddedBroker, topic: str) -> str:
    partition_broker.create_partitioned_topic(topic, 2)
    return topic


def last_ids(ids: list[Any]) -> dict[int, Key]:
    out: dict[int, Key] = {}
    for mid in ids:
        k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        out[mid.partition()] = max(out.get(mid.partition(), (-1, -1, -1)), k)
    return out


def read_all(b: PulsarBackend, channel: str, start: Any, end: Any) -> list[bytes]:
    return [v for batch in b.reader().read(channel, start, end) for v in batch.column("value").to_pylist()]


def test_heads_come_from_the_broker_not_from_reading_ids(partition_broker: EmbeddedBroker, partitioned: str) -> None:
    url = partition_broker.url
    payloads = [f"m{i}".encode() for i in range(300)]
    ids = produce(url, partitioned, payloads[:200], [f"k{i % 7}" for i in range(200)], batching=True)
    ids += produce(url, partitioned, payloads[200:], [f"k{i % 7}" for i in range(100)], batching=False)
    expected = last_ids(ids)
    b = backend(url, partitioned, **{"reader.topic": "partition"})
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

    # With a record budget the plan is exact: ids are read (the index), counts are exact.
    ch = channels[0].id
    budgeted = b.plan(ch, b.earliest(ch), max_records=7)
    assert budgeted.records == 7 and len(read_all(b, ch, b.earliest(ch), budgeted.end)) == 7
    assert partitioned in b._indexes


def test_batched_heads_resolve_to_the_last_message_of_the_entry(partition_broker: EmbeddedBroker,
                                                                  partitioned: str) -> None:
    """pulsar-lite answers getLastMessageId without the batch index: the head is resolved by reading that
    one entry, so a range ends on a real message id and an executor stops there (no wait for more)."""
    ids = produce(partition_broker.url, partitioned, [b"x"] * 48, ["same-key"] * 48, batching=True)
    (p, head), = last_ids(ids).items()
    assert head[2] > 0  # the last message sits inside a batch (the helper batches 7 messages)
    b = backend(partition_broker.url, partitioned, **{"reader.topic": "partition", "pollTimeoutMs": 3000})
    b.list_channels()
    assert tuple(b.latest(f"{partitioned}-partition-{p}")) == head
    table, offset = drain(b)
    assert table.num_rows == 48
    # Nothing new: the next round plans nothing, at once.
    again, _ = drain(b, offset)
    assert again.num_rows == 0


def test_empty_partitions_and_later_messages(partition_broker: EmbeddedBroker, partitioned: str) -> None:
    b = backend(partition_broker.url, partitioned, **{"reader.topic": "partition"})
    planner = Planner(b)
    start = planner.initial("latest")
    empty, offset = drain(b, start)
    assert empty.num_rows == 0
    produce(partition_broker.url, partitioned, [b"a", b"b", b"c"], ["x", "y", "z"])
    later, _ = drain(b, offset)
    assert sorted(later.column("value").to_pylist()) == [b"a", b"b", b"c"]


def test_heads_through_the_admin_api(partition_broker: EmbeddedBroker, partitioned: str, admin_api: Any) -> None:
    """With admin.url, heads come from GET .../lastMessageId (no subscription is made); a batch index of -1
    in the answer is resolved by reading that entry, one given is used as it is."""
    ids = produce(partition_broker.url, partitioned, [b"v"] * 40, [f"k{i}" for i in range(40)], batching=True)
    heads = last_ids(ids)
    rest = partitioned.split("://", 1)[1]
    for p, (ledger, entry, batch) in heads.items():
        answer = {"ledgerId": ledger, "entryId": entry, "partitionIndex": p, "batchIndex": batch if p == 0 else -1}
        admin_api.responses[f"/admin/v2/persistent/{rest}-partition-{p}/lastMessageId"] = answer
    b = backend(partition_broker.url, partitioned, **{"reader.topic": "partition", "admin.url": admin_api.url})
    for ch in b.list_channels():
        assert tuple(b.latest(ch.id)) == heads[Channel.parse(ch.id).partition]
    assert sorted(path for path, _ in admin_api.seen) == sorted(
        f"/admin/v2/persistent/{rest}-partition-{p}/lastMessageId" for p in heads
    )
    table, _ = drain(b)
    assert table.num_rows == 40


def test_partition_mode_on_a_broker_that_does_not_serve_partitions_is_a_clear_error(
    broker: EmbeddedBroker, topic: str
) -> None:
    """pulsar-lite with default_partitions > 0 answers <topic>-partition-N as a new partitioned topic."""
    produce(broker.url, topic, [b"a"], ["k"])
    b = backend(broker.url, topic, **{"reader.topic": "partition"})
    with pytest.raises(OptionError, match=r"reader.topic.*serves each partition as a topic.*parent, partition"):
        b.list_channels()


def test_byte_budget_estimate_without_an_index_yet(partition_broker: EmbeddedBroker, partitioned: str) -> None:
    """maxBytesPerTrigger asks for an estimate before a batch is planned (also right after a restart, when
    this mode has built no id index): the estimate reads the ids then, rather than answering 'none yet'."""
    produce(partition_broker.url, partitioned, [b"z" * 250] * 20, [f"k{i}" for i in range(20)])
    b = backend(partition_broker.url, partitioned, **{"reader.topic": "partition"})
    assert b.average_record_bytes() == 250.0
