"""The local server holds up under bad and hostile input: body-size cap, idle timeout, connection bound,
an HTTP answer to every malformed request, replay-proof admin calls, a warning when exposed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.servers.ports import free_port
from cdc.servers.tablestore import AdminClient, LocalTablestore
from cdc.servers.tablestore.admin import ADMIN_DATE_HEADER, ADMIN_SIGNATURE_HEADER, admin_headers


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalTablestore]:
    with LocalTablestore(tmp_path, idle_timeout=1.0, max_connections=4) as local:
        yield local


def _connect(server: LocalTablestore) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    return sock


def _response(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or 10 s pass)."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_a_declared_body_over_the_request_limit_is_refused_without_reading_it(
    server: LocalTablestore,
) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /PutRow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        started = time.monotonic()
        response = _response(sock)
    # answered at once (not after the idle timeout), with no byte of the body sent
    assert time.monotonic() - started < 0.9
    assert _status(response) == 413 and b"OTSRequestBodyTooLarge" in response
    with _connect(server) as sock:  # 5 MiB exactly is allowed to arrive (then fails authentication)
        sock.sendall(b"POST /PutRow HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (5 * 1024 * 1024))
        sock.sendall(b"\0" * (5 * 1024 * 1024))
        assert _status(_response(sock)) == 403


def test_a_half_sent_request_is_closed_after_the_idle_timeout(server: LocalTablestore) -> None:
    with _connect(server) as half, _connect(server) as idle:
        half.sendall(b"POST /PutRow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        started = time.monotonic()
        response = _response(half)
        assert 0.9 <= time.monotonic() - started < 5
        assert _status(response) == 408 and b"OTSRequestTimeout" in response
        assert _response(idle) == b""  # a connection that never sent a byte is closed too
        assert time.monotonic() - started < 5


def test_concurrent_connections_are_bounded(tmp_path: Path) -> None:
    with LocalTablestore(tmp_path, idle_timeout=30.0, max_connections=4) as server:
        threads_before = threading.active_count()
        held = [_connect(server) for _ in range(4)]
        for sock in held:  # each holds a handler thread, waiting for its body
            sock.sendall(b"POST /PutRow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        time.sleep(0.3)
        refused = [_connect(server) for _ in range(6)]
        answers = [_response(sock) for sock in refused]
        assert threading.active_count() - threads_before <= 4
        assert all(_status(a) == 503 and b"OTSServerBusy" in a for a in answers)
        for sock in [*held, *refused]:
            sock.close()
        deadline = time.monotonic() + 5
        while threading.active_count() > threads_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert AdminClient(server.endpoint, server.access_key_secret).call("/admin/fault", kind="clear")


@pytest.mark.parametrize("length", [b"abc", b"-5", b"1e3", b""])
def test_a_bad_content_length_gets_an_answer(server: LocalTablestore, length: bytes) -> None:
    for path in (b"/PutRow", b"/admin/fault"):
        with _connect(server) as sock:
            sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
            response = _response(sock)
        assert _status(response) == 400, response


def _raw_admin(server: LocalTablestore, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with _connect(server) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode()
            + body
        )
        return _response(sock)


def test_malformed_admin_bodies_get_an_answer(server: LocalTablestore) -> None:
    secret = server.access_key_secret
    not_utf8 = b'{"kind": "\xff\xfe"}'
    assert _status(_raw_admin(server, "/admin/fault", not_utf8, {ADMIN_SIGNATURE_HEADER: "x"})) == 403
    signed = admin_headers(secret, "/admin/fault", not_utf8)
    assert _status(_raw_admin(server, "/admin/fault", not_utf8, signed)) == 400
    for body in (b"[]", b"3", b"{not json"):
        response = _raw_admin(server, "/admin/fault", body, admin_headers(secret, "/admin/fault", body))
        assert _status(response) == 400, response


def test_a_captured_admin_call_cannot_be_replayed_later(server: LocalTablestore) -> None:
    secret, path, body = server.access_key_secret, "/admin/fault", b'{"kind": "clear"}'
    fresh = admin_headers(secret, path, body)
    assert _status(_raw_admin(server, path, body, fresh)) == 200
    captured = admin_headers(secret, path, body, now=time.time() - 16 * 60)
    response = _raw_admin(server, path, body, captured)
    assert _status(response) == 403 and b"15 minutes" in response
    # moving the captured call's date forward breaks its signature
    replayed = {**captured, ADMIN_DATE_HEADER: fresh[ADMIN_DATE_HEADER]}
    assert _status(_raw_admin(server, path, body, replayed)) == 403
    # the signature covers the date: the old scheme (path + body only) is refused
    old_scheme = base64.b64encode(
        hmac.new(secret.encode(), path.encode() + b"\n" + body, hashlib.sha1).digest()
    )
    headers = {ADMIN_SIGNATURE_HEADER: old_scheme.decode(), ADMIN_DATE_HEADER: fresh[ADMIN_DATE_HEADER]}
    assert _status(_raw_admin(server, path, body, headers)) == 403
    assert json.loads(_raw_admin(server, path, body, admin_headers(secret, path, body)).split(b"\r\n\r\n")[1])


def test_listening_beyond_loopback_with_the_default_secret_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cdc.servers.tablestore"):
        with LocalTablestore(tmp_path / "a", host="127.0.0.1"):
            pass
        assert not [r for r in caplog.records if "secret" in r.getMessage()]
        with LocalTablestore(tmp_path / "b", host="0.0.0.0", access_key_secret="not-the-default"):
            pass
        assert not [r for r in caplog.records if "secret" in r.getMessage()]
        with LocalTablestore(tmp_path / "c", host="0.0.0.0"):
            pass
    [warning] = [r for r in caplog.records if "secret" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "0.0.0.0" in warning.getMessage()
    assert "local-access-key-secret" not in warning.getMessage()


def test_log_level_debug_takes_effect_under_the_cdc_command(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CDC_TABLESTORE_ACCESS_KEY_SECRET"}
    command = [sys.executable, "-c", "from cdc.cli import main; main()", "server", "tablestore"]
    args = ["--port", str(port), "--data-dir", str(tmp_path / "data"), "--log-level", "DEBUG"]
    log_file = tmp_path / "server.log"
    with open(log_file, "wb") as out:
        process = subprocess.Popen([*command, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        admin = AdminClient(f"http://127.0.0.1:{port}", "local-access-key-secret")
        deadline = time.monotonic() + 30
        while not admin.healthy() and time.monotonic() < deadline:
            time.sleep(0.1)
        admin.clear_faults()
    finally:
        process.terminate()
        process.wait(30)
    output = log_file.read_text()
    assert "DEBUG cdc.servers.tablestore" in output, output
