"""Producing to the session's Kafka and reading through the backend as the planner and executors do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from confluent_kafka import Producer

from cdc.backends.kafka import KafkaBackend, KafkaOptions
from cdc.options import parse
from cdc.testing.harness import batches

_open: list[KafkaBackend] = []


def options(bootstrap: str, topic: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kafka.bootstrap.servers": bootstrap}
    if topic is not None:
        out["subscribe"] = topic
    return out | extra


def backend(bootstrap: str, topic: str | None = None, **extra: Any) -> KafkaBackend:
    b = KafkaBackend(parse(KafkaOptions, options(bootstrap, topic, **extra), what="backend 'kafka'"))
    _open.append(b)
    return b


def close_all() -> None:
    while _open:
        _open.pop().close()


def produce(bootstrap: str, topic: str, values: Sequence[bytes | None], keys: Sequence[str | bytes | None] | None = None,
            partition: int | None = None, **config: Any) -> None:
    """Send ``values`` (keys route them to partitions), and wait until the broker acknowledged every one."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, **config})
    failed: list[Any] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)

    for i, value in enumerate(values):
        key = keys[i] if keys is not None else None
        kwargs: dict[str, Any] = {"value": value, "key": key, "on_delivery": done}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failed, failed[:3]


def drain(b: KafkaBackend, limit: int | None = None) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Every batch the planner makes from earliest, read through a pickled reader; the records and each
    batch's end offset."""
    tables, ends = [], []
    for end, table in batches(b, limit=limit):
        tables.append(table)
        ends.append(end)
    return (pa.concat_tables(tables) if tables else b.schema().empty_table()), ends
