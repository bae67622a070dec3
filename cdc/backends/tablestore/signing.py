"""Tablestore's request signature (v2) and response checks, shared by the client and the local server.

A request carries ``x-ots-date``, ``x-ots-apiversion``, ``x-ots-accesskeyid``, ``x-ots-instancename``,
``x-ots-contentmd5`` (base64 MD5 of the body), optionally ``x-ots-ststoken``, and ``x-ots-signature`` =
base64(HMAC-SHA1(secret, uri + "\\nPOST\\n\\n" + the sorted ``name:value`` lines of the other ``x-ots-*``
headers + "\\n")). A successful response carries ``x-ots-contentmd5``, ``x-ots-requestid``, ``x-ots-date``,
``x-ots-contenttype`` and ``Authorization: OTS <access key id>:<base64 HMAC-SHA1(secret, sorted x-ots-* lines +
"\\n" + uri)>``, which the client verifies: the answer comes from a holder of the secret, whole.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

API_VERSION = "2015-12-31"
MAX_CLOCK_SKEW_S = 15 * 60


def hmac_b64(key: str | bytes, text: str, digest: Any = hashlib.sha1) -> str:
    raw_key = key.encode("utf-8") if isinstance(key, str) else key
    return base64.b64encode(hmac.new(raw_key, text.encode("utf-8"), digest).digest()).decode("ascii")


def content_md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode("ascii")


def ots_headers_string(headers: Mapping[str, str]) -> str:
    """The sorted ``name:value`` lines of the ``x-ots-*`` headers (names lower-cased, values stripped)."""
    items = [f"{k.lower()}:{v.strip()}" for k, v in headers.items() if k.lower().startswith("x-ots-")]
    return "\n".join(sorted(items))


def request_signature(uri: str, headers: Mapping[str, str], secret: str) -> str:
    """Signature v2 of a POST to ``uri`` with ``headers`` (without ``x-ots-signature``)."""
    return hmac_b64(secret, uri + "\nPOST\n\n" + ots_headers_string(headers) + "\n")


def response_signature(uri: str, headers: Mapping[str, str], key: str | bytes) -> str:
    return hmac_b64(key, ots_headers_string(headers) + "\n" + uri)


def request_headers(
    uri: str,
    body: bytes,
    *,
    access_key_id: str,
    access_key_secret: str,
    instance_name: str,
    sts_token: str | None = None,
    now: datetime | None = None,
) -> dict[str, str]:
    """The signed headers of one call."""
    headers = {
        "x-ots-date": (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "x-ots-apiversion": API_VERSION,
        "x-ots-accesskeyid": access_key_id,
        "x-ots-instancename": instance_name,
        "x-ots-contentmd5": content_md5(body),
    }
    if sts_token:
        headers["x-ots-ststoken"] = sts_token
    headers["x-ots-signature"] = request_signature(uri, headers, access_key_secret)
    return headers


def check_response(
    uri: str,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    access_key_id: str,
    access_key_secret: str,
    now: datetime | None = None,
) -> str | None:
    """Why a response fails the checks (missing headers, MD5, date, signature), or None when it passes.
    ``headers`` must have lower-case names."""
    if 200 <= status < 300:
        for name in ("x-ots-contentmd5", "x-ots-requestid", "x-ots-date", "x-ots-contenttype"):
            if name not in headers:
                return f"{name!r} is missing in the response headers"
    if "x-ots-contentmd5" in headers and headers["x-ots-contentmd5"] != content_md5(body):
        return "the response body does not match its x-ots-contentmd5"
    if "x-ots-date" in headers:
        try:
            served = datetime.strptime(headers["x-ots-date"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        except ValueError:
            return f"the response's x-ots-date {headers['x-ots-date']!r} is not a date"
        if abs((served - (now or datetime.now(UTC))).total_seconds()) > MAX_CLOCK_SKEW_S:
            return "the response's date differs from this machine's clock by more than 15 minutes"
    auth = headers.get("authorization")
    if auth is None:
        return "'Authorization' is missing in the response headers" if 200 <= status < 300 else None
    if not auth.startswith("OTS ") or auth.count(":") != 1:
        return "the response's Authorization header is malformed"
    key_id, signature = auth[4:].split(":")
    if key_id != access_key_id:
        return "the response is signed for another access key id"
    if not hmac.compare_digest(signature, response_signature(uri, headers, access_key_secret)):
        return "the response's signature does not verify"
    return None
