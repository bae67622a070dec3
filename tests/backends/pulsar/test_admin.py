"""topicsPattern through the Pulsar admin REST API.

pulsar-lite has no admin API, so the admin side is served here by a loopback ``http.server`` that answers
with responses recorded from the documented endpoints (``GET /admin/v2/persistent/{tenant}/{namespace}``
and ``.../partitioned``); the messages themselves come from a real pulsar-lite broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.backends.pulsar.admin import AdminClient, match_topics
from cdc.errors import BackendUnavailableError, OptionError
from cdc.servers.pulsar import EmbeddedBroker
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


def test_topics_pattern_reads_matching_topics_and_discovers_new_ones(admin: Any, broker: EmbeddedBroker) -> None:
    produce(broker.url, "orders-eu", [b"eu1", b"eu2"], ["a", "b"])
    produce(broker.url, "orders-us", [b"us1"], ["a"])
    produce(broker.url, "payments", [b"pay"], ["a"])
    b = backend(broker.url, None, topicsPattern="orders-.*", **{"admin.url": admin.url})
    table, offset = drain(b)
    assert sorted(table.column("value").to_pylist()) == [b"eu1", b"eu2", b"us1"]
    # A topic created later is discovered at the next batch and read from its earliest message.
    produce(broker.url, "orders-apac", [b"ap1", b"ap2"], ["x", "y"])
    admin.responses[NS] = [*RECORDED[NS], "persistent://public/default/orders-apac"]
    table, _ = drain(b, offset)
    assert sorted(table.column("value").to_pylist()) == [b"ap1", b"ap2"]
