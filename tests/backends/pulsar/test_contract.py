"""The shared backend contract over real brokers, with default options. On Apache Pulsar standalone (one broker
per session): partitioned topics made through the admin API, read partition by partition with heads from the
durable subscription's consumers, or from ``admin.url``; a non-partitioned topic. On pulsar-lite, what
``auto`` picks there only: its auto-created partitioned topics read through the parent topic (the driver's
message-id index ends every batch)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from cdc.backend import Backend
from cdc.backends.pulsar import PulsarBackend, PulsarOptions
from cdc.backends.pulsar.connection import open_client
from cdc.servers.pulsar import ApachePulsar, EmbeddedBroker
from cdc.testing import BackendContract, Harness

_topics = itertools.count()


class PulsarHarness(Harness):
    """Produces to one topic; keys route messages to partitions (Pulsar's partitions never split/merge)."""

    supports_split = False
    supports_merge = False
    identity_columns = ("__topic", "__messageId")
    order_columns = None  # raw messages carry no change-model sequence

    def __init__(
        self, broker: EmbeddedBroker | ApachePulsar, batching: bool, *, partitioned: bool, admin: bool = False
    ) -> None:
        self.broker = broker
        self.topic = f"persistent://public/default/contract-{next(_topics)}-{'b' if batching else 'n'}"
        self.options: dict[str, Any] = {"service.url": broker.url, "topic": self.topic, "catchUpMs": 150}
        if isinstance(broker, ApachePulsar):
            if partitioned:
                broker.create_partitioned_topic(self.topic, 2)  # auto-created topics are not partitioned
            # Heads from the broker: batches without a record budget end at the partitions' last ids.
            self.exact_counts_without_budget = False
            if admin:
                self.options["admin.url"] = broker.admin_url
        else:
            self.options.update(receiverQueueSize=20000, reopenAfterMs=500)  # see the option's description
        self.client = open_client(broker.url)
        # Blocking when the send queue is full: Apache Pulsar otherwise fails the sends beyond
        # max_pending_messages (ProducerQueueIsFull, in the callback) instead of waiting.
        self.producer = self.client.create_producer(
            self.topic, batching_enabled=batching, batching_max_messages=4, batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
        )
        self.next_id = 0
        self._backends: list[Backend] = []

    def backend(self) -> Backend:
        b = PulsarBackend(PulsarOptions.model_validate(self.options))
        self._backends.append(b)
        return b

    def append(self, n: int, channel: str | None = None) -> None:
        done: list[Any] = []
        for i in range(self.next_id, self.next_id + n):
            self.producer.send_async(f"v{i}".encode(), lambda res, mid: done.append(res), partition_key=f"k{i}")
        self.producer.flush()
        self.next_id += n
        assert done == [pulsar.Result.Ok] * n, done[:3]

    def close(self) -> None:
        for b in self._backends:
            b.close()
        self.producer.close()
        self.client.close()


@pytest.fixture(scope="module")
def lite_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(partitions=2) as b:
        yield b


@pytest.fixture(params=["apache-partitioned-batching", "apache-partitioned-admin", "apache-non-partitioned",
                        "lite-partitioned-batching"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    kind: str = request.param
    # Brokers are looked up per case, so a run of pulsar-lite cases alone never starts Apache Pulsar.
    broker: EmbeddedBroker | ApachePulsar = request.getfixturevalue(
        "apache_pulsar" if kind.startswith("apache-") else "lite_broker"
    )
    h = PulsarHarness(broker, batching="batching" in kind, partitioned="-partitioned" in kind, admin="admin" in kind)
    yield h
    h.close()


class TestPulsarContract(BackendContract):
    pass
