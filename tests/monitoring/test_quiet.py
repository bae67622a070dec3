"""Quiet by default: a ``cdc`` command prints what was asked, not the tablestore SDK's import-time warning
about its optional C++ codec; ``-v`` still shows it.

The commands themselves no longer import the SDK (the local server speaks the protocol without it), so the
check runs the command line's entry point in a fresh interpreter and then imports the SDK there, as a
command that needs it (the server's admin client) does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import sys
from cdc.cli import main
main.main(args=sys.argv[1:], standalone_mode=False)
import tablestore  # what a command that talks to a server through the SDK does
"""


def _cdc_then_sdk(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow  # two interpreters that import the SDK: seconds each
def test_cdc_commands_do_not_print_the_sdks_codec_warning() -> None:
    out = _cdc_then_sdk("server", "tablestore", "--help")
    assert out.returncode == 0 and "Usage:" in out.stdout, out.stderr
    assert "Native C++" not in out.stderr, out.stderr
    assert "Native C++" in _cdc_then_sdk("-v", "server", "tablestore", "--help").stderr  # with -v
