"""``cdc server spark-cluster`` and ``cdc server spark-connect``: Spark's own servers on loopback, for
development (the test fixtures start the same classes)."""

from __future__ import annotations

import signal
import sys
import time

import click

from cdc.servers.process import starting
from cdc.servers.spark.cluster import SparkCluster
from cdc.servers.spark.connect import ConnectServer


def _serve_until_interrupted(running: object) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SIGTERM stops the servers too (finally blocks)
    try:
        while callable(running) and running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


@click.command("spark-cluster", help="Run a Spark standalone master and workers on 127.0.0.1 until interrupted.")
@click.option("--workers", type=int, default=2, show_default=True, help="Worker JVMs to start.")
@click.option("--cores", type=int, default=1, show_default=True, help="Cores each worker offers.")
@click.option("--memory", default="1g", show_default=True, help="Memory each worker offers to executors.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Logs and work directories (default: a temporary directory, removed on exit).")
def cluster_main(workers: int, cores: int, memory: str, data_dir: str | None) -> None:
    cluster = SparkCluster(workers, cores=cores, memory=memory, data_dir=data_dir)
    try:
        with starting(f"a Spark master and {workers} workers"):
            cluster.start()
        click.echo(f"Spark cluster at {cluster.url} ({workers} workers, web UI {cluster.webui_url}) in "
                   f"{cluster.last_start_s:.1f} s; logs {cluster.data_dir}; Ctrl-C to stop", err=True)
        click.echo(f"  spark-submit --master {cluster.url} " + " ".join(
            f"--conf {k}={v}" for k, v in cluster.session_conf().items() if k != "spark.master"), err=True)
        _serve_until_interrupted(lambda: cluster.master.running)
    finally:
        cluster.stop()


@click.command("spark-connect", help="Run a Spark Connect server on 127.0.0.1 until interrupted.")
@click.option("--port", type=int, default=15002, show_default=True, help="gRPC port (0 = a free port).")
@click.option("--master", default="local[2]", show_default=True, help="The server's Spark master.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Logs and work directories (default: a temporary directory, removed on exit).")
def connect_main(port: int, master: str, data_dir: str | None) -> None:
    server = ConnectServer(data_dir, port=port or None, master=master)
    try:
        with starting("a Spark Connect server"):
            server.start()
        click.echo(f"Spark Connect at {server.url} in {server.last_start_s:.1f} s (log {server.logfile}); "
                   "Ctrl-C to stop", err=True)
        _serve_until_interrupted(lambda: server.running)
    finally:
        server.stop()
