"""Producing and draining helpers shared by the Pulsar tests (real broker, no mocks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulsar
import pyarrow as pa

from cdc.backends.pulsar import PulsarBackend, PulsarOptions
from cdc.backends.pulsar.connection import open_client
from cdc.planner import Planner
from cdc.testing import batches


def produce(
    url: str,
    topic: str,
    payloads: Sequence[bytes],
    keys: Sequence[str | None] | None = None,
    *,
    batching: bool = False,
    properties: dict[str, str] | None = None,
    event_ms: int | None = None,
) -> list[Any]:
    """Send and wait for every message; returns their message ids."""
    client = open_client(url)
    try:
        producer = client.create_producer(
            topic, batching_enabled=batching, batching_max_messages=7, batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
        )
        # Callbacks complete in broker order, not send order (partitions answer independently): keep each
        # id at its message's index.
        ids: list[Any] = [None] * len(payloads)

        def done(i: int) -> Any:
            return lambda res, mid: ids.__setitem__(i, (res, mid))

        for i, payload in enumerate(payloads):
            kwargs: dict[str, Any] = {}
            if keys is not None and keys[i] is not None:
                kwargs["partition_key"] = keys[i]
            if properties:
                kwargs["properties"] = properties
            if event_ms is not None:
                kwargs["event_timestamp"] = event_ms
            producer.send_async(payload, done(i), **kwargs)
        producer.flush()
        producer.close()
        assert all(x is not None and x[0] == pulsar.Result.Ok for x in ids), ids[:3]
        return [m for _, m in ids]
    finally:
        client.close()


OPEN: list[PulsarBackend] = []


def backend(url: str, topic: str | None, **extra: Any) -> PulsarBackend:
    """A backend over ``topic``; closed after the test (see the autouse fixture in conftest)."""
    raw = {"service.url": url, "catchUpMs": 150, "pollTimeoutMs": 20000, **extra}
    if topic is not None:
        raw["topic"] = topic
    b = PulsarBackend(PulsarOptions.model_validate(raw))
    OPEN.append(b)
    return b


def close_all() -> None:
    while OPEN:
        OPEN.pop().close()


def drain(b: PulsarBackend, start: dict[str, Any] | None = None, limit: int | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """Plan and read batches until nothing is left; returns all rows and the final offset."""
    offset = start if start is not None else Planner(b).initial("earliest")
    tables = []
    for end, table in batches(b, offset, limit):
        tables.append(table)
        offset = end
    return (pa.concat_tables(tables) if tables else b.schema().empty_table()), offset
