"""Lag per channel on the Pulsar backend against a known backlog (Apache Pulsar standalone: the admin API's
subscription stats are what pulsar-lite does not serve)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cdc.backends.pulsar.positions import key_of
from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.helpers import backend, produce
from tests.streaming import wait_for

pytestmark = pytest.mark.slow


def test_heads_carry_the_subscription_backlog(apache_pulsar: ApachePulsar) -> None:
    topic = f"persistent://public/default/lag-{uuid.uuid4().hex[:8]}"
    apache_pulsar.create_partitioned_topic(topic, 2)
    ids: list[Any] = []
    for p in (0, 1):
        ids += produce(apache_pulsar.url, f"{topic}-partition-{p}", [f"p{p}-{i}".encode() for i in range(20)])
    b = backend(apache_pulsar.url, topic, **{"admin.url": apache_pulsar.admin_url})
    channels = [c.id for c in b.list_channels()]
    positions = {channels[0]: list(key_of(ids[4])), channels[1]: list(key_of(ids[20 + 11]))}
    b.acknowledge(positions)
    expected = {channels[0]: 15.0, channels[1]: 8.0}

    def backlog_seen() -> dict[str, float]:
        return {cid: h.measures.get("backlog", -1.0) for cid, h in b.heads(positions).items()}

    wait_for(
        lambda: backlog_seen() == expected,
        20,
        f"backlog {expected} in the heads (last seen {backlog_seen()})",
    )
    heads = b.heads(positions)
    assert [heads[c].head for c in channels] == [b.latest(c) for c in channels]
    # partitions read as topics: planning counts lazily, so records behind are unknown, not understated
    assert b.partition_mode and all(h.behind is None for h in heads.values())
