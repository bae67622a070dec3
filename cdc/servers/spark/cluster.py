"""A Spark standalone cluster on loopback: one master and N workers, each a JVM started from the pyspark
package's ``spark-class`` (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``). ::

    with SparkCluster(workers=2) as cluster:
        spark = cluster.session_builder("my-app").getOrCreate()
        cdc.register(spark)
        ...
        cluster.kill_worker(0)      # kill -9 a worker (its executors exit with it)
        cluster.start_worker(0)     # and bring it back

Executors run this interpreter (``spark.pyspark.python``) with the project on their ``PYTHONPATH``
(``spark.executorEnv.PYTHONPATH``): that is what :meth:`SparkCluster.session_conf` sets. On a real cluster
the same two needs are met by installing the project on every node, or by ``--py-files``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess, die_with_parent
from cdc.servers.spark import project_root, python_env, spark_home
from cdc.servers.spark.connect import SparkServerError, wait_for_port

log = logging.getLogger(__name__)

__all__ = ["SparkCluster", "SparkDaemon"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkDaemon(ServerProcess):
    """One master or worker JVM; its log and (for a worker) its executors' work directory in ``data_dir``."""

    def __init__(self, name: str, data_dir: Path, args: list[str], port: int, *, memory: str = "256m",
                 die_with_parent: bool = True) -> None:
        self.name = name
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._owns_dir = False  # the cluster owns the directory
        self.args = args
        self.port = port
        self.memory = memory
        self.die_with_parent = die_with_parent
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def logfile(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    def start(self, timeout: float = 120.0) -> Self:
        self.launch()
        self.wait(timeout)
        return self

    def launch(self) -> None:
        """Start the JVM without waiting for it (a cluster launches its workers side by side)."""
        if self.running:
            return
        # SPARK_DAEMON_MEMORY sizes the master/worker JVM itself (executors are sized by the application);
        # the C1 compiler alone roughly halves the start of a short-lived daemon.
        env = python_env({"SPARK_DAEMON_MEMORY": self.memory, "SPARK_WORKER_DIR": str(self.data_dir / "work"),
                          "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})
        with open(self.logfile, "ab") as out:
            self._process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *self.args], env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(self.data_dir), start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )

    def wait(self, timeout: float = 120.0) -> None:
        assert self._process is not None, "launch() first"
        try:
            wait_for_port(self._process, self.port, timeout, f"the Spark {self.name}", self.logfile)
        except SparkServerError:
            self.kill()
            raise


class _NotReady(Exception):
    """Fewer workers are alive at the master than started."""


class SparkCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1, on free ports kept across restarts.

    Parameters
    ----------
    workers : how many workers.
    cores, memory : what each worker offers to executors.
    data_dir : logs and work directories (a temporary directory, removed by :meth:`stop`, when omitted).
    die_with_parent : SIGTERM each JVM when the process that started it dies (Linux).
    """

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "1g",
                 data_dir: str | os.PathLike[str] | None = None, die_with_parent: bool = True) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="spark-cluster-"))
        self.port, self.webui_port = free_port(), free_port()
        self.cores, self.memory = cores, memory
        self.master = SparkDaemon(
            "master", self.data_dir / "master",
            [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port)],
            self.port, die_with_parent=die_with_parent,
        )
        self.workers: list[SparkDaemon] = []
        for i in range(workers):
            port, webui = free_port(), free_port()
            self.workers.append(SparkDaemon(
                f"worker-{i}", self.data_dir / f"worker-{i}",
                [WORKER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui),
                 "--cores", str(cores), "--memory", memory, "--work-dir", str(self.data_dir / f"worker-{i}" / "work"),
                 self.url],
                port, die_with_parent=die_with_parent,
            ))
        self.last_start_s: float | None = None
        """Seconds from launching the master to every worker registered with it, at the last start."""

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers with their state, applications)."""
        with urllib.request.urlopen(self.webui_url + "/json/", timeout=5) as r:
            status: dict[str, Any] = json.load(r)
        return status

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def start(self, timeout: float = 180.0) -> SparkCluster:
        """Start the master, then the workers, and wait until they are all registered (ALIVE)."""
        started = time.monotonic()
        self.master.start(timeout)
        for worker in self.workers:
            worker.launch()
        for worker in self.workers:
            worker.wait(timeout)
        self.wait_for_workers(len(self.workers), timeout)
        self.last_start_s = time.monotonic() - started
        log.info("Spark cluster %s with %d workers in %.1f s (logs %s)", self.url, len(self.workers),
                 self.last_start_s, self.data_dir)
        return self

    def wait_for_workers(self, count: int, timeout: float = 120.0) -> None:
        def check() -> None:
            try:
                alive = self.alive_workers()
            except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as exc:
                raise _NotReady(str(exc)) from exc
            if alive < count:
                raise _NotReady(f"{alive} of {count} workers alive")

        try:
            for attempt in Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.3),
                                    retry=retry_if_exception_type(_NotReady), reraise=True):
                with attempt:
                    check()
        except _NotReady as e:
            raise SparkServerError(f"the Spark cluster at {self.url}: {e} after {timeout} s; see {self.data_dir}") from None

    def kill_worker(self, index: int) -> None:
        """``kill -9`` of worker ``index``; its executors notice the lost worker and exit."""
        self.workers[index].kill()

    def start_worker(self, index: int, timeout: float = 120.0) -> None:
        self.workers[index].start(timeout)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop(cleanup=False)
        self.master.stop(cleanup=False)
        if self._owns_dir:
            import shutil

            shutil.rmtree(self.data_dir, ignore_errors=True)

    def session_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """The settings a driver needs for this cluster: its master, executors sized to the workers, our
        interpreter and the project for Python on executors, every address on loopback."""
        return {
            "spark.master": self.url,
            "spark.executor.memory": executor_memory,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * len(self.workers)),
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYTHONPATH": str(project_root()),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
        }

    def session_builder(self, app: str = "cdc-tunnel", conf: Mapping[str, str] | None = None) -> Any:
        """A ``SparkSession.builder`` for a driver in this process, with :meth:`session_conf` (and ``conf``)."""
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName(app)
        for k, v in {**self.session_conf(), **(conf or {})}.items():
            builder = builder.config(k, v)
        return builder

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
