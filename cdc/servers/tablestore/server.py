"""HTTP front of the local Tablestore server: request signatures, signed responses, faults, admin calls.

:class:`LocalTablestore` runs the server in-process (a thread). The front holds up under hostile input:
a declared body over the service's 5 MiB request limit is refused before it is read (413
``OTSRequestBodyTooLarge``); a connection that sends nothing for ``idle_timeout`` seconds (default 60) is
closed, with 408 ``OTSRequestTimeout`` if it stopped in the middle of a body; at most
``max_connections`` (default 64) are served at once, more get 503 ``OTSServerBusy`` at once; every
malformed request gets a 4xx answer.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import logging
import signal
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cdc.backends.tablestore import table_pb as pb
from cdc.backends.tablestore import tunnel_pb as tpb
from cdc.backends.tablestore.signing import content_md5, hmac_b64, ots_headers_string

from .admin import check_admin_call
from .errors import OTSError
from .faults import Faults
from .limits import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from .service import HANDLERS, TUNNEL_API
from .store import Store

log = logging.getLogger(__name__)

_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_MAX_SKEW_S = 15 * 60
# "The data size of an HTTP request body: 5 MB" (Tablestore, "Limits on the Wide Column model").
MAX_BODY_BYTES = 5 * 1024 * 1024
DEFAULT_ACCESS_KEY_SECRET = "local-access-key-secret"


def _v4_signing_key(secret: str, sign_date: str, region: str) -> bytes:
    """The SDK's signature-v4 key: an HMAC-SHA256 chain over date, region, product and a constant."""
    key = ("aliyun_v4" + secret).encode("utf-8")
    for part in (sign_date, region, "ots", "aliyun_v4_request"):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(key)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Every blocking read and write of this connection gives up after the idle timeout: a client that
        # stops sending (idle between calls, or half-way through a request) cannot hold a thread forever.
        self.connection.settimeout(self.server.app.idle_timeout)
        # Headers and body go out in separate writes: without NODELAY, Nagle plus the client's delayed
        # ACK adds ~40 ms to every call.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        log.debug("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------------ responses
    def _send(
        self, status: int, body: bytes, path: str, sign: bool, content_type: str = "protocol buffer"
    ) -> None:
        app = self.server.app
        headers = {
            "x-ots-contentmd5": content_md5(body),
            "x-ots-requestid": uuid.uuid4().hex,
            "x-ots-date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "x-ots-contenttype": content_type,
        }
        if sign:
            key = getattr(self, "_response_key", None) or app.access_key_secret
            signature = hmac_b64(key, ots_headers_string(headers) + "\n" + path)
            headers["Authorization"] = f"OTS {app.access_key_id}:{signature}"
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, err: OTSError, path: str, sign: bool = True) -> None:
        if path in TUNNEL_API:
            body = tpb.Error(code=err.code, message=err.message).SerializeToString()
        else:
            body = pb.Error(code=err.code, message=err.message).SerializeToString()
        self._send(err.status, body, path, sign)

    # ------------------------------------------------------------------ requests
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's naming
        path = self.path.split("?", 1)[0]
        if path == "/admin/health":
            body = json.dumps({"ok": True, "instance": self.server.app.instance}).encode()
            self._send(200, body, path, sign=False, content_type="application/json")
            return
        self._send(404, b"not found", path, sign=False, content_type="text/plain")

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
        path = self.path.split("?", 1)[0]
        try:
            self._post(path)
        except OSError:
            raise  # the connection itself failed (timed out, reset): nobody to answer
        except Exception:  # noqa: BLE001 - a server bug must still answer, as the service does
            log.exception("internal error serving %s", path)
            self.close_connection = True
            try:
                self._error(
                    OTSError("OTSInternalServerError", "internal server error", 500), path, sign=False
                )
            except OSError:
                pass

    def _refuse(self, path: str, code: str, message: str, status: int) -> None:
        """Answer, then close: the rest of the request (a body not read) must not be taken for the next."""
        self.close_connection = True
        if path.startswith("/admin/"):
            body = json.dumps({"error": message, "code": code}).encode()
            self._send(status, body, path, sign=False, content_type="application/json")
        else:
            self._error(OTSError(code, message, status), path, sign=False)

    def _read_body(self, path: str) -> bytes | None:
        """The request body, or None when the request was answered (or dropped) here."""
        declared = self.headers.get("Content-Length")
        if declared is None:
            return b""
        if not declared.strip().isdigit():
            self._refuse(
                path, "OTSParameterInvalid", f"Content-Length {declared[:40]!r} is not a length", 400
            )
            return None
        length = int(declared)
        if length > MAX_BODY_BYTES:
            self._refuse(path, "OTSRequestBodyTooLarge", "The size of POST data is too large.", 413)
            return None
        try:
            body = self.rfile.read(length) if length else b""
        except TimeoutError:
            log.info("closing a connection whose request body stalled for %ss", self.server.app.idle_timeout)
            self._refuse(path, "OTSRequestTimeout", "Request timeout.", 408)
            return None
        if len(body) < length:  # the client closed the connection mid-body: nobody to answer
            self.close_connection = True
            return None
        return body

    def _post(self, path: str) -> None:
        app = self.server.app
        body = self._read_body(path)
        if body is None:
            return
        if path.startswith("/admin/"):
            self._admin(path, body)
            return
        fault = app.faults.take(path)
        if fault is not None:
            kind, seconds = fault
            if kind == "drop":
                log.info("fault: dropping the connection of %s", path)
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if kind == "unavailable":
                code = "OTSTunnelServerUnavailable" if path in TUNNEL_API else "OTSServerUnavailable"
                self._error(OTSError(code, "the server is unavailable (injected fault)", 503), path)
                return
            if kind == "delay":
                time.sleep(seconds)
        handler = HANDLERS.get(path)
        if handler is None:
            self._error(
                OTSError("OTSUnsupportOperation", f"unsupported operation {path}", 400), path, sign=False
            )
            return
        try:
            self._authenticate(path, body)
        except OTSError as err:
            self._error(err, path, sign=False)
            return
        try:
            response = handler(app.store, body)
        except OTSError as err:
            log.debug("%s failed: %s", path, err)
            self._error(err, path)
            return
        except Exception:  # noqa: BLE001 - a server bug must still answer, as the service does
            log.exception("internal error serving %s", path)
            self._error(OTSError("OTSInternalServerError", "internal server error", 500), path)
            return
        self._send(200, response, path, sign=True)

    def _authenticate(self, path: str, body: bytes) -> None:
        app = self.server.app
        headers = {k.lower(): v for k, v in self.headers.items()}
        failed = OTSError(
            "OTSAuthFailed", "The AccessKeyID does not exist or the signature does not match.", 403
        )
        if headers.get("x-ots-accesskeyid") != app.access_key_id:
            raise failed
        if headers.get("x-ots-instancename") != app.instance:
            raise OTSError(
                "OTSAuthFailed", f"instance {headers.get('x-ots-instancename')!r} is not served here", 403
            )
        self._response_key: str | bytes | None = None
        key: str | bytes
        if "x-ots-signature" in headers:  # signature v2 (the SDK's default)
            signature, key, digest, salt = headers["x-ots-signature"], app.access_key_secret, hashlib.sha1, ""
            excluded = "x-ots-signature"
        elif "x-ots-signaturev4" in headers:  # signature v4 (OTSClient(..., region=...))
            date, region = headers.get("x-ots-signdate", ""), headers.get("x-ots-signregion", "")
            if not date or not region:
                raise failed
            signature, digest, salt = headers["x-ots-signaturev4"], hashlib.sha256, "ots"
            key = _v4_signing_key(app.access_key_secret, date, region)
            excluded = "x-ots-signaturev4"
        else:
            raise OTSError(
                "OTSAuthFailed", "the request carries no x-ots-signature or x-ots-signaturev4", 403
            )
        signed = {k: v for k, v in headers.items() if k.startswith("x-ots-") and k != excluded}
        canonical = path + "\nPOST\n\n" + ots_headers_string(signed) + "\n" + salt
        if not hmac.compare_digest(signature, hmac_b64(key, canonical, digest)):
            raise failed
        self._response_key = key
        if headers.get("x-ots-contentmd5") != content_md5(body):
            raise OTSError("OTSParameterInvalid", "x-ots-contentmd5 does not match the body", 400)
        try:
            sent = dt.datetime.strptime(headers.get("x-ots-date", ""), _DATE_FORMAT).replace(tzinfo=dt.UTC)
        except ValueError as exc:
            raise OTSError("OTSParameterInvalid", "x-ots-date is missing or malformed", 400) from exc
        if abs((dt.datetime.now(dt.UTC) - sent).total_seconds()) > _MAX_SKEW_S:
            raise OTSError("OTSAuthFailed", "x-ots-date is more than 15 minutes off the server's clock", 403)

    # ------------------------------------------------------------------ admin
    def _admin(self, path: str, body: bytes) -> None:
        app = self.server.app
        headers = {k.lower(): v for k, v in self.headers.items()}
        refused = check_admin_call(app.access_key_secret, path, body, headers)
        if refused is not None:
            payload = json.dumps({"error": refused}).encode()
            self._send(403, payload, path, sign=False, content_type="application/json")
            return
        try:
            args = json.loads(body or b"{}")
            if not isinstance(args, dict):
                raise TypeError(f"the body must be a JSON object, not {type(args).__name__}")
            result = app.admin(path, args)
        except OTSError as err:
            payload = json.dumps({"error": err.message, "code": err.code}).encode()
            self._send(err.status, payload, path, sign=False, content_type="application/json")
            return
        except (ValueError, TypeError, KeyError) as exc:  # UnicodeDecodeError and JSON errors included
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
            self._send(400, payload, path, sign=False, content_type="application/json")
            return
        self._send(200, json.dumps(result).encode(), path, sign=False, content_type="application/json")


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most ``app.max_connections`` of them."""

    daemon_threads = True
    allow_reuse_address = True
    app: LocalTablestore
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self._busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _busy(self, request: socket.socket) -> None:
        """Answer 503 from the accepting thread, without reading the request, and close."""
        log.warning("refusing a connection: %d connections are being served", self.app.max_connections)
        body = pb.Error(code="OTSServerBusy", message="Server is busy.").SerializeToString()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            request.settimeout(1.0)  # the answer fits the socket buffer; never let it block accepting
            request.sendall(head.encode("ascii") + body)
        except OSError:
            pass
        self.shutdown_request(request)


class LocalTablestore:
    """The server, in this process. ``start()`` serves on a thread; ``stop()`` closes it and the store.

    >>> import tempfile
    >>> from tablestore import OTSClient
    >>> with tempfile.TemporaryDirectory() as tmp, LocalTablestore(tmp, instance="demo") as server:
    ...     client = OTSClient(server.endpoint, server.access_key_id, server.access_key_secret, server.instance)
    ...     client.list_table()
    ()
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        instance: str = "local",
        access_key_id: str = "local-access-key-id",
        access_key_secret: str = DEFAULT_ACCESS_KEY_SECRET,
        max_records_per_read: int = 1000,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.instance = instance
        self.access_key_id = access_key_id
        self.access_key_secret = access_key_secret
        self.max_records_per_read = max_records_per_read
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.faults = Faults()
        self.store: Store
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"LocalTablestore(endpoint={self.endpoint!r}, instance={self.instance!r}, data_dir={str(self.data_dir)!r})"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalTablestore:
        self.store = Store(self.data_dir, self.instance, self.max_records_per_read)
        httpd = _Server((self.host, self.port), _Handler)
        httpd.app = self
        httpd.slots = threading.BoundedSemaphore(self.max_connections)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="local-tablestore", daemon=True
        )
        self._thread.start()
        log.info(
            "local Tablestore serving instance %s at %s (data in %s)",
            self.instance,
            self.endpoint,
            self.data_dir,
        )
        if self.access_key_secret == DEFAULT_ACCESS_KEY_SECRET and not _is_loopback(self.host):
            log.warning(
                "the local Tablestore listens on %s, beyond loopback, with the well-known default access key "
                "secret: anyone who reaches the port can read, write and administer it; give "
                "--access-key-secret (or $CDC_TABLESTORE_ACCESS_KEY_SECRET)",
                self.host,
            )
        return self

    def serve_forever(self) -> None:
        """Block until SIGTERM/SIGINT (the CLI's mode)."""
        self.start()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        stop.wait()
        self.stop()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
            self.store.close()
            log.info("local Tablestore at %s stopped", self.endpoint)

    def __enter__(self) -> LocalTablestore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ admin operations
    def admin(self, path: str, args: dict[str, Any]) -> Any:
        """Serve one admin call (also reachable over HTTP at the same path)."""
        if path == "/admin/split":
            return self.store.split(args["table"], args.get("shard_id"), args.get("split_key"))
        if path == "/admin/merge":
            return self.store.merge(args["table"], args.get("shard_ids"))
        if path == "/admin/shards":
            return self.store.shards(args["table"])
        if path == "/admin/trim":
            before = args.get("before_ms")
            return self.store.trim(
                args["table"], int(before) if before is not None else int(time.time() * 1000)
            )
        if path == "/admin/expire-client":
            self.store.expire_client(args["client_id"])
            return {}
        if path == "/admin/fault":
            return self.set_fault(
                args.get("kind", "clear"),
                int(args.get("count", -1)),
                float(args.get("seconds", 0.0)),
                str(args.get("path_prefix", "")),
            )
        raise OTSError("OTSParameterInvalid", f"unknown admin call {path}", 404)

    def set_fault(
        self, kind: str, count: int = -1, seconds: float = 0.0, path_prefix: str = ""
    ) -> dict[str, Any]:
        """Inject a fault (see :meth:`.faults.Faults.set`)."""
        return self.faults.set(kind, count, seconds, path_prefix)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: assume it is reachable from elsewhere
        return False
