"""The examples that need no server end to end (short), each in a subprocess: `make demo` must keep working.
The ones that use a server are tested in that backend's folder (e.g. tests/backends/kafka/test_example.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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

