"""A Confluent-compatible schema registry, read-only: the writer schema of a schema id (``GET /schemas/ids/<id>``).

Confluent Schema Registry, Apicurio Registry's Confluent-compatible API (``/apis/ccompat/v7``), Karapace and
Redpanda all answer it. Each id is fetched once per reader and kept: an id names one schema for good. Transient
failures (a connection refused, HTTP 5xx) are retried with tenacity; an id the registry does not know fails
the message (it is malformed: no schema decodes it).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import urllib.error
import urllib.request

from pydantic import SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from cdc.errors import BackendUnavailableError
from cdc.formats.rows import Malformed

log = logging.getLogger(__name__)


class _Retry(Exception):
    pass


class SchemaRegistry:
    """The schemas of one registry (``url``), with HTTP basic authentication (``user_info``: ``user:password``)
    and a CA file for https. Picklable: it holds no connection."""

    def __init__(self, url: str, user_info: SecretStr | None = None, ca_location: str | None = None,
                 timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.user_info = user_info
        self.ca_location = ca_location
        self.timeout_s = timeout_s
        self._cache: dict[int, str] = {}

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.url!r})"

    def schema(self, schema_id: int) -> str:
        """The schema (JSON text) of ``schema_id``."""
        if schema_id not in self._cache:
            self._cache[schema_id] = self._fetch(schema_id)
            log.info("schema %d read from %s", schema_id, self.url)
        return self._cache[schema_id]

    def _fetch(self, schema_id: int) -> str:
        request = urllib.request.Request(f"{self.url}/schemas/ids/{schema_id}", headers={"Accept": "application/json"})
        if self.user_info is not None:
            token = base64.b64encode(self.user_info.get_secret_value().encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context(cafile=self.ca_location) if self.url.startswith("https") else None
        try:
            for attempt in Retrying(stop=stop_after_attempt(5), wait=wait_exponential(0.2, max=5),
                                    retry=retry_if_exception_type(_Retry), reraise=True):
                with attempt:
                    try:
                        with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as r:
                            answer = json.loads(r.read())
                    except urllib.error.HTTPError as exc:
                        if exc.code == 404:
                            raise Malformed(f"schema id {schema_id} is not in the registry {self.url}") from None
                        if exc.code >= 500:
                            raise _Retry(f"HTTP {exc.code}") from None
                        raise BackendUnavailableError(
                            f"schema registry {self.url} answered HTTP {exc.code} for schema id {schema_id}"
                            + (" (check schema.registry.basic.auth.user.info)" if exc.code in (401, 403) else "")
                        ) from None
                    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                        raise _Retry(str(exc)) from None
        except _Retry as exc:
            raise BackendUnavailableError(f"schema registry {self.url} unreachable for schema id {schema_id}: {exc}") from None
        text = answer.get("schema") if isinstance(answer, dict) else None
        if not isinstance(text, str):
            raise Malformed(f"the registry {self.url} answered schema id {schema_id} without a schema")
        schema_type = answer.get("schemaType", "AVRO")
        if schema_type != "AVRO":
            raise Malformed(f"schema id {schema_id} is a {schema_type} schema; Avro values only are decoded")
        return text
