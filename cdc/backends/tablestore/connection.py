"""A Python client of the Tablestore Tunnel service and of the table calls the backend needs.

The PyPI SDK has no tunnel calls (and pins an older protobuf), so this client speaks the protocol itself: it
builds the protobuf requests of :mod:`cdc.backends.tablestore.tunnel_pb` and :mod:`.table_pb`, signs them
(:mod:`.signing`: ``x-ots-*`` headers and ``x-ots-signature``), sends them through a urllib3 pool, and checks
responses (content MD5, date, ``Authorization`` signature). Failures become typed errors
(:mod:`cdc.backends.tablestore.errors`); transient ones are retried with exponential backoff and jitter
through tenacity.

Example::

    client = TunnelClient("http://127.0.0.1:8080", "inst", "ak-id", "ak-secret")
    tunnel_id = client.create_tunnel("orders", "orders-cdc", "BaseAndStream")
    client_id = client.connect(tunnel_id)
    for ch in client.describe_tunnel("orders", "orders-cdc").channels:
        token, seq = client.get_checkpoint(tunnel_id, client_id, ch.channel_id)
        page = client.read_records(tunnel_id, client_id, ch.channel_id, token)
        ...  # page.records, page.next_token
        client.checkpoint(tunnel_id, client_id, ch.channel_id, page.next_token, seq + 1)

The client is picklable: it pickles its settings (the secret included, never shown in a repr or log)
and reopens its connection pool lazily after unpickling.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.util
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from cdc.backends.tablestore import signing, table_pb
from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.errors import (
    RETRYABLE,
    ConnectionFailedError,
    ProtocolError,
    TablestoreError,
    error_for,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

TUNNEL_TYPES = ("BaseData", "Stream", "BaseAndStream")
USER_AGENT = "cdc-tunnel"


@dataclass(frozen=True)
class RecordPage:
    """One ``ReadRecords`` response."""

    records: Sequence[Any]  # pb.Record
    next_token: str
    may_more_record: bool | None = None

    @property
    def finished(self) -> bool:
        return self.next_token == pb.FINISHED_TOKEN


@dataclass(frozen=True)
class TableDescription:
    """What ``DescribeTable`` says of a table, as the backend uses it."""

    primary_key: tuple[tuple[str, str], ...]
    """(column, type) in key order; types ``INTEGER``, ``STRING``, ``BINARY`` (``PK_BOOLEAN``)."""
    max_versions: int


@dataclass(frozen=True)
class RetrySettings:
    """How transient failures are retried: ``attempts`` tries in all, waits from ``initial`` to ``maximum``."""

    attempts: int = 6
    initial: float = 0.1
    maximum: float = 5.0


class TunnelClient:
    """Calls the tunnel API of one Tablestore instance. Thread-safe; picklable."""

    def __init__(
        self,
        endpoint: str,
        instance_name: str,
        access_key_id: str,
        access_key_secret: str,
        *,
        sts_token: str | None = None,
        socket_timeout: float = 30.0,
        retry: RetrySettings | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.instance_name = instance_name
        self.access_key_id = access_key_id
        self._secret = access_key_secret
        self._sts_token = sts_token
        self.socket_timeout = socket_timeout
        self.retry = retry or RetrySettings()
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TunnelClient(endpoint={self.endpoint!r}, instance_name={self.instance_name!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ transport
    @property
    def pool(self) -> urllib3.HTTPConnectionPool:
        """The HTTP(S) connection pool to the endpoint (opened on first use, again after unpickling)."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = urllib3.connectionpool.connection_from_url(
                        self.endpoint,
                        maxsize=16,
                        block=False,
                        timeout=urllib3.Timeout(connect=self.socket_timeout, read=self.socket_timeout),
                        retries=False,
                    )
        return self._pool

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _send_once(self, uri: str, body: bytes) -> bytes:
        headers = signing.request_headers(
            uri,
            body,
            access_key_id=self.access_key_id,
            access_key_secret=self._secret,
            instance_name=self.instance_name,
            sts_token=self._sts_token,
        )
        headers["User-Agent"] = USER_AGENT
        path = urllib3.util.parse_url(self.endpoint).path or ""
        try:
            res = self.pool.urlopen(
                "POST", path.rstrip("/") + uri, body=body, headers=headers, redirect=False, assert_same_host=False
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ConnectionFailedError(f"{uri}: {type(exc).__name__}: {exc}", "ConnectionFailed") from None
        status, res_body = res.status, bytes(res.data)
        std = {k.lower(): v for k, v in res.headers.items()}
        request_id = std.get("x-ots-requestid", "")
        if status >= 300:
            error = pb.Error()
            try:
                error.ParseFromString(res_body)
                code, message = error.code, error.message
            except Exception:  # noqa: BLE001 - a proxy's HTML page, a truncated body
                code, message = f"HTTP{status}", f"{res.reason}: {res_body[:200]!r}"
            raise error_for(code, f"{uri}: {message}", status, request_id)
        problem = signing.check_response(
            uri, status, std, res_body, access_key_id=self.access_key_id, access_key_secret=self._secret
        )
        if problem is not None:
            raise ProtocolError(f"{uri}: {problem}", "ProtocolError", status, request_id)
        return res_body

    def _call(self, name: str, request: Any, response_type: Any) -> Any:
        return self.call(pb.URIS[name], request, response_type)

    def call(self, uri: str, request: Any, response_type: Any) -> Any:
        """One signed call of any API (``/GetRange``, ``/tunnel/readrecords``...), retried when transient."""
        body = request.SerializeToString()

        def once() -> Any:
            raw = self._send_once(uri, body)
            try:
                return response_type.FromString(raw)
            except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and others
                raise ProtocolError(f"{uri}: undecodable response: {exc}", "ProtocolError") from None

        return self._retrying(once, uri)

    def _retrying(self, fn: Callable[[], T], what: str) -> T:
        r = self.retry
        retrying = Retrying(
            retry=retry_if_exception_type(RETRYABLE),
            stop=stop_after_attempt(r.attempts),
            wait=wait_exponential_jitter(initial=r.initial, max=r.maximum),
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )
        return retrying(fn)

    # ------------------------------------------------------------------ tables
    def describe_table(self, table: str) -> TableDescription:
        """The table's primary key and version count (``DescribeTable``); ``ObjectNotExistError`` if none."""
        resp = self.call("/DescribeTable", table_pb.DescribeTableRequest(table_name=table),
                         table_pb.DescribeTableResponse)
        names = {number: name for name, number in table_pb.ENUM_VALUES["PrimaryKeyType"]}
        keys = tuple((str(k.name), names.get(k.type, str(k.type))) for k in resp.table_meta.primary_key)
        versions = resp.table_options.max_versions if resp.HasField("table_options") else 0
        return TableDescription(keys, int(versions) or 1)

    # ------------------------------------------------------------------ tunnel management
    def create_tunnel(self, table: str, tunnel_name: str, tunnel_type: str) -> str:
        """Create a tunnel; returns its id. Raises ``TunnelExistError`` if the name is taken."""
        if tunnel_type not in TUNNEL_TYPES:
            raise ValueError(f"tunnel type {tunnel_type!r}: accepted values: {', '.join(TUNNEL_TYPES)}")
        req = pb.CreateTunnelRequest(
            tunnel=pb.Tunnel(
                table_name=table, tunnel_name=tunnel_name, tunnel_type=pb.TUNNEL_TYPES[tunnel_type]
            )
        )
        resp = self._call("create", req, pb.CreateTunnelResponse)
        log.info("created tunnel %s (%s) on table %s: %s", tunnel_name, tunnel_type, table, resp.tunnel_id)
        return str(resp.tunnel_id)

    def delete_tunnel(self, table: str, tunnel_name: str, tunnel_id: str | None = None) -> None:
        req = pb.DeleteTunnelRequest(table_name=table, tunnel_name=tunnel_name)
        if tunnel_id:
            req.tunnel_id = tunnel_id
        self._call("delete", req, pb.DeleteTunnelResponse)

    def list_tunnels(self, table: str | None = None) -> list[Any]:
        """``TunnelInfo`` of every tunnel (of ``table`` if given)."""
        req = pb.ListTunnelRequest()
        if table:
            req.table_name = table
        return list(self._call("list", req, pb.ListTunnelResponse).tunnels)

    def describe_tunnel(self, table: str, tunnel_name: str = "", tunnel_id: str | None = None) -> Any:
        """``DescribeTunnelResponse``: the tunnel's info and every channel with its status."""
        req = pb.DescribeTunnelRequest(table_name=table, tunnel_name=tunnel_name)
        if tunnel_id:
            req.tunnel_id = tunnel_id
        return self._call("describe", req, pb.DescribeTunnelResponse)

    # ------------------------------------------------------------------ consuming
    def connect(self, tunnel_id: str, timeout_s: int = 300, client_tag: str | None = None) -> str:
        """Register a tunnel client; returns its id. It expires ``timeout_s`` after its last heartbeat."""
        config = pb.ClientConfig(timeout=timeout_s)
        if client_tag:
            config.client_tag = client_tag
        resp = self._call(
            "connect", pb.ConnectRequest(tunnel_id=tunnel_id, client_config=config), pb.ConnectResponse
        )
        return str(resp.client_id)

    def heartbeat(self, tunnel_id: str, client_id: str, channels: Sequence[Any] = ()) -> list[Any]:
        """Report the channels this client holds (``Channel`` messages); returns the service's view."""
        req = pb.HeartbeatRequest(tunnel_id=tunnel_id, client_id=client_id)
        req.channels.extend(channels)
        return list(self._call("heartbeat", req, pb.HeartbeatResponse).channels)

    def shutdown(self, tunnel_id: str, client_id: str) -> None:
        self._call(
            "shutdown", pb.ShutdownRequest(tunnel_id=tunnel_id, client_id=client_id), pb.ShutdownResponse
        )

    def get_checkpoint(self, tunnel_id: str, client_id: str, channel_id: str) -> tuple[str, int]:
        """The channel's checkpoint token and its sequence number."""
        req = pb.GetCheckpointRequest(tunnel_id=tunnel_id, client_id=client_id, channel_id=channel_id)
        resp = self._call("getcheckpoint", req, pb.GetCheckpointResponse)
        return str(resp.checkpoint), int(resp.sequence_number)

    def checkpoint(
        self, tunnel_id: str, client_id: str, channel_id: str, token: str, sequence_number: int
    ) -> None:
        """Move the channel's checkpoint; ``sequence_number`` must be the current one plus one."""
        req = pb.CheckpointRequest(
            tunnel_id=tunnel_id,
            client_id=client_id,
            channel_id=channel_id,
            checkpoint=token,
            sequence_number=sequence_number,
        )
        self._call("checkpoint", req, pb.CheckpointResponse)

    def read_records(self, tunnel_id: str, client_id: str, channel_id: str, token: str) -> RecordPage:
        """The records that follow ``token`` (possibly none) and the token after them."""
        req = pb.ReadRecordsRequest(
            tunnel_id=tunnel_id, client_id=client_id, channel_id=channel_id, token=token
        )
        resp = self._call("readrecords", req, pb.ReadRecordsResponse)
        more = resp.may_more_record if resp.HasField("may_more_record") else None
        return RecordPage(list(resp.records), str(resp.next_token), more)


__all__ = ["RecordPage", "RetrySettings", "TablestoreError", "TunnelClient"]
