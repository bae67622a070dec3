"""The shared backend contract on Apache Kafka (the session's KRaft broker): a topic of 2 partitions, keys
routing records to them; the default read_committed isolation."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from cdc.backend import Backend
from cdc.backends.kafka import KafkaBackend, KafkaOptions
from cdc.options import parse
from cdc.servers.kafka import ApacheKafka
from cdc.testing import BackendContract, Harness

_topics = itertools.count()


class KafkaHarness(Harness):
    """Produces to one topic (Kafka's partitions never split or merge)."""

    supports_split = False
    supports_merge = False
    identity_columns = ("topic", "partition", "offset")
    order_columns = None  # raw messages carry no change-model sequence

    def __init__(self, kafka: ApacheKafka) -> None:
        self.kafka = kafka
        self.topic = f"contract-{next(_topics)}"
        kafka.create_topic(self.topic, 2)
        self.options: dict[str, Any] = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": self.topic}
        self.producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 2, "enable.idempotence": True})
        self.next_id = 0
        self._backends: list[Backend] = []

    def backend(self) -> Backend:
        b = KafkaBackend(parse(KafkaOptions, self.options, what="backend 'kafka'"))
        self._backends.append(b)
        return b

    def append(self, n: int, channel: str | None = None) -> None:
        for i in range(self.next_id, self.next_id + n):
            self.producer.produce(self.topic, value=f"v{i}".encode(), key=f"k{i}".encode())
        assert self.producer.flush(60) == 0
        self.next_id += n

    def close(self) -> None:
        for b in self._backends:
            b.close()
        del self.producer  # confluent-kafka destroys its client with the last reference
        self.kafka.delete_topic(self.topic)  # a lean broker restarts sooner (the histories kill it)


@pytest.fixture
def harness(apache_kafka: ApacheKafka) -> Iterator[Harness]:
    h = KafkaHarness(apache_kafka)
    yield h
    h.close()


class TestKafkaContract(BackendContract):
    pass
