"""A stand-in for Apache Pulsar's admin REST API on loopback, answering recorded responses.

Recorded responses are used only where the test needs an answer a pulsar-lite broker cannot give (it has no
admin API); each test says so.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class RecordedAdmin(BaseHTTPRequestHandler):
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
def serve_admin(responses: dict[str, Any] | None = None) -> Iterator[type[RecordedAdmin]]:
    """An admin REST API on loopback answering ``handler.responses`` (a JSON body, or an int: that HTTP
    status; 404 for any other path) and recording what it was asked in ``handler.seen``."""
    handler = type("AdminApi", (RecordedAdmin,), {"responses": dict(responses or {}), "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
