"""topicsPattern through the Pulsar admin REST API: against the session's Apache Pulsar standalone, and, for
what a healthy broker does not answer (an HTTP 503, a token header to observe), responses recorded from
the documented endpoints served on loopback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.backends.pulsar.admin import AdminClient, match_topics
from cdc.errors import BackendUnavailableError, OptionError
from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.admin_api import NS, RECORDED, RecordedAdmin, serve_admin
from tests.backends.pulsar.helpers import backend, drain, produce


@pytest.fixture
def admin() -> Iterator[type[RecordedAdmin]]:
    with serve_admin(RECORDED) as handler:
        yield handler


def test_pattern_matches_parents_not_partitions(admin: Any) -> None:
    client = AdminClient(admin.url, token="tok")
    assert match_topics(client, "persistent://public/default/orders-.*") == [
        "persistent://public/default/orders-eu",
        "persistent://public/default/orders-us",
    ]
    assert match_topics(client, "pay.*") == ["persistent://public/default/payments"]
    assert admin.seen[0][1] == "Bearer tok"
    assert "tok" not in repr(client)


def test_admin_errors_are_clear(admin: Any) -> None:
    with pytest.raises(OptionError, match="admin.url.*HTTP 404"):
        match_topics(AdminClient(admin.url), "persistent://other/ns/.*")
    admin.responses[NS + "/partitioned"] = 503
    with pytest.raises(BackendUnavailableError, match="HTTP 503"):
        match_topics(AdminClient(admin.url), "orders-.*")
    with pytest.raises(OptionError, match="invalid regex"):
        match_topics(AdminClient(admin.url), "orders-(")


def test_topics_pattern_reads_matching_topics_and_discovers_new_ones(broker: ApachePulsar) -> None:
    """The broker's real admin API lists the namespace: partitioned topics by their parent name (their
    partitions are not matched on their own), non-partitioned ones as they are."""
    prefix = f"orders{uuid.uuid4().hex[:6]}"
    broker.create_partitioned_topic(f"{prefix}-eu", 2)
    produce(broker.url, f"{prefix}-eu", [b"eu1", b"eu2"], ["a", "b"])
    produce(broker.url, f"{prefix}-us", [b"us1"], ["a"])
    produce(broker.url, f"pay{prefix}", [b"pay"], ["a"])
    b = backend(broker.url, None, topicsPattern=f"{prefix}-.*", **{"admin.url": broker.admin_url})
    table, offset = drain(b)
    assert sorted(table.column("value").to_pylist()) == [b"eu1", b"eu2", b"us1"]
    assert sorted(c.id for c in b.list_channels()) == [
        f"persistent://public/default/{prefix}-eu-partition-0",
        f"persistent://public/default/{prefix}-eu-partition-1",
        f"persistent://public/default/{prefix}-us",
    ]
    # A topic created later is discovered at the next batch and read from its earliest message.
    produce(broker.url, f"{prefix}-apac", [b"ap1", b"ap2"], ["x", "y"])
    table, _ = drain(b, offset)
    assert sorted(table.column("value").to_pylist()) == [b"ap1", b"ap2"]
