"""Admin calls (split, merge, shards, faults, client expiry, trim): their signature and a client.

An admin call carries ``x-cdc-admin-date`` (Unix seconds) and ``x-cdc-admin-signature`` =
``base64(HMAC-SHA1(secret, path + "\\n" + date + "\\n" + body))``. The server refuses a date more than
15 minutes off its clock (the window the service allows ``x-ots-date``), so a captured call can be
replayed within that window at most, never later; the secret itself never travels.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from typing import Any

ADMIN_SIGNATURE_HEADER = "x-cdc-admin-signature"
ADMIN_DATE_HEADER = "x-cdc-admin-date"
ADMIN_WINDOW_S = 15 * 60


def admin_signature(secret: str, path: str, date: str, body: bytes) -> str:
    message = path.encode("utf-8") + b"\n" + date.encode("utf-8") + b"\n" + body
    return base64.b64encode(hmac.new(secret.encode("utf-8"), message, hashlib.sha1).digest()).decode("ascii")


def admin_headers(secret: str, path: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers that sign an admin call made at ``now`` (default: the current time)."""
    date = str(int(time.time() if now is None else now))
    return {ADMIN_DATE_HEADER: date, ADMIN_SIGNATURE_HEADER: admin_signature(secret, path, date, body)}


def check_admin_call(secret: str, path: str, body: bytes, headers: dict[str, str]) -> str | None:
    """Why an admin call must be refused (a reason without secrets), or None if it is authentic."""
    date = headers.get(ADMIN_DATE_HEADER, "")
    if not date.isdigit():
        return f"the {ADMIN_DATE_HEADER} header is missing or not Unix seconds"
    expected = admin_signature(secret, path, date, body)
    if not hmac.compare_digest(headers.get(ADMIN_SIGNATURE_HEADER, ""), expected):
        return "bad admin signature"
    if abs(time.time() - int(date)) > ADMIN_WINDOW_S:
        return "the admin call's date is more than 15 minutes off the server's clock"
    return None


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
        for name, value in admin_headers(self._secret, path, body).items():
            request.add_header(name, value)
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
