"""Running one of ``examples/`` end to end, as a user runs it: ``python examples/<script> ...`` in a subprocess
with this interpreter for Spark's Python workers. Every example ends with a checked ``RESULT:`` line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(script: str, *args: str, result: str, timeout: float = 900) -> str:
    """Run ``examples/<script>`` with ``args``; assert it exits 0 and prints ``RESULT: <result>``; return its
    standard output."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"RESULT: {result}" in out.stdout, out.stdout[-3000:]
    return out.stdout
