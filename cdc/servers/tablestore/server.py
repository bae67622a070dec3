"""HTTP front of the local Tablestore server: request signatures, signed responses, faults, admin calls.

:class:`LocalTablestore` runs the server in-process (a thread); :class:`TablestoreProcess` runs
``python -m cdc.servers.tablestore`` as a child process (so tests can ``kill -9`` and restart it);
:class:`AdminClient` drives the admin endpoints of either.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tablestore.protobuf import table_store_pb2 as pb

from cdc.backends.tablestore import tunnel_pb as tpb
from cdc.servers.ports import free_port

from .errors import OTSError
from .faults import Faults
from .service import HANDLERS, TUNNEL_API
from .store import Store

log = logging.getLogger(__name__)

_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_MAX_SKEW_S = 15 * 60
ADMIN_SIGNATURE_HEADER = "x-cdc-admin-signature"


def _hmac_b64(key: str | bytes, text: str, digest: Any = hashlib.sha1) -> str:
    raw_key = key.encode("utf-8") if isinstance(key, str) else key
    return base64.b64encode(hmac.new(raw_key, text.encode("utf-8"), digest).digest()).decode("ascii")


def _v4_signing_key(secret: str, sign_date: str, region: str) -> bytes:
    """The SDK's signature-v4 key: an HMAC-SHA256 chain over date, region, product and a constant."""
    key = ("aliyun_v4" + secret).encode("utf-8")
    for part in (sign_date, region, "ots", "aliyun_v4_request"):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(key)


def _ots_headers_string(headers: dict[str, str]) -> str:
    items = [f"{k.lower()}:{v.strip()}" for k, v in headers.items() if k.lower().startswith("x-ots-")]
    return "\n".join(sorted(items))


def admin_signature(secret: str, path: str, body: bytes) -> str:
    """Admin calls carry ``base64(HMAC-SHA1(secret, path + "\\n" + body))`` (the secret never travels)."""
    return _hmac_b64(secret, path + "\n" + body.decode("utf-8"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
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
            "x-ots-contentmd5": base64.b64encode(hashlib.md5(body).digest()).decode("ascii"),
            "x-ots-requestid": uuid.uuid4().hex,
            "x-ots-date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "x-ots-contenttype": content_type,
        }
        if sign:
            key = getattr(self, "_response_key", None) or app.access_key_secret
            signature = _hmac_b64(key, _ots_headers_string(headers) + "\n" + path)
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
        app = self.server.app
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
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
        canonical = path + "\nPOST\n\n" + _ots_headers_string(signed) + "\n" + salt
        if not hmac.compare_digest(signature, _hmac_b64(key, canonical, digest)):
            raise failed
        self._response_key = key
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode("ascii")
        if headers.get("x-ots-contentmd5") != md5:
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
        given = self.headers.get(ADMIN_SIGNATURE_HEADER, "")
        if not hmac.compare_digest(given, admin_signature(app.access_key_secret, path, body)):
            self._send(
                403, b'{"error": "bad admin signature"}', path, sign=False, content_type="application/json"
            )
            return
        try:
            args = json.loads(body or b"{}")
            result = app.admin(path, args)
        except OTSError as err:
            payload = json.dumps({"error": err.message, "code": err.code}).encode()
            self._send(err.status, payload, path, sign=False, content_type="application/json")
            return
        except (ValueError, TypeError, KeyError) as exc:
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
            self._send(400, payload, path, sign=False, content_type="application/json")
            return
        self._send(200, json.dumps(result).encode(), path, sign=False, content_type="application/json")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    app: LocalTablestore


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
        access_key_secret: str = "local-access-key-secret",
        max_records_per_read: int = 1000,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.instance = instance
        self.access_key_id = access_key_id
        self.access_key_secret = access_key_secret
        self.max_records_per_read = max_records_per_read
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


class AdminClient:
    """Calls the admin endpoints of a running server (in-process or not)."""

    def __init__(self, endpoint: str, access_key_secret: str, timeout: float = 30.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._secret = access_key_secret
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"AdminClient({self.endpoint!r})"

    def call(self, path: str, **args: Any) -> Any:
        body = json.dumps({k: v for k, v in args.items() if v is not None}).encode()
        request = urllib.request.Request(self.endpoint + path, data=body, method="POST")
        request.add_header(ADMIN_SIGNATURE_HEADER, admin_signature(self._secret, path, body))
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise RuntimeError(f"admin call {path} failed ({exc.code}): {detail}") from None

    def split(
        self, table: str, shard_id: str | None = None, split_key: list[Any] | None = None
    ) -> dict[str, Any]:
        return self.call("/admin/split", table=table, shard_id=shard_id, split_key=split_key)  # type: ignore[no-any-return]

    def merge(self, table: str, shard_ids: list[str] | None = None) -> dict[str, Any]:
        return self.call("/admin/merge", table=table, shard_ids=shard_ids)  # type: ignore[no-any-return]

    def shards(self, table: str) -> list[dict[str, Any]]:
        return self.call("/admin/shards", table=table)  # type: ignore[no-any-return]

    def fault(self, kind: str, count: int = -1, seconds: float = 0.0, path_prefix: str = "") -> None:
        self.call("/admin/fault", kind=kind, count=count, seconds=seconds, path_prefix=path_prefix)

    def clear_faults(self) -> None:
        self.fault("clear")

    def expire_client(self, client_id: str) -> None:
        self.call("/admin/expire-client", client_id=client_id)

    def trim(self, table: str, before_ms: int | None = None) -> dict[str, int]:
        """Expire the change log of ``table`` before ``before_ms`` (default: now)."""
        return self.call("/admin/trim", table=table, before_ms=before_ms)  # type: ignore[no-any-return]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/admin/health", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False


class TablestoreProcess:
    """``python -m cdc.servers.tablestore`` as a child process on a fixed free port (kept across restarts).

    The secret reaches the child through its environment, never its command line.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        instance: str = "local",
        access_key_id: str = "local-access-key-id",
        access_key_secret: str = "local-access-key-secret",
        max_records_per_read: int = 1000,
        log_file: Path | str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.instance = instance
        self.access_key_id = access_key_id
        self.access_key_secret = access_key_secret
        self.max_records_per_read = max_records_per_read
        self.log_file = Path(log_file) if log_file else self.data_dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.admin = AdminClient(self.endpoint, access_key_secret)

    def __repr__(self) -> str:
        return f"TablestoreProcess(endpoint={self.endpoint!r}, instance={self.instance!r})"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> TablestoreProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CDC_TABLESTORE_ACCESS_KEY_SECRET=self.access_key_secret)
        cmd = [
            sys.executable,
            "-m",
            "cdc.servers.tablestore",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--instance",
            self.instance,
            "--access-key-id",
            self.access_key_id,
            "--max-records-per-read",
            str(self.max_records_per_read),
        ]
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"local Tablestore exited with {self.process.returncode}; see {self.log_file}"
                )
            if self.admin.healthy():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"local Tablestore did not come up within {timeout}s; see {self.log_file}")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Crash stop (SIGKILL): what a restart must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, *, crash: bool = True) -> TablestoreProcess:
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    # ------------------------------------------------------------------ conveniences for tests and demos
    def split(
        self, table: str, shard_id: str | None = None, split_key: list[Any] | None = None
    ) -> dict[str, Any]:
        return self.admin.split(table, shard_id, split_key)

    def merge(self, table: str, shard_ids: list[str] | None = None) -> dict[str, Any]:
        return self.admin.merge(table, shard_ids)

    def shards(self, table: str) -> list[dict[str, Any]]:
        return self.admin.shards(table)

    def fault(self, kind: str, count: int = -1, seconds: float = 0.0, path_prefix: str = "") -> None:
        self.admin.fault(kind, count, seconds, path_prefix)

    def clear_faults(self) -> None:
        self.admin.clear_faults()

    def expire_client(self, client_id: str) -> None:
        self.admin.expire_client(client_id)

    def trim(self, table: str, before_ms: int | None = None) -> dict[str, int]:
        return self.admin.trim(table, before_ms)

    def ots_client(self, **kwargs: Any) -> Any:
        """A real ``tablestore.OTSClient`` for this server (no retries unless ``retry_policy`` is given)."""
        from tablestore import OTSClient
        from tablestore.retry import NoRetryPolicy

        kwargs.setdefault("retry_policy", NoRetryPolicy())
        return OTSClient(self.endpoint, self.access_key_id, self.access_key_secret, self.instance, **kwargs)

    def __enter__(self) -> TablestoreProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
