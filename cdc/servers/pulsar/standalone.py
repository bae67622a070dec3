"""Apache Pulsar's own standalone broker for tests and development, on loopback only: :class:`ApachePulsar`.

One JVM runs ``org.apache.pulsar.PulsarStandaloneStarter``: the broker, one bookie and an in-process RocksDB
metadata store, on three loopback ports (binary protocol, admin HTTP, bookie) that are free when first chosen
and kept across restarts, with its data in a directory of our choosing. The jars come from Maven Central,
pinned by ``apache-pulsar/pom.xml`` beside this module and resolved once into a cache by
``make pulsar-standalone`` (``make test`` runs it); :func:`pulsar_lib` finds them. ::

    with ApachePulsar() as broker:
        broker.create_partitioned_topic("persistent://public/default/orders", 2)
        client = pulsar.Client(broker.url)
        ...

Unlike pulsar-lite it has the real admin API and schema registry. It starts and restarts in seconds to tens
of seconds, not milliseconds: the JVM runs with the C1 compiler only (``-XX:TieredStopAtLevel=1``), which
roughly halves start-up for a short-lived test broker, a small heap, and a class-data-sharing archive of the
broker's classes (:func:`cds_archive`): the first graceful stop writes it beside the jars, later starts map it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.servers.jvm import java, megabytes
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess, die_with_parent
from cdc.servers.pulsar.broker import BrokerError

log = logging.getLogger(__name__)

__all__ = ["HOME_ENV", "ApachePulsar", "pulsar_home", "pulsar_lib", "pulsar_version"]

FILES = Path(__file__).parent / "apache-pulsar"
POM = FILES / "pom.xml"
HOME_ENV = "CDC_PULSAR_HOME"
"""Environment variable naming the directory the Makefile resolves the jars into (its ``lib/``)."""

# The add-opens set of Pulsar's own bin/pulsar launcher: without them the broker logs reflective-access
# failures and loses its direct-memory and OS metrics.
_ADD_OPENS = (
    "java.base/java.io",
    "java.base/java.util.zip",
    "java.base/sun.net",
    "java.management/sun.management",
    "jdk.management/com.sun.management.internal",
    "java.base/jdk.internal.platform",
    "java.base/java.lang",
    "java.base/jdk.internal.misc",
)


def pulsar_version() -> str:
    """The Apache Pulsar version pinned by ``apache-pulsar/pom.xml``."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ET.parse(POM).getroot().findtext("m:properties/m:pulsar.version", namespaces=ns)
    if not version:  # pragma: no cover - the pom is ours
        raise BrokerError(f"{POM} sets no pulsar.version")
    return version.strip()


def pulsar_home() -> Path:
    """Where ``make pulsar-standalone`` puts the pinned broker: ``$CDC_PULSAR_HOME``, else
    ``~/.cache/cdc-tunnel/pulsar-<version>`` (the Makefile's default, too)."""
    given = os.environ.get(HOME_ENV)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "cdc-tunnel" / f"pulsar-{pulsar_version()}"


def pulsar_lib() -> Path:
    """The directory of the broker's jars, resolved from this very pom (the Makefile names its stamp file
    after the pom's content, so jars of an older pin are refused rather than run)."""
    home = pulsar_home()
    key = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    lib = home / "lib"
    if not (home / f"resolved-{key}").exists() or not any(lib.glob("pulsar-broker-*.jar")):
        raise BrokerError(
            f"Apache Pulsar {pulsar_version()} is not resolved in {home} for the current {POM.name}: "
            f"run `make pulsar-standalone` (`make test` runs it; it needs Maven), or point ${HOME_ENV} at "
            "a directory it filled"
        )
    return lib


def cds_archive(lib: Path) -> Path:
    """The broker's class-data-sharing archive: the loaded classes of a previous run, mapped at start instead
    of parsed and verified again. It is valid for one JVM build and this exact class path (a JVM that cannot
    use it says so and starts without it), so its name carries both."""
    binary = Path(java()).resolve()
    key = hashlib.sha256(f"{binary}\n{lib.resolve()}".encode()).hexdigest()[:12]
    return lib.parent / f"cds-{key}.jsa"


class _NotReady(Exception):
    """The broker is up but does not serve the default namespace yet."""


class ApachePulsar(ServerProcess):
    """An Apache Pulsar standalone broker (one JVM) on 127.0.0.1.

    Parameters
    ----------
    data_dir:
        Where the broker keeps its bookie journal, ledgers, metadata and logs; a temporary directory
        (removed by :meth:`stop` with ``cleanup=True``) when omitted. Data survives :meth:`kill` and
        :meth:`restart`: retention is infinite, because Pulsar's default (0) deletes acknowledged ledgers
        when a restarted broker recovers them, which a test of restarts would read as data loss.
    broker_port, web_port, bookie_port:
        Ports of the binary protocol, the admin HTTP API and the bookie; free ones when omitted. They stay
        the same across restarts (the bookie's port is also its identity in the metadata store).
    heap:
        The JVM's maximum heap (direct memory is half of it).
    die_with_parent:
        SIGTERM the broker when the process that started it dies, even by SIGKILL (Linux only).
    conf:
        ``standalone.conf`` settings that replace or add to ours (e.g. ``authenticationEnabled``,
        ``tlsCertificateFilePath``).
    tls:
        Also listen with TLS: free ports for ``brokerServicePortTls`` and ``webServicePortTls`` (:attr:`tls_url`,
        :attr:`tls_admin_url`); ``conf`` must name the certificate and key. The plain ports stay open, so the
        broker's own clients and the readiness check need no certificate.
    admin_token:
        A super-user token for the admin calls of this class, when ``conf`` turns authentication on.
    """

    # SIGTERM runs the broker's shutdown hooks (ledgers, metadata), and the first run writes the class-data
    # archive at its exit (9-34 s measured): give them time.
    stop_timeout = 60.0

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        broker_port: int | None = None,
        web_port: int | None = None,
        bookie_port: int | None = None,
        heap: str = "256m",
        die_with_parent: bool = True,
        conf: Mapping[str, str] | None = None,
        tls: bool = False,
        admin_token: str | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="apache-pulsar-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.broker_port = broker_port or free_port()
        self.web_port = web_port or free_port()
        self.bookie_port = bookie_port or free_port()
        self.heap = heap
        self.die_with_parent = die_with_parent
        self.conf = dict(conf or {})
        self.broker_tls_port = free_port() if tls else None
        self.web_tls_port = free_port() if tls else None
        self._admin_token = admin_token
        self.last_start_s: float | None = None
        """Seconds from launching the JVM to the broker serving its default namespace, at the last start."""
        self._process: subprocess.Popen[bytes] | None = None
        self._dumping: Path | None = None  # where this run writes the class-data archive at its exit

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def tls_url(self) -> str:
        """The TLS binary URL; the certificate names ``localhost`` and ``127.0.0.1`` in the tests."""
        if self.broker_tls_port is None:
            raise BrokerError("this broker was made without tls=True")
        return f"pulsar+ssl://localhost:{self.broker_tls_port}"

    @property
    def tls_admin_url(self) -> str:
        if self.web_tls_port is None:
            raise BrokerError("this broker was made without tls=True")
        return f"https://localhost:{self.web_tls_port}"

    def _write_config(self) -> Path:
        config = self.data_dir / "standalone.conf"
        template = (FILES / "standalone.conf").read_text()
        text = template.replace("@BROKER_PORT@", str(self.broker_port)).replace("@WEB_PORT@", str(self.web_port))
        overrides = dict(self.conf)
        if self.broker_tls_port is not None and self.web_tls_port is not None:
            overrides.setdefault("brokerServicePortTls", str(self.broker_tls_port))
            overrides.setdefault("webServicePortTls", str(self.web_tls_port))
        lines = []
        for line in text.splitlines():
            key = line.split("=", 1)[0].strip()
            if "=" in line and not line.lstrip().startswith("#") and key in overrides:
                line = f"{key}={overrides.pop(key)}"
            lines.append(line)
        lines += [f"{key}={value}" for key, value in overrides.items()]
        config.write_text("\n".join(lines) + "\n")
        return config

    def _cds_flag(self, lib: Path) -> str:
        """Map the archive when it exists; else have this run write one at its exit (graceful only: see
        :meth:`stop`, which moves it in place, so a killed run never leaves a partial archive in use)."""
        archive = cds_archive(lib)
        if archive.exists():
            self._dumping = None
            return f"-XX:SharedArchiveFile={archive}"
        self._dumping = archive.with_name(f"{archive.name}.{os.getpid()}-{id(self)}.tmp")
        self._dumping.unlink(missing_ok=True)
        return f"-XX:ArchiveClassesAtExit={self._dumping}"

    def stop(self, cleanup: bool | None = None) -> None:
        """Stop gracefully (see :class:`ServerProcess`); a run that was writing the class-data archive has
        written it by its exit, and it is moved in place unless the JVM had to be killed."""
        process, dumping = self._process, self._dumping
        super().stop(cleanup)
        # A JVM stopped by SIGTERM exits with 143 once its shutdown hooks ran; only SIGKILL cuts the dump short.
        killed = process is None or process.returncode == -signal.SIGKILL
        if dumping is not None and not killed and dumping.exists():
            os.replace(dumping, cds_archive(dumping.parent / "lib"))
            log.info("class-data archive of Apache Pulsar written to %s", cds_archive(dumping.parent / "lib"))
        elif dumping is not None:
            dumping.unlink(missing_ok=True)
        self._dumping = None

    def _admin_request(self, path: str, data: bytes | None = None, method: str | None = None) -> urllib.request.Request:
        headers = {"Content-Type": "application/json"}
        if self._admin_token:
            headers["Authorization"] = f"Bearer {self._admin_token}"
        return urllib.request.Request(self.admin_url + path, data=data, method=method, headers=headers)

    def _admin_call(
        self, path: str, what: str, *, data: bytes | None = None, method: str, timeout: float = 30
    ) -> None:
        """An admin call whose answer is not needed; an HTTP error raises :class:`BrokerError` saying ``what``."""
        try:
            with urllib.request.urlopen(self._admin_request(path, data=data, method=method), timeout=timeout):
                pass
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise BrokerError(f"{what}: HTTP {exc.code} {detail}") from exc

    def _command(self, lib: Path, config: Path) -> list[str]:
        direct = f"{max(64, megabytes(self.heap) // 2)}m"
        return [
            java(),
            "-Xms64m",
            f"-Xmx{self.heap}",
            f"-XX:MaxDirectMemorySize={direct}",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",
            self._cds_flag(lib),
            *(arg for module in _ADD_OPENS for arg in ("--add-opens", f"{module}=ALL-UNNAMED")),
            "-Dio.netty.leakDetectionLevel=disabled",
            "-Dpulsar.allocator.exit_on_oom=true",
            f"-Dlog4j2.configurationFile={FILES / 'log4j2.xml'}",
            f"-Dpulsar.log.file={self.data_dir / 'pulsar.log'}",
            "-cp",
            f"{lib}/*",
            "org.apache.pulsar.PulsarStandaloneStarter",
            "--config",
            str(config),
            "-nfw",  # no functions worker
            "-nss",  # no stream storage (table service)
            "--bookkeeper-port",
            str(self.bookie_port),
            "--bookkeeper-dir",
            str(self.data_dir / "bookkeeper"),
            "--metadata-dir",
            str(self.data_dir / "metadata"),
        ]

    def start(self, timeout: float = 300.0) -> ApachePulsar:
        """Start the broker (on the same ports and data as before, if it ran already) and wait until it serves
        the default namespace: ``/admin/v2/clusters`` answers earlier, while producers still get
        TopicNotFound for seconds on a fresh data directory."""
        if self.running:
            return self
        check_disk(self.data_dir, float(self.conf.get("diskUsageThreshold", BOOKIE_DISK_THRESHOLD)))
        command = self._command(pulsar_lib(), self._write_config())
        started = time.monotonic()
        with open(self.data_dir / "stdout.log", "ab") as out:
            try:
                self._process = subprocess.Popen(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=str(self.data_dir),
                    start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the broker's
                    preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
                )
            except FileNotFoundError:
                raise BrokerError(
                    f"Apache Pulsar runs on Java 17, and {command[0]!r} was not found: set JAVA_HOME or put java "
                    "on PATH"
                ) from None
        try:
            for attempt in Retrying(
                stop=stop_after_delay(timeout),
                wait=wait_fixed(0.5),
                retry=retry_if_exception_type(_NotReady),
                reraise=True,
            ):
                with attempt:
                    self._check_ready()
        except _NotReady:
            self.kill()
            raise BrokerError(
                f"Apache Pulsar did not serve {self.admin_url} within {timeout} s; see {self.data_dir}/pulsar.log"
            ) from None
        self.last_start_s = time.monotonic() - started
        log.info(
            "Apache Pulsar ready at %s, admin %s, in %.1f s (pid %s, data %s)",
            self.url, self.admin_url, self.last_start_s, self.pid, self.data_dir,
        )
        return self

    def _check_ready(self) -> None:
        assert self._process is not None
        if self._process.poll() is not None:
            code = self._process.returncode
            self._process = None
            # The JVM's own failures (bad flags, missing classes) go to stdout, the broker's to its log file.
            tail = "".join(
                (self.data_dir / name).read_text(errors="replace")[-1500:]
                for name in ("stdout.log", "pulsar.log")
                if (self.data_dir / name).exists()
            )
            raise BrokerError(f"Apache Pulsar exited with {code} at start-up (see {self.data_dir}): {tail}")
        try:
            with urllib.request.urlopen(self._admin_request("/admin/v2/namespaces/public/default"), timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise _NotReady(str(exc)) from exc
        raise _NotReady("default namespace not served yet")

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` (``persistent://tenant/namespace/name``, or a name in ``public/default``) with
        ``partitions`` partitions through the admin API (auto-created topics are not partitioned)."""
        path = _topic_path(topic)
        self._admin_call(
            f"/admin/v2/{path}/partitions", f"creating {topic} with {partitions} partitions",
            data=str(int(partitions)).encode(), method="PUT",
        )

    def unload(self, topic: str) -> None:
        """Unload ``topic`` (a partition, or a non-partitioned topic) from its broker: its open ledger is closed,
        and the next message opens a new one (a way to give a topic several ledgers at once)."""
        self._admin_call(f"/admin/v2/{_topic_path(topic)}/unload", f"unloading {topic}", method="PUT", timeout=60)

    def grant(self, namespace: str, role: str, actions: list[str]) -> None:
        """Give ``role`` the ``actions`` (``consume``, ``produce``...) on ``tenant/namespace`` (a broker with
        ``authorizationEnabled``; needs ``admin_token``)."""
        self._admin_call(
            f"/admin/v2/namespaces/{namespace}/permissions/{role}", f"granting {actions} on {namespace} to {role}",
            data=json.dumps(actions).encode(), method="POST",
        )

    def __repr__(self) -> str:
        return (
            f"ApachePulsar(url={self.url!r}, admin_url={self.admin_url!r}, data_dir={str(self.data_dir)!r}, "
            f"running={self.running})"
        )


BOOKIE_DISK_THRESHOLD = 0.999
"""BookKeeper's ``diskUsageThreshold`` as our ``standalone.conf`` sets it (BookKeeper's default is 0.95): above it
the standalone's bookie turns read-only, and every producer's creation then times out (``Pulsar error:
TimeOut``) while the broker itself answers."""

MIN_FREE_BYTES = 1 << 30
"""The free space the broker start asks for: a test broker's ledgers and logs stay well below it."""


def check_disk(path: Path, threshold: float = BOOKIE_DISK_THRESHOLD) -> None:
    """Refuse to start on a disk the bookie would take as full, or with less than 1 GiB free (BrokerError naming
    the use and the fix)."""
    usage = shutil.disk_usage(path)
    used = 1 - usage.free / usage.total if usage.total else 0.0
    if used >= threshold or usage.free < MIN_FREE_BYTES:
        raise BrokerError(
            f"the disk of {path} is {used:.1%} full ({usage.free / 2**30:.1f} GiB free): Apache Pulsar's "
            f"storage (BookKeeper) turns read-only above {threshold:.1%} of a disk (diskUsageThreshold), and the "
            f"broker needs {MIN_FREE_BYTES / 2**30:.0f} GiB free; free space there, or give the broker a data "
            "directory on another disk"
        )


def _topic_path(topic: str) -> str:
    """``persistent://public/default/t`` -> ``persistent/public/default/t`` (the admin API's topic path)."""
    domain, sep, rest = topic.partition("://")
    if not sep:
        domain, rest = "persistent", f"public/default/{topic}"
    if domain not in ("persistent", "non-persistent") or rest.count("/") != 2:
        raise ValueError(f"not a topic name: {topic!r} (expected persistent://tenant/namespace/name)")
    return f"{domain}/{rest}"

