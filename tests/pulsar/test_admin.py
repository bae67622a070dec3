"""topicsPattern through the Pulsar admin REST API.

pulsar-lite has no admin API, so the admin side is served here by a loopback ``http.server`` that answers
with responses recorded from the documented endpoints (``GET /admin/v2/persistent/{tenant}/{namespace}``
and ``.../partitioned``); the messages themselves come from a real pulsar-lite broker."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cdc.backends.pulsar.admin import AdminClient, match_topics
from cdc.errors import BackendUnavailableError, OptionError
from cdc.servers.pulsar import EmbeddedBroker
from tests.pulsar.helpers import backend, drain, produce

NS = "/admin/v2/persistent/public/default"
# Recorded from a Pulsar 3.x standalone: the plain listing includes each partition of a partitioned topic.
RECORDED: dict[str, Any] = {
    NS + "/partitioned": ["persistent://public/default/orders-eu"],
    NS: [
        "persistent://public/default/orders-eu-partition-0",
        "persistent://public/default/orders-eu-partition-1",
        "persistent://public/default/orders-us",
        "persistent://public/default/payments",
    ],
}


class _Admin(BaseHTTPRequestHandler):
    responses: dict[str, Any] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = self.responses.get(self.path)
        if isinstance(body, int):
            self.send_response(body)
            self.end_headers()
            return
        if body is None:
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"reason":"Namespace does not exist"}')
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve_admin(responses: dict[str, Any] | None = None) -> Iterator[type[_Admin]]:
    """An admin REST API on loopback answering ``handler.responses`` (a JSON body, or an int: that HTTP
    status; 404 for any other path) and recording what it was asked in ``handler.seen``."""
    handler = type("AdminApi", (_Admin,), {"responses": dict(responses or {}), "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def admin() -> Iterator[type[_Admin]]:
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
