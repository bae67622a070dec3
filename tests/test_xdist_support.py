"""The suite's own pytest-xdist plugin (``tests/xdist_support.py``), on real pytest-xdist workers (that really
die of a segmentation fault)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


SLEEPING = """
import os, signal, time
from pathlib import Path

def test_sleeps():
    # as a Spark session does (pyspark's SparkContext turns Ctrl-C into cancelling its jobs), even where the
    # process inherited an ignored SIGINT
    signal.signal(signal.SIGINT, signal.default_int_handler)
    (Path(os.environ["CRASH_MARKERS"]) / "started").write_text("")
    time.sleep(120)
"""


def _command(tmp_path: Path, files: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    markers = tmp_path / "runs"
    markers.mkdir()
    return (
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "tests.xdist_support"]
        + ["-p", "no:cacheprovider", "-o", "addopts=", "-q", "-rA", str(tmp_path / "test_crashing.py")],
        {**os.environ, "PYTHONPATH": str(ROOT), "CRASH_MARKERS": str(markers)},
    )


def pytest_xdist(tmp_path: Path, **files: str) -> subprocess.CompletedProcess[str]:
    command, env = _command(tmp_path, files)
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)


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


def test_workers_stopped_by_ctrl_c_are_not_called_crashed(tmp_path: Path) -> None:
    """A run started in the background (``make test &``) ignores Ctrl-C in its controller; the workers stop."""
    command, env = _command(tmp_path, {"test_crashing.py": SLEEPING})
    run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "runs" / "started").exists():
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.1)
        workers = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, workers
        for pid in workers:
            os.kill(int(pid), signal.SIGINT)  # the busy one stops; the idle one ignores it
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    log = stdout + stderr
    assert "node down: keyboard-interrupt" in log, log
    assert "runs once more" not in log and "replacing crashed worker" not in log, log
    assert run.returncode == 2, log  # interrupted
