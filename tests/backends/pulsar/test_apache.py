"""What Apache Pulsar gives the backend by default (one standalone broker per session, fresh topics per test):
the fast path picked without options, heads asked without a subscription per planning round, and the durable
subscription's backlog from the admin API."""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import pytest

from cdc.backends.pulsar.positions import key_of
from cdc.errors import OptionError
from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.helpers import backend, drain, produce
from tests.streaming import wait_for


@pytest.fixture
def partitioned(apache_pulsar: ApachePulsar) -> str:
    topic = f"persistent://public/default/apache-{uuid.uuid4().hex[:8]}"
    apache_pulsar.create_partitioned_topic(topic, 2)
    return topic


def _subscriptions(broker: ApachePulsar, partition_topic: str) -> list[str]:
    rest = partition_topic.split("://", 1)[1]
    with urllib.request.urlopen(f"{broker.admin_url}/admin/v2/persistent/{rest}/subscriptions", timeout=30) as r:
        answer: list[str] = json.loads(r.read())
    return answer


def test_default_options_read_partitions_as_topics_with_heads_from_the_broker(
    apache_pulsar: ApachePulsar, partitioned: str
) -> None:
    """Only service.url and topic: the backend detects that the broker serves partitions as topics, plans each
    batch at the partitions' last ids (no id index on the driver) through the durable subscription's consumers,
    which it keeps: several planning rounds leave one subscription per partition, the durable one."""
    produce(apache_pulsar.url, partitioned, [f"m{i}".encode() for i in range(60)], [f"k{i}" for i in range(60)],
            batching=True)
    b = backend(apache_pulsar.url, partitioned)
    table, offset = drain(b)
    assert sorted(table.column("value").to_pylist()) == sorted(f"m{i}".encode() for i in range(60))
    assert b.partition_mode and not b._indexes, "planning read message ids instead of asking for heads"
    produce(apache_pulsar.url, partitioned, [b"late"], ["k1"])
    more, _ = drain(b, offset)
    assert more.column("value").to_pylist() == [b"late"]
    for p in (0, 1):
        assert _subscriptions(apache_pulsar, f"{partitioned}-partition-{p}") == [b.options.subscription()]


def test_backlog_per_partition(apache_pulsar: ApachePulsar, partitioned: str) -> None:
    """A known backlog: 20 messages per partition, the subscription acknowledged up to the 5th of partition 0
    and the 12th of partition 1."""
    ids: list[Any] = []
    for p in (0, 1):
        # Keys chosen by the partition the producer routes them to: Pulsar hashes keys (Murmur3).
        ids += produce(apache_pulsar.url, f"{partitioned}-partition-{p}", [f"p{p}-{i}".encode() for i in range(20)])
    b = backend(apache_pulsar.url, partitioned, **{"admin.url": apache_pulsar.admin_url})
    channels = [c.id for c in b.list_channels()]
    b.acknowledge({channels[0]: list(key_of(ids[4])), channels[1]: list(key_of(ids[20 + 11]))})
    expected = {channels[0]: 15, channels[1]: 8}
    wait_for(lambda: b.backlog() == expected, 20, f"backlog {expected} (last seen {b.backlog()})")


def test_backlog_needs_admin_url(apache_pulsar: ApachePulsar, partitioned: str) -> None:
    with pytest.raises(OptionError, match="admin.url"):
        backend(apache_pulsar.url, partitioned).backlog()

