"""examples/postgres_to_delta.py end to end (short): its own PostgreSQL, Spark, two Delta tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_postgres_to_delta_example_ends_with_equal_tables(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "postgres_to_delta.py"), "--dir", str(tmp_path / "ex"),
         "--seconds", "4"],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RESULT: both Delta tables equal SELECT * of their PostgreSQL tables" in out.stdout
