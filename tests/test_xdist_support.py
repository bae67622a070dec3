"""The suite's own pytest-xdist plugin (``tests/xdist_support.py``), on real pytest-xdist workers (that really
die of a segmentation fault)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CRASHING = """
import os, signal
from pathlib import Path

import pytest

@pytest.mark.xdist_group("crashing")  # one crash at a time (xdist fails internally when two workers are replaced at once)
@pytest.mark.parametrize("crashes", [1, 2])
def test_crashes(crashes):
    marker = Path(os.environ["CRASH_MARKERS"]) / str(crashes)
    runs = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(runs + 1))
    if runs < crashes:
        os.kill(os.getpid(), signal.SIGSEGV)

def test_beside():
    pass
"""

# Stands for a pytest that keeps the test ids where pytest-xdist cannot append the group (this conftest's hook
# runs after pytest-xdist's, which the worker registers later).
UNGROUPING = """
def pytest_collection_modifyitems(items):
    for item in items:
        item._nodeid = item._nodeid.split("@")[0]
"""


def pytest_xdist(tmp_path: Path, **files: str) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    markers = tmp_path / "runs"
    markers.mkdir()
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "tests.xdist_support"]
        + ["-p", "no:cacheprovider", "-o", "addopts=", "-q", "-rA", str(tmp_path / "test_crashing.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CRASH_MARKERS": str(markers)},
    )


def test_a_crashed_worker_s_test_runs_again_and_a_second_crash_fails_the_run(tmp_path: Path) -> None:
    out = pytest_xdist(tmp_path, **{"test_crashing.py": CRASHING})
    log = out.stdout + out.stderr
    assert out.returncode == 1, log  # the test that crashed twice fails the run
    # pytest-xdist runs a crashed test again on a new worker after every crash; each passed in the end
    assert {p.name: int(p.read_text()) for p in (tmp_path / "runs").iterdir()} == {"1": 2, "2": 3}
    assert (
        "crashed while running test_crashing.py::test_crashes[1]@crashing; it runs once more" in out.stderr
    ), log
    assert "crashed again while running test_crashing.py::test_crashes[2]@crashing: failed" in out.stderr, log
    assert "FAILED test_crashing.py::test_crashes[2]@crashing" in out.stdout, log
    assert "FAILED test_crashing.py::test_crashes[1]@crashing" not in out.stdout, log
    assert "1 failed, 3 passed, 2 rerun" in out.stdout, log


def test_tests_that_pytest_xdist_failed_to_group_stop_the_run_by_name(tmp_path: Path) -> None:
    out = pytest_xdist(tmp_path, **{"test_crashing.py": CRASHING, "conftest.py": UNGROUPING})
    log = out.stdout + out.stderr
    assert out.returncode != 0, log
    assert "pytest-xdist did not put test_crashing.py::test_crashes[1] into its group 'crashing'" in log, log
    assert not (tmp_path / "runs" / "1").exists()  # nothing ran
