"""examples/mysql_to_delta.py end to end (short), on the session's MariaDB: a chunked snapshot of two tables
with a writer running, through Spark into two Delta tables, each equal to SELECT * at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_mysql_to_delta_example_ends_with_equal_tables(mysql_dsn: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mysql_to_delta.py"), "--dir", str(tmp_path / "ex"),
         "--seconds", "4", "--orders", "4000", "--dsn", mysql_dsn],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RESULT: both Delta tables equal SELECT * of their MariaDB tables" in out.stdout
