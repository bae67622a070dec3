"""Shared helpers for tests that run streaming queries: in this process's Spark session, or as a separate
driver process that a test can ``kill -9`` (``tests/drivers/stream_to_parquet.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).parent / "drivers" / "stream_to_parquet.py"


def start_query(spark: Any, options: Mapping[str, Any], out: Path, ck: Path, **trigger: Any) -> Any:
    """``format("cdc")`` with ``options`` into parquet at ``out``, in this process's session; ``trigger`` as
    ``DataStreamWriter.trigger`` takes it (default: every 200 ms, what :func:`start_driver`'s process runs, for
    a driver that no test kills). Stop it with ``query.stop()``."""
    reader = spark.readStream.format("cdc")
    for k, v in options.items():
        reader = reader.option(k, v)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(**(trigger or {"processingTime": "200 milliseconds"}))
        .start()
    )


def run_available_now(spark: Any, options: Mapping[str, Any], out: Path, ck: Path, timeout: float = 300) -> Any:
    """Run ``format("cdc")`` with ``options`` into parquet at ``out`` until caught up (``Trigger.AvailableNow``);
    returns the query's exception (``None`` when it succeeded)."""
    q = start_query(spark, options, out, ck, availableNow=True)
    try:
        q.awaitTermination(timeout)
    except Exception:  # noqa: BLE001 - the failure is returned through q.exception()
        pass
    return q.exception()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def committed_batches(ck: Path) -> int:
    commits = ck / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def driver_args(options: Mapping[str, Any], out: Path, ck: Path, mode: str) -> list[str]:
    return [sys.executable, str(DRIVER), json.dumps(dict(options)), str(out), str(ck), mode]


def start_driver(options: Mapping[str, Any], out: Path, ck: Path, env: Mapping[str, str] | None = None,
                 ) -> subprocess.Popen[bytes]:
    """A driver process streaming forever (a trigger every 200 ms), in its own process group."""
    return subprocess.Popen(
        driver_args(options, out, ck, "forever"),
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_driver(proc: subprocess.Popen[bytes]) -> None:
    """``kill -9`` of the driver and its Python workers, mid-stream."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def run_driver_once(options: Mapping[str, Any], out: Path, ck: Path, env: Mapping[str, str] | None = None) -> None:
    """A driver process that runs until caught up (``Trigger.AvailableNow``) from the same checkpoint."""
    subprocess.run(
        driver_args(options, out, ck, "once"),
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )
