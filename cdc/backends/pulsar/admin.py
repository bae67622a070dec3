"""The few Pulsar admin REST calls the backend needs (documented API: ``/admin/v2/...``).

``topicsPattern`` needs them (the binary protocol has no reliable topic listing), and so does a
``valueSchema`` read from the schema registry. pulsar-lite, the broker that runs in tests, has no admin
API at all; tests serve recorded responses on loopback.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from cdc.errors import BackendUnavailableError, OptionError

log = logging.getLogger(__name__)

_PARTITION = re.compile(r"^(.*)-partition-(\d+)$")


class AdminClient:
    """``GET`` calls on the admin REST API of one cluster.

    ``token`` (or ``bearer``, which returns a fresh one per call: OAuth2) goes in the ``Authorization``
    header; ``ssl_context`` holds the trust rules for an ``https`` URL; ``credential`` names the option a
    refused credential came from (HTTP 401/403 fail naming it)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        *,
        bearer: Callable[[], str | None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        credential: str = "auth.token",
    ) -> None:
        self.url = url.rstrip("/")
        self._bearer = bearer if bearer is not None else (lambda: token)
        self.timeout_s = timeout_s
        self._ssl_context = ssl_context
        self.credential = credential

    def __repr__(self) -> str:
        return f"AdminClient({self.url!r})"  # never the token

    @retry(
        retry=retry_if_exception_type(BackendUnavailableError),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.2, max=3),
        reraise=True,
    )
    def get(self, path: str, *, missing_ok: bool = False) -> Any:
        """The JSON answer of ``GET path``; ``None`` for HTTP 404 when ``missing_ok``."""
        request = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        token = self._bearer()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._ssl_context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:
                return None
            if exc.code in (401, 403):
                option = self.credential.split(" ")[0]
                problem = (
                    "refused the credential" if exc.code == 401 else "accepted the credential but does not allow its role"
                )
                raise OptionError(
                    f"option {self.credential!r}: the Pulsar admin API at {self.url} {problem} "
                    f"(GET {path}: HTTP {exc.code}{'' if token else '; no credential was given'})",
                    option,
                ) from None
            if exc.code >= 500:
                raise BackendUnavailableError(f"Pulsar admin GET {path}: HTTP {exc.code}") from None
            raise OptionError(
                f"option 'admin.url': GET {self.url}{path} answered HTTP {exc.code} {exc.reason}", "admin.url"
            ) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise OptionError(
                    f"option 'tls.trustCertsFilePath': the Pulsar admin API at {self.url} presented a certificate "
                    f"that does not verify ({exc.reason.verify_message}); give the CA that signed it, or "
                    "(tests only) tls.allowInsecureConnection=true",
                    "tls.trustCertsFilePath",
                ) from None
            raise BackendUnavailableError(f"Pulsar admin API at {self.url} unreachable: {exc}") from None
        except (TimeoutError, ConnectionError) as exc:
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


    def last_message_id(self, topic: str) -> tuple[int, int, int]:
        """(ledger, entry, batch index) of a topic's (or partition's) last message: ``GET .../lastMessageId``
        (a ``BatchMessageIdImpl``; batch index -1 when the broker does not give one)."""
        rest = topic.split("://", 1)[1]
        answer = self.get(f"/admin/v2/persistent/{rest}/lastMessageId")
        try:
            return (int(answer["ledgerId"]), int(answer["entryId"]), int(answer.get("batchIndex", -1)))
        except (TypeError, KeyError, ValueError):
            raise BackendUnavailableError(
                f"Pulsar admin GET lastMessageId of {topic}: unexpected answer {str(answer)[:200]}"
            ) from None

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """The managed ledger's internal stats of a topic (or partition): ``GET .../internalStats``, whose
        ``ledgers`` list each ledger's id and, once it is closed, its entry count."""
        rest = topic.split("://", 1)[1]
        answer = self.get(f"/admin/v2/persistent/{rest}/internalStats")
        if not isinstance(answer, dict) or not isinstance(answer.get("ledgers"), list):
            raise BackendUnavailableError(
                f"Pulsar admin GET internalStats of {topic}: unexpected answer {str(answer)[:200]}"
            )
        return answer

    def backlog(self, topic: str, subscription: str) -> dict[str, int]:
        """Messages the subscription has not acknowledged, per partition topic (``msgBacklog`` of the
        partitioned stats, or of the topic's stats when it is not partitioned); a partition the subscription
        does not exist on yet is left out."""
        rest = topic.split("://", 1)[1]
        stats = self.get(f"/admin/v2/persistent/{rest}/partitioned-stats?perPartition=true", missing_ok=True)
        per_topic = (stats or {}).get("partitions") or {}
        if not per_topic:  # not partitioned: the partitioned stats answer 404 or hold no partition
            per_topic = {topic: self.get(f"/admin/v2/persistent/{rest}/stats")}
        out = {}
        for name, one in sorted(per_topic.items()):
            sub = ((one or {}).get("subscriptions") or {}).get(subscription)
            if sub is not None:
                out[name] = int(sub.get("msgBacklog", 0))
        return out

    def topic_schema(self, topic: str) -> dict[str, Any] | None:
        """The latest schema of a topic from the schema registry (``GetSchemaResponse``: ``type``,
        ``data``, ``version``...), or ``None`` when the topic has none."""
        rest = topic.split("://", 1)[1]
        answer = self.get(f"/admin/v2/schemas/{rest}/schema", missing_ok=True)
        if answer is not None and not isinstance(answer, dict):
            raise BackendUnavailableError(f"Pulsar admin GET schema of {topic}: unexpected answer {str(answer)[:200]}")
        return answer


_REGISTRY_TYPE = {"json": "JSON", "avro": "AVRO"}


def registry_schema(admin: AdminClient, topics: list[str], value_format: str) -> str:
    """The record schema (JSON text) that every topic of the query has in the schema registry."""
    wanted = _REGISTRY_TYPE[value_format]
    found: dict[str, list[str]] = {}
    for topic in topics:
        answer = admin.topic_schema(topic)
        if answer is None:
            raise OptionError(
                f"option 'valueSchema': topic {topic} has no schema in the schema registry at {admin.url}; "
                "give option valueSchema",
                "valueSchema",
            )
        kind = str(answer.get("type", "")).upper()
        if kind != wanted:
            raise OptionError(
                f"option 'valueFormat': topic {topic} has a {kind or 'untyped'} schema in the schema registry, "
                f"valueFormat={value_format} needs {wanted}; accepted: {', '.join(f'{k} ({v})' for k, v in _REGISTRY_TYPE.items())}",
                "valueFormat",
            )
        data = answer.get("data")
        if not isinstance(data, str):
            raise OptionError(f"option 'valueSchema': the registry's schema of {topic} holds no definition", "valueSchema")
        found.setdefault(json.dumps(json.loads(data), sort_keys=True), []).append(topic)
    if not found:
        raise OptionError("option 'valueSchema': no topic to read a schema from; give option valueSchema", "valueSchema")
    if len(found) > 1:
        groups = "; ".join(", ".join(ts) for ts in found.values())
        raise OptionError(
            f"option 'valueSchema': the topics of one query must share one schema; the registry has different "
            f"schemas for: {groups}",
            "valueSchema",
        )
    text = next(iter(found))
    log.info("valueSchema read from the schema registry for %s", ", ".join(topics))
    return text


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
