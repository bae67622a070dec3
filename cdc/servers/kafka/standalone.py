"""Apache Kafka for tests and development, on loopback only: :class:`ApacheKafka`, one KRaft broker (no ZooKeeper).

One JVM runs ``kafka.Kafka`` as broker and controller (``process.roles=broker,controller``) on loopback ports
that are free when first chosen and kept across restarts, with its log directory in a directory of our
choosing, formatted once by Kafka's own ``kafka.tools.StorageTool`` (which also creates the SCRAM users). Two
client listeners: ``PLAINTEXT`` (:attr:`ApacheKafka.bootstrap`), and with ``tls`` a ``SASL_SSL`` one
(:attr:`ApacheKafka.secure_bootstrap`: SCRAM-SHA-512 over TLS, the certificate and key given as PEM files). The
jars come from Maven Central, pinned by ``apache-kafka/pom.xml`` beside this module and resolved once into a
cache by ``make kafka`` (``make test`` runs it); :func:`kafka_lib` finds them. ::

    with ApacheKafka() as kafka:
        kafka.create_topic("orders", partitions=2)
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap})

Kafka Connect runs beside it (:mod:`cdc.servers.kafka.connect`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.errors import CdcError
from cdc.servers.jvm import java
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess, die_with_parent

log = logging.getLogger(__name__)

__all__ = ["HOME_ENV", "ApacheKafka", "KafkaServerError", "Tls", "kafka_home", "kafka_lib", "kafka_version"]

FILES = Path(__file__).parent
POMS = sorted(FILES.glob("*/pom.xml"))
"""The three pinned poms (apache-kafka, debezium-postgres, spark-sql-kafka), in the Makefile's order."""
HOME_ENV = "CDC_KAFKA_HOME"
"""Environment variable naming the directory the Makefile resolves the jars into (one ``<pom dir>/lib`` each)."""
SCRAM = "SCRAM-SHA-512"
READY = "Kafka Server started"
"""What the broker logs once it serves its listeners."""


class KafkaServerError(CdcError, RuntimeError):
    """Apache Kafka or Kafka Connect could not be started (jars not resolved, Java missing, a start-up failure)."""


def _pom_property(pom: Path, name: str) -> str:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    value = ET.parse(pom).getroot().findtext(f"m:properties/m:{name}", namespaces=ns)
    if not value:  # pragma: no cover - the poms are ours
        raise KafkaServerError(f"{pom} sets no {name}")
    return value.strip()


def kafka_version() -> str:
    """The Apache Kafka version pinned by ``apache-kafka/pom.xml``."""
    return _pom_property(FILES / "apache-kafka" / "pom.xml", "kafka.version")


def debezium_version() -> str:
    """The Debezium version pinned by ``debezium-postgres/pom.xml`` (the project's one Debezium version)."""
    return _pom_property(FILES / "debezium-postgres" / "pom.xml", "debezium.version")


def kafka_home() -> Path:
    """Where ``make kafka`` puts the pinned jars: ``$CDC_KAFKA_HOME``, else ``~/.cache/cdc-tunnel/kafka-<version>``
    (the Makefile's default, too)."""
    given = os.environ.get(HOME_ENV)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "cdc-tunnel" / f"kafka-{kafka_version()}"


def kafka_lib(part: str = "apache-kafka") -> Path:
    """The jars of one pinned pom (``apache-kafka``: broker and Connect; ``debezium-postgres``: the connector
    plugin; ``spark-sql-kafka``: Spark's Kafka source), resolved from these very poms (the Makefile names its
    stamp file after their content, so jars of an older pin are refused rather than run)."""
    home = kafka_home()
    key = hashlib.sha256(b"".join(p.read_bytes() for p in POMS)).hexdigest()[:16]
    lib = home / part / "lib"
    if not (home / f"resolved-{key}").exists() or not any(lib.glob("*.jar")):
        raise KafkaServerError(
            f"Apache Kafka {kafka_version()} ({part}) is not resolved in {home} for the current poms of {FILES}: "
            f"run `make kafka` (`make test` runs it; it needs Maven), or point ${HOME_ENV} at a directory it filled"
        )
    return lib


def spark_kafka_jars() -> list[str]:
    """The jars ``spark.jars`` needs for Spark's own ``format("kafka")`` (resolved by ``make kafka``)."""
    return sorted(str(p) for p in kafka_lib("spark-sql-kafka").glob("*.jar"))


@dataclass(frozen=True)
class Tls:
    """The broker's TLS identity (PEM files) and its SCRAM users (name -> password) for the ``SASL_SSL``
    listener."""

    cert: Path
    key: Path
    """An unencrypted PKCS#8 private key."""
    users: Mapping[str, str]
    ca: Path | None = None
    """The CA that signed ``cert``, what clients trust (the broker does not read it)."""


class _NotReady(Exception):
    """The broker has not logged that it serves its listeners yet."""


class ApacheKafka(ServerProcess):
    """An Apache Kafka broker in KRaft mode (one JVM, broker and controller) on 127.0.0.1.

    Parameters
    ----------
    data_dir:
        Where the broker keeps its log directory, metadata and logs; a temporary directory (removed by
        :meth:`stop` with ``cleanup=True``) when omitted. Data survives :meth:`kill` and :meth:`restart`.
    port, controller_port:
        The ``PLAINTEXT`` listener and the controller's; free ones when omitted, the same across restarts.
    tls:
        Also listen with ``SASL_SSL`` (SCRAM-SHA-512 over TLS) on a free port (:attr:`secure_bootstrap`, which
        names ``localhost``: the certificate must). Its users are created when the log directory is formatted.
    heap:
        The JVM's maximum heap.
    partitions:
        Partitions of auto-created topics (``num.partitions``).
    conf:
        ``server.properties`` settings that replace or add to ours.
    """

    stop_timeout = 30.0

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        tls: Tls | None = None,
        heap: str = "512m",
        partitions: int = 1,
        die_with_parent: bool = True,
        conf: Mapping[str, str] | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.tls = tls
        self.secure_port = free_port() if tls is not None else None
        self.heap = heap
        self.partitions = partitions
        self.die_with_parent = die_with_parent
        self.conf = dict(conf or {})
        self.last_start_s: float | None = None
        """Seconds from launching the JVM to the broker serving its listeners, at the last start."""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` of the ``PLAINTEXT`` listener."""
        return f"127.0.0.1:{self.port}"

    @property
    def secure_bootstrap(self) -> str:
        """``bootstrap.servers`` of the ``SASL_SSL`` listener (``localhost``, which the certificate names)."""
        if self.secure_port is None:
            raise KafkaServerError("this broker was made without tls")
        return f"localhost:{self.secure_port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "kafka.log"

    def _properties(self) -> dict[str, str]:
        listeners = {"PLAINTEXT": f"127.0.0.1:{self.port}", "CONTROLLER": f"127.0.0.1:{self.controller_port}"}
        advertised = {"PLAINTEXT": f"127.0.0.1:{self.port}"}
        protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": str(self.partitions),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            # A test broker: compaction and retention act within seconds when a topic's own settings ask for it.
            "log.cleaner.backoff.ms": "500",
            "log.retention.check.interval.ms": "1000",
            # not 0: the broker's deletion task then runs back to back (an idle broker took 0.115 of a core
            # with 0, 0.034 with 1 s)
            "log.segment.delete.delay.ms": "1000",
            "file.delete.delay.ms": "0",
        }
        if self.tls is not None and self.secure_port is not None:
            listeners["SASL_SSL"] = f"127.0.0.1:{self.secure_port}"
            advertised["SASL_SSL"] = f"localhost:{self.secure_port}"
            protocols["SASL_SSL"] = "SASL_SSL"
            scram = SCRAM.lower()
            props |= {
                "sasl.enabled.mechanisms": SCRAM,
                f"listener.name.sasl_ssl.{scram}.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
                "listener.name.sasl_ssl.ssl.keystore.location": str(self._keystore()),
            }
        props |= {
            "listeners": ",".join(f"{name}://{addr}" for name, addr in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://{addr}" for name, addr in advertised.items()),
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
        }
        return props | self.conf

    def _keystore(self) -> Path:
        """Kafka's PEM key store: the private key and the certificate in one file."""
        assert self.tls is not None
        path = self.data_dir / "keystore.pem"
        path.write_bytes(self.tls.key.read_bytes() + self.tls.cert.read_bytes())
        return path

    def _write_config(self) -> Path:
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self._properties().items()))
        return config

    def _jvm(self, lib: Path, main: str, log_file: Path) -> list[str]:
        return [
            java(), "-Xms64m", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={FILES / 'log4j2.xml'}",
            f"-Dcdc.log.file={log_file}", "-cp", f"{lib}/*", main,
        ]

    def _format(self, lib: Path, config: Path) -> None:
        """Format the log directory once (KRaft needs a cluster id and the metadata's bootstrap records), with
        the SCRAM users."""
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        command = [*self._jvm(lib, "kafka.tools.StorageTool", self.data_dir / "format.log"), "format",
                   f"--cluster-id={_cluster_id()}", "--config", str(config), "--ignore-formatted"]
        for user, password in (self.tls.users if self.tls is not None else {}).items():
            command += ["--add-scram", f"{SCRAM}=[name={user},password={password}]"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            # The command line holds the users' passwords: only the tool's own output is shown.
            raise KafkaServerError(f"formatting Kafka's log directory failed: {(done.stdout + done.stderr)[-1500:]}")

    def start(self, timeout: float = 180.0) -> ApacheKafka:
        """Start the broker (on the same ports and data as before, if it ran already) and wait until it logs
        that it serves its listeners."""
        if self.running:
            return self
        lib = kafka_lib()
        config = self._write_config()
        self._format(lib, config)
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        command = [*self._jvm(lib, "kafka.Kafka", self.log_file), str(config)]
        started = time.monotonic()
        with open(self.data_dir / "stdout.log", "ab") as out:
            try:
                self._process = subprocess.Popen(
                    command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(self.data_dir),
                    start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the broker's
                    preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
                )
            except FileNotFoundError:
                raise KafkaServerError(
                    f"Apache Kafka runs on Java 17, and {command[0]!r} was not found: set JAVA_HOME or put java on PATH"
                ) from None
        try:
            for attempt in Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.2),
                                    retry=retry_if_exception_type(_NotReady), reraise=True):
                with attempt:
                    self._check_ready(offset)
        except _NotReady:
            self.kill()
            raise KafkaServerError(f"Apache Kafka did not start within {timeout} s; see {self.log_file}") from None
        self.last_start_s = time.monotonic() - started
        log.info("Apache Kafka ready at %s in %.1f s (pid %s, data %s)", self.bootstrap, self.last_start_s, self.pid,
                 self.data_dir)
        return self

    def _check_ready(self, offset: int) -> None:
        assert self._process is not None
        if self._process.poll() is not None:
            code = self._process.returncode
            self._process = None
            tail = "".join(
                (self.data_dir / name).read_text(errors="replace")[-1500:]
                for name in ("stdout.log", "kafka.log") if (self.data_dir / name).exists()
            )
            raise KafkaServerError(f"Apache Kafka exited with {code} at start-up (see {self.data_dir}): {tail}")
        if not self.log_file.exists():
            raise _NotReady("no log yet")
        with open(self.log_file, "rb") as f:
            f.seek(offset)
            if READY.encode() not in f.read():
                raise _NotReady("not started yet")

    # ------------------------------------------------------------------ administration (needs confluent-kafka)
    def admin(self) -> Any:
        """A ``confluent_kafka.admin.AdminClient`` on the plain listener."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> None:
        """Create ``name`` with ``partitions`` partitions and topic ``config`` (e.g. ``cleanup.policy``)."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept until the answer: a collected client cancels its requests
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))],
            operation_timeout=30,
        )
        futures[name].result(timeout=60)
        self._wait_for_leaders(name, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` and its data (a test's topic, once it is done with: a broker holding fewer
        partitions restarts faster)."""
        admin = self.admin()
        admin.delete_topics([name], operation_timeout=30)[name].result(timeout=60)

    def add_partitions(self, name: str, total: int) -> None:
        """Grow topic ``name`` to ``total`` partitions."""
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        admin.create_partitions([NewPartitions(name, total)], operation_timeout=30)[name].result(timeout=60)
        self._wait_for_leaders(name, total)

    def _wait_for_leaders(self, name: str, partitions: int, timeout_s: float = 30) -> None:
        """Until the broker's metadata shows topic ``name`` with ``partitions`` partitions, each with a leader:
        the controller answers a creation before the broker serves the topic's metadata."""
        admin = self.admin()
        deadline = time.monotonic() + timeout_s
        while True:
            topic = admin.list_topics(name, timeout=10).topics.get(name)
            if (topic is not None and topic.error is None and len(topic.partitions) >= partitions
                    and all(p.leader >= 0 for p in topic.partitions.values())):
                return
            if time.monotonic() > deadline:
                raise KafkaServerError(f"topic {name!r}: no leader for each of its {partitions} partitions after "
                                       f"{timeout_s:.0f} s")
            time.sleep(0.1)

    def __repr__(self) -> str:
        return f"ApacheKafka(bootstrap={self.bootstrap!r}, data_dir={str(self.data_dir)!r}, running={self.running})"


def _cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, base64url without padding (what ``kafka-storage random-uuid`` prints)."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
