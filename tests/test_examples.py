"""`make demo` must keep working: run the orders demo end to end (short) in a subprocess."""

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
