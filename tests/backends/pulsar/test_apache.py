"""What Apache Pulsar gives the backend by default (one standalone broker per session, fresh topics per test):
the fast path picked without options, heads asked without a subscription per planning round, and the durable
subscription's backlog from the admin API."""

from __future__ import annotations

import json
import time
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



def test_first_batch_after_a_driver_restart_costs_its_budget_not_the_backlog(
    apache_pulsar: ApachePulsar, partitioned: str
) -> None:
    """A driver restarted over a backlog plans its first budgeted batch by reading about the budget's message
    ids from the stored offset, not every id of the topic (the id index read them all before the first plan:
    13-48 s measured on a large topic); each plan is exact, and every message is planned once."""
    from cdc.planner import Planner

    n, budget = 6000, 500
    produce(apache_pulsar.url, partitioned, [f"m{i}".encode() for i in range(n)], [f"k{i % 13}" for i in range(n)],
            batching=True)
    first = backend(apache_pulsar.url, partitioned, receiverQueueSize=100)
    planner = Planner(first)
    start = planner.initial("earliest")
    stored = planner.next(start, budget)  # the batch the first driver planned, then it was killed
    assert planner.last_records == budget
    first.close()

    restarted = backend(apache_pulsar.url, partitioned, receiverQueueSize=100)
    planner = Planner(restarted)
    began = time.monotonic()
    end = planner.next(stored, budget)
    assert time.monotonic() - began < 10, "far under the 30 s operation timeout"
    assert planner.last_records == budget
    read_on_driver = restarted._budget.delivered + sum(i.indexed for i in restarted._indexes.values())
    assert read_on_driver <= budget + 2 * 100 + 2 * 7, f"the driver read {read_on_driver} messages for {budget}"
    # the batches from the stored offset cover the rest exactly once
    reader, total, offset = restarted.reader(), 0, end
    for r in Planner.ranges(stored, end):
        total += sum(b.num_rows for b in reader.read(r.channel, r.start, r.end))
    while planner.last_records:
        nxt = planner.next(offset, budget)
        assert planner.last_records <= budget
        total += sum(b.num_rows for r in Planner.ranges(offset, nxt) for b in reader.read(r.channel, r.start, r.end))
        offset = nxt
    assert total == n - budget


def test_a_byte_budget_after_a_driver_restart_costs_its_budget_not_the_backlog(
    apache_pulsar: ApachePulsar, partitioned: str
) -> None:
    """maxBytesPerTrigger, through the source as Spark drives it: the record size comes from a sample at each
    partition's start before the first plan, then from the messages the budgets read; no id index is built
    (it read every id of the topic first), so a restarted driver's first batch costs its budget."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from cdc.backends.pulsar.backend import SIZE_SAMPLE
    from cdc.source import CdcStreamReader, _Config

    n, size, budget, queue = 6000, 200, 500, 100
    produce(apache_pulsar.url, partitioned, [f"{i:0{size}d}".encode() for i in range(n)],
            [f"k{i % 13}" for i in range(n)], batching=True)
    config = _Config({"backend": "pulsar", "service.url": apache_pulsar.url, "topic": partitioned,
                      "receiverQueueSize": str(queue), "maxBytesPerTrigger": str(budget * size)})
    schema = from_arrow_schema(backend(apache_pulsar.url, partitioned).schema())

    first = CdcStreamReader(config, schema)
    stored = first.latestOffset(first.initialOffset(), ReadAllAvailable())  # then this driver was killed
    assert first.planner.last_records == budget
    first.backend.close()

    restarted = CdcStreamReader(config, schema)
    began = time.monotonic()
    end = restarted.latestOffset(stored, ReadAllAvailable())
    assert time.monotonic() - began < 10, "far under the 30 s operation timeout"
    assert restarted.planner.last_records == budget  # 200-byte payloads: the estimate is exact
    b: Any = restarted.backend
    try:
        read_on_driver = b._budget.delivered + sum(i.indexed for i in b._indexes.values())
        assert read_on_driver <= 2 * SIZE_SAMPLE + budget + 2 * queue + 2 * 7, (
            f"the driver read {read_on_driver} messages for {budget}")
        assert restarted.latestOffset(end, ReadAllAvailable()) != end and restarted.planner.last_records == budget
    finally:
        b.close()
