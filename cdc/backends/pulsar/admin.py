"""The few Pulsar admin REST calls the backend needs (documented API: ``/admin/v2/...``).

Only ``topicsPattern`` needs them: the binary protocol has no reliable topic listing (and pulsar-lite, the
broker that runs in tests, has no admin API at all; tests serve recorded responses on loopback).
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from typing import Any

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from cdc.errors import BackendUnavailableError, OptionError

log = logging.getLogger(__name__)

_PARTITION = re.compile(r"^(.*)-partition-(\d+)$")


class AdminClient:
    """``GET`` calls on the admin REST API of one cluster."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"AdminClient({self.url!r})"  # never the token

    @retry(
        retry=retry_if_exception_type(BackendUnavailableError),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.2, max=3),
        reraise=True,
    )
    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise BackendUnavailableError(f"Pulsar admin GET {path}: HTTP {exc.code}") from None
            raise OptionError(
                f"option 'admin.url': GET {self.url}{path} answered HTTP {exc.code} {exc.reason}", "admin.url"
            ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise BackendUnavailableError(f"Pulsar admin API at {self.url} unreachable: {exc}") from None

    def topics_of_namespace(self, tenant: str, namespace: str) -> list[str]:
        """Every persistent topic of the namespace, partitioned topics by their parent name."""
        partitioned = self.get(f"/admin/v2/persistent/{tenant}/{namespace}/partitioned") or []
        plain = self.get(f"/admin/v2/persistent/{tenant}/{namespace}") or []
        parents = set(partitioned)
        out = set(parents)
        for name in plain:
            m = _PARTITION.match(name)
            if m and m.group(1) in parents:
                continue
            out.add(name)
        return sorted(out)

    def partitions(self, topic: str) -> int:
        """Partition count of a topic (0 = not partitioned)."""
        rest = topic.split("://", 1)[1]
        meta = self.get(f"/admin/v2/persistent/{rest}/partitions") or {}
        return int(meta.get("partitions", 0))


def match_topics(admin: AdminClient, pattern: str) -> list[str]:
    """Topics of the pattern's namespace whose full name matches ``pattern`` entirely."""
    full = pattern if "://" in pattern else f"persistent://public/default/{pattern}"
    scheme, _, rest = full.partition("://")
    parts = rest.split("/")
    if scheme != "persistent" or len(parts) != 3:
        raise OptionError(
            "option 'topicsPattern': expected persistent://<tenant>/<namespace>/<regex> or a regex over "
            f"public/default; got {pattern!r}",
            "topicsPattern",
        )
    try:
        regex = re.compile(full)
    except re.error as exc:
        raise OptionError(f"option 'topicsPattern': invalid regex {pattern!r}: {exc}", "topicsPattern") from None
    topics = [t for t in admin.topics_of_namespace(parts[0], parts[1]) if regex.fullmatch(t)]
    log.debug("topicsPattern %s matched %s", pattern, topics)
    return topics
