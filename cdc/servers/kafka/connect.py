"""Kafka Connect standalone beside :class:`~cdc.servers.kafka.standalone.ApacheKafka`: :class:`KafkaConnect`.

One JVM runs ``org.apache.kafka.connect.cli.ConnectStandalone`` with no connector at start; connectors are
added and removed through its REST API (:meth:`KafkaConnect.create`, :meth:`KafkaConnect.delete`), so one
worker serves every connector of a test session. Its plugin path holds Debezium's PostgreSQL connector (the
``debezium-postgres`` pom, resolved by ``make kafka``); the worker's own converters are Kafka's JSON converter,
which a connector's config may replace. Source offsets live in a file in the data directory. ::

    with KafkaConnect(kafka) as connect:
        connect.create("orders", postgres_connector(dsn, "orders", ["public.orders"]))
        connect.wait_running("orders")
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.servers.kafka.standalone import ApacheKafka, KafkaServerError, kafka_lib
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess, die_with_parent

log = logging.getLogger(__name__)

__all__ = ["ConnectClient", "KafkaConnect", "postgres_connector"]


class _NotReady(Exception):
    pass


class ConnectClient:
    """Kafka Connect's REST API at ``url``: add, watch and remove connectors."""

    url: str

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            text = r.read()
        return json.loads(text) if text else None

    # ------------------------------------------------------------------ connectors
    def create(self, name: str, config: Mapping[str, str]) -> None:
        """Add connector ``name`` with ``config`` (``connector.class`` and its own settings)."""
        try:
            self._call("POST", "/connectors", {"name": name, "config": dict(config)})
        except urllib.error.HTTPError as exc:
            raise KafkaServerError(f"creating connector {name}: HTTP {exc.code} {exc.read().decode()[:1000]}") from None

    def status(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("GET", f"/connectors/{name}/status")
        return answer

    def wait_running(self, name: str, timeout: float = 120.0) -> None:
        """Wait until the connector and its tasks run; a failed task fails here with its trace."""
        deadline = time.monotonic() + timeout
        state: Any = None
        while time.monotonic() < deadline:
            try:
                state = self.status(name)
            except urllib.error.HTTPError:
                state = None
            tasks = (state or {}).get("tasks") or []
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed or (state or {}).get("connector", {}).get("state") == "FAILED":
                trace = (failed[0] if failed else state["connector"]).get("trace", "")
                raise KafkaServerError(f"connector {name} failed: {trace[:3000]}")
            if tasks and all(t.get("state") == "RUNNING" for t in tasks):
                return
            time.sleep(0.3)
        raise KafkaServerError(f"connector {name} is not running after {timeout} s: {state}")

    def delete(self, name: str) -> None:
        try:
            self._call("DELETE", f"/connectors/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


class KafkaConnect(ServerProcess, ConnectClient):
    """A Kafka Connect standalone worker on 127.0.0.1 (REST API on :attr:`url`), writing to ``kafka``."""

    stop_timeout = 30.0

    def __init__(self, kafka: ApacheKafka, data_dir: str | Path | None = None, *, rest_port: int | None = None,
                 heap: str = "384m", die_with_parent: bool = True) -> None:
        self.kafka = kafka
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="kafka-connect-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.rest_port = rest_port or free_port()
        ConnectClient.__init__(self, f"http://127.0.0.1:{self.rest_port}")
        self.heap = heap
        self.die_with_parent = die_with_parent
        self.last_start_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None


    @property
    def log_file(self) -> Path:
        return self.data_dir / "connect.log"

    def _write_config(self) -> Path:
        plugins = kafka_lib("debezium-postgres").parent  # plugin.path: a directory of plugin directories
        props = {
            "bootstrap.servers": self.kafka.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.data_dir / "connect.offsets"),
            "offset.flush.interval.ms": "500",
            "plugin.path": str(plugins),
            "plugin.discovery": "only_scan",
            "listeners": self.url,
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.rest_port),
        }
        config = self.data_dir / "worker.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return config

    def start(self, timeout: float = 240.0) -> KafkaConnect:
        if self.running:
            return self
        from cdc.servers.jvm import java

        lib = kafka_lib()
        command = [java(), "-Xms64m", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
                   f"-Dlog4j2.configurationFile={Path(__file__).parent / 'log4j2.xml'}",
                   f"-Dcdc.log.file={self.log_file}", "-cp", f"{lib}/*",
                   "org.apache.kafka.connect.cli.ConnectStandalone", str(self._write_config())]
        started = time.monotonic()
        with open(self.data_dir / "stdout.log", "ab") as out:
            self._process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(self.data_dir),
                start_new_session=True, preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        try:
            for attempt in Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.3),
                                    retry=retry_if_exception_type(_NotReady), reraise=True):
                with attempt:
                    self._check_ready()
        except _NotReady:
            self.kill()
            raise KafkaServerError(f"Kafka Connect did not serve {self.url} within {timeout} s; see {self.log_file}") from None
        self.last_start_s = time.monotonic() - started
        log.info("Kafka Connect ready at %s in %.1f s (pid %s)", self.url, self.last_start_s, self.pid)
        return self

    def _check_ready(self) -> None:
        assert self._process is not None
        if self._process.poll() is not None:
            code, self._process = self._process.returncode, None
            tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise KafkaServerError(f"Kafka Connect exited with {code} at start-up (see {self.data_dir}): {tail}")
        try:
            self._call("GET", "/connector-plugins")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise _NotReady(str(exc)) from exc

    def __repr__(self) -> str:
        return f"KafkaConnect(url={self.url!r}, kafka={self.kafka.bootstrap!r}, running={self.running})"


def postgres_connector(
    *, host: str, port: int, user: str, database: str, name: str, tables: Sequence[str],
    password: str = "unused", schemas: bool = True, transactions: bool = False,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The config of Debezium's PostgreSQL connector for a database of the tests' PostgreSQL: topics
    ``<name>.<schema>.<table>`` (``topic.prefix`` is ``name``), a replication slot and publication named after
    ``name`` (dropped when the connector stops), JSON values (``schemas`` as the converter's
    ``schemas.enable``), an initial snapshot."""
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.dbname": database,
        "topic.prefix": name,
        "plugin.name": "pgoutput",
        "slot.name": name.replace("-", "_"),
        "slot.drop.on.stop": "true",
        "publication.name": name.replace("-", "_"),
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(tables),
        "snapshot.mode": "initial",
        "skipped.operations": "none",  # Debezium skips truncates unless told otherwise
        "provide.transaction.metadata": "true" if transactions else "false",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true" if schemas else "false",
        "value.converter.schemas.enable": "true" if schemas else "false",
    }
    return config | dict(extra or {})
