"""Acknowledgement: the query's durable subscription, advanced to the positions Spark committed.

Best effort (rule 4 of the backend contract): correctness never depends on it; it lets the broker's
retention and backlog metrics see how far the query is.

When the broker serves partitions as topics (Apache Pulsar), the driver subscribes each partition's topic
on its own and keeps those consumers for the query: they also answer ``getLastMessageId`` for planning
(:mod:`cdc.backends.pulsar.heads`), so no subscription is made per planning round. A subscription is one
cursor per partition on the broker either way, so subscribing a partition or its parent topic is the same
subscription.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from cdc.backends.pulsar.connection import Channel
from cdc.backends.pulsar.positions import Key

log = logging.getLogger(__name__)


class Subscription:
    """The query's durable subscription (``subscription.name``) on each of its (parent) topics."""

    def __init__(self, client: Callable[[], Any], name: str) -> None:
        self._client = client  # the backend's client, opened on first use
        self.name = name
        self._consumers: dict[str, Any] = {}
        self.per_partition = False  # subscribe each partition's topic (set once the broker is known to serve them)

    def advance(self, keys: Mapping[Channel, Key]) -> None:
        """Acknowledge every message up to each key, cumulatively.

        A position inside a batch acknowledges up to the entry before it (an entry is acknowledged whole),
        so the backlog may show one batch more than was processed, never less.
        """
        import _pulsar  # type: ignore[import-not-found]

        for ch, (ledger, entry, batch) in keys.items():
            if batch != -1:
                entry -= 1
            if ledger < 0 or entry < 0:
                continue
            mid = _pulsar.MessageId(max(ch.partition, -1), ledger, entry, -1)
            mid.topic_name(ch.id)
            self.consumer(ch).acknowledge_cumulative(mid)

    def last_message_id(self, ch: Channel) -> tuple[int, int, int]:
        """``getLastMessageId`` of one partition through its consumer (``per_partition`` only)."""
        mid = self.consumer(ch).get_last_message_id()
        return (mid.ledger_id(), mid.entry_id(), mid.batch_index())

    def consumer(self, ch: Channel) -> Any:
        """The subscription's consumer of the channel's partition topic (``per_partition``), else of its
        parent topic; opened on first use and kept (it reconnects by itself after a broker restart)."""
        import pulsar

        topic = ch.id if self.per_partition else ch.topic
        consumer = self._consumers.get(topic)
        if consumer is None:
            # Failover, not Exclusive: a driver restarted before the broker noticed the old one died (or a
            # second instance of the source in one process) must not be refused with ConsumerBusy, which would
            # leave the partition without a head and plan nothing. Cumulative acknowledgement works the same.
            consumer = self._consumers[topic] = self._client().subscribe(
                topic,
                self.name,
                consumer_type=pulsar.ConsumerType.Failover,
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=1,
            )
        return consumer

    def close(self) -> None:
        for consumer in self._consumers.values():
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - the C++ core raises its own types
                log.debug("closing the subscription consumer failed", exc_info=True)
        self._consumers.clear()
