"""Quiet by default: a ``cdc`` command prints what was asked, not the tablestore SDK's import-time warning
about its optional C++ codec; ``-v`` still shows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cdc(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "cdc", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow  # two interpreters that import the SDK: seconds each
def test_cdc_commands_do_not_print_the_sdks_codec_warning() -> None:
    out = _cdc("server", "tablestore", "--help")  # imports the SDK (the server's admin client uses it)
    assert out.returncode == 0 and "Usage:" in out.stdout
    assert "Native C++" not in out.stderr, out.stderr
    assert "Native C++" in _cdc("-v", "server", "tablestore", "--help").stderr  # the SDK's message, with -v
