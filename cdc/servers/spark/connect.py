"""The Spark Connect server that ships in pyspark 4.2, on loopback: :class:`ConnectServer`. ::

    with ConnectServer() as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
        cdc.register(spark)

The server is one JVM (``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``, what
``sbin/start-connect-server.sh`` runs) with its own ``local[N]`` (or cluster) master. Spark's Python workers
on it (the data source's ``read()``, ``foreachBatch`` functions) run this interpreter with the project on
their path (:func:`cdc.servers.spark.python_env`): a Connect client sends functions by reference to their
module, so the modules must import on the server.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.errors import TerminalError
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess, die_with_parent
from cdc.servers.spark import python_env, spark_home

log = logging.getLogger(__name__)

__all__ = ["CONNECT_CLASS", "ConnectServer", "SparkServerError", "wait_for_port"]

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SparkServerError(TerminalError):
    """A Spark server (Connect, master, worker) exited or did not serve in time."""


class _NotServing(Exception):
    """The port does not accept connections yet."""


def wait_for_port(process: subprocess.Popen[bytes], port: int, timeout: float, what: str, logfile: Path) -> None:
    """Wait until ``port`` on 127.0.0.1 accepts TCP connections; fail early when ``process`` exits."""

    def check() -> None:
        if process.poll() is not None:
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            raise SparkServerError(f"{what} exited with {process.returncode} at start-up (see {logfile}): {tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except OSError as exc:
            raise _NotServing(str(exc)) from exc

    try:
        for attempt in Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.3),
                                retry=retry_if_exception_type(_NotServing), reraise=True):
            with attempt:
                check()
    except _NotServing:
        raise SparkServerError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s; see {logfile}") from None


class ConnectServer(ServerProcess):
    """A Spark Connect server on 127.0.0.1.

    Parameters
    ----------
    data_dir : its log (``connect.log``), warehouse and scratch space; a temporary directory when omitted.
    port : the gRPC port (``sc://127.0.0.1:PORT``); a free one when omitted, kept across restarts.
    master : the server's Spark master (``local[2]``, or ``spark://...`` of a :class:`SparkCluster`).
    conf : more ``--conf`` settings of the server (e.g. Delta's Connect plugin and jars).
    driver_memory : the server JVM's heap.
    die_with_parent : SIGTERM the server when the process that started it dies (Linux).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        master: str = "local[2]",
        conf: Mapping[str, str] | None = None,
        driver_memory: str = "768m",
        die_with_parent: bool = True,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="spark-connect-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.master = master
        self.conf = dict(conf or {})
        self.driver_memory = driver_memory
        self.die_with_parent = die_with_parent
        self.last_start_s: float | None = None
        """Seconds from launch to the gRPC port accepting connections, at the last start."""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def logfile(self) -> Path:
        return self.data_dir / "connect.log"

    def command(self) -> list[str]:
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.warehouse.dir": str(self.data_dir / "warehouse"),
            "spark.local.dir": str(self.data_dir / "tmp"),
            **self.conf,
        }
        return [
            str(spark_home() / "bin" / "spark-submit"),
            "--class", CONNECT_CLASS,
            "--name", "cdc-tunnel Spark Connect server",
            "--master", self.master,
            "--driver-memory", self.driver_memory,
            *(arg for k, v in conf.items() for arg in ("--conf", f"{k}={v}")),
        ]

    def start(self, timeout: float = 180.0) -> ConnectServer:
        """Start the server (same port as before, if it ran already) and wait until its port accepts."""
        if self.running:
            return self
        started = time.monotonic()
        with open(self.logfile, "ab") as out:
            self._process = subprocess.Popen(
                self.command(), env=python_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=str(self.data_dir), start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        try:
            wait_for_port(self._process, self.port, timeout, "the Spark Connect server", self.logfile)
        except SparkServerError:
            self.kill()
            raise
        self.last_start_s = time.monotonic() - started
        log.info("Spark Connect server at %s in %.1f s (pid %s, log %s)", self.url, self.last_start_s, self.pid,
                 self.logfile)
        return self
