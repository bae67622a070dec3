"""An embedded pulsar-lite broker for tests, demos and development, on loopback only.

pulsar-lite (PyPI) ships a Rust broker that speaks the Pulsar binary protocol. This module starts it the
way tests and users need it: bound to 127.0.0.1 on a free port, metrics off (the broker otherwise opens
``0.0.0.0:8080``), data in a directory of our choosing, and with ``stop()``, ``kill()`` (SIGKILL, to
script crashes) and ``restart()`` on the same data. ::

    with EmbeddedBroker(partitions=2) as broker:
        client = pulsar.Client(broker.url)
        ...

From a shell::

    cdc server pulsar --lite --port 6650 --data-dir ./pulsar-data --partitions 2
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from cdc.errors import CdcError, requires_extra
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess, die_with_parent

log = logging.getLogger(__name__)

__all__ = ["BrokerError", "EmbeddedBroker", "free_port", "pulsar_lite_binary"]


class BrokerError(CdcError, RuntimeError):
    """The embedded broker could not be started."""


def pulsar_lite_binary() -> str:
    """Path of the ``pulsar-lite`` executable shipped by the ``pulsar-lite`` package."""
    with requires_extra("pulsar", "pulsar-lite (cdc server pulsar --lite)"):
        import pulsar_lite
    path = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    if not path.exists():  # pragma: no cover
        raise BrokerError(f"pulsar-lite binary not found at {path}")
    return str(path)


class EmbeddedBroker(ServerProcess):
    """A pulsar-lite process on 127.0.0.1.

    Parameters
    ----------
    data_dir:
        Where the broker keeps its data; a temporary directory (removed by :meth:`stop` with
        ``cleanup=True``) when omitted. Data survives :meth:`kill` and :meth:`restart`.
    port:
        The broker port; a free one when omitted. It stays the same across restarts.
    partitions:
        ``default_partitions`` of the broker: every topic it auto-creates gets this many partitions
        (0 = non-partitioned topics). pulsar-lite has no admin API, so this is the only way to get
        partitioned topics from it.
    max_message_size:
        The broker's message size limit in bytes.
    die_with_parent:
        SIGTERM the broker when the process that started it dies, even by SIGKILL (Linux only).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        partitions: int = 0,
        max_message_size: int = 5 * 1024 * 1024,
        log_level: str = "warn",
        die_with_parent: bool = True,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="pulsar-lite-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.partitions = partitions
        self.max_message_size = max_message_size
        self.log_level = log_level
        self.die_with_parent = die_with_parent
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        config = self.data_dir / "pulsar-lite.toml"
        config.write_text(
            f"default_partitions = {int(self.partitions)}\n"
            f"max_message_size_bytes = {int(self.max_message_size)}\n"
            "\n[metrics]\nenabled = false\n"
        )
        return config

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        """Start the broker (on the same port and data as before, if it ran already)."""
        if self.running:
            return self
        config = self._write_config()
        log_file = open(self.data_dir / "broker.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self._process = subprocess.Popen(
                [
                    pulsar_lite_binary(),
                    "--config",
                    str(config),
                    "--addr",
                    f"127.0.0.1:{self.port}",
                    "--db-path",
                    str(self.data_dir / "data.db"),
                    "--log-level",
                    self.log_level,
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.data_dir),
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the broker's
                preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        finally:
            log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = (self.data_dir / "broker.log").read_text(errors="replace")[-2000:]
                self._process = None
                raise BrokerError(f"pulsar-lite exited at start-up on port {self.port}: {tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.25):
                    log.info("pulsar-lite ready at %s (pid %s, data %s)", self.url, self.pid, self.data_dir)
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise BrokerError(f"pulsar-lite did not accept connections on port {self.port} within {timeout} s")

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Create a partitioned topic on a broker whose auto-created topics are not partitioned.

        pulsar-lite has no admin API: it makes partitioned topics only by auto-creating them with its
        ``default_partitions``. This restarts the broker with ``partitions``, creates the topic, and restarts
        it with its own setting (same port and data). With ``partitions=0`` (Apache Pulsar's default, too)
        the broker then serves each partition as a topic of its own, ``<topic>-partition-N``: per-partition
        Readers and ``getLastMessageId`` work, which ``reader.topic=partition`` relies on. (With
        ``default_partitions > 0`` a lookup of ``<topic>-partition-N`` auto-creates a new partitioned topic.)
        """
        from cdc.backends.pulsar.connection import open_client

        own = self.partitions
        self.stop(cleanup=False)
        self.partitions = partitions
        try:
            self.start()
            client = open_client(self.url)
            try:
                client.create_producer(topic).close()
                made = len(client.get_topic_partitions(topic))
            finally:
                client.close()
            if made != partitions:
                raise BrokerError(f"pulsar-lite made {made} partitions of {topic}, not {partitions} (does it exist?)")
        finally:
            self.stop(cleanup=False)
            self.partitions = own
            self.start()

    def __repr__(self) -> str:
        return f"EmbeddedBroker(url={self.url!r}, data_dir={str(self.data_dir)!r}, running={self.running})"
