"""`make demo` must keep working: run the orders demo end to end (short) in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_orders_demo_ends_with_the_delta_table_equal_to_the_source(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "orders_demo.py"), "--dir", str(tmp_path / "demo"), "--seconds", "4"],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RESULT: the Delta table equals the source table" in out.stdout
    assert "split a channel mid-run" in out.stdout


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_offset_recovery_example_kill_restart_and_new_query(tmp_path: Path) -> None:
    out = _run("offset_recovery.py", "--dir", str(tmp_path / "rec"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "killed the query (SIGKILL)" in out.stdout
    assert "RESULT: every change exactly once" in out.stdout


@pytest.mark.slow
def test_windowed_orders_example_stream_equals_batch(tmp_path: Path) -> None:
    out = _run("windowed_orders.py", "--dir", str(tmp_path / "win"), "--seconds", "4")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RESULT: every closed window equals the batch job's, and every late change was dropped" in out.stdout
    assert (tmp_path / "win" / "windows.png").stat().st_size > 10_000


@pytest.mark.slow
def test_kafka_debezium_example_ends_with_the_delta_table_equal_to_the_source(
    tmp_path: Path, kafka_connect: Any, postgres_server: Any
) -> None:
    """On the session's Kafka, Kafka Connect and PostgreSQL (the example starts its own without the flags)."""
    dsn = str(postgres_server.create_database("kafka_example"))
    out = _run("kafka_debezium_to_delta.py", "--dir", str(tmp_path / "kafka"), "--seconds", "6",
               "--bootstrap", kafka_connect.kafka.bootstrap, "--connect", kafka_connect.url, "--postgres", dsn)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RESULT: the Delta table equals SELECT * of the PostgreSQL table" in out.stdout
