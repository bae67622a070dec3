"""How the suite runs on pytest-xdist workers (``make test``: ``-n 2 --dist loadgroup``); ``tests/conftest.py``
registers this plugin.

**Groups are checked.** ``tests/conftest.py`` puts the tests of each heavy server (a broker, a database, a
cluster) into one ``xdist_group``, so that one worker starts it once per run. pytest-xdist's ``loadgroup``
schedules by the group it appends to each test's id (``<id>@<group>``); a pytest it cannot do that with
(pytest 9.2, with pytest-xdist 3.8) silently schedules every test alone, and each worker then starts every
server. A worker whose grouped tests lack the suffix stops the run with an error naming the versions.

**A crashed worker's test runs once more.** A test whose worker process died (a segmentation fault in a native
client library, an out-of-memory kill) is reported failed by pytest-xdist, which then runs the unfinished rest
of its unit of work again on a new worker, the crashed test included (after every crash, up to its limit of
worker restarts). Here the first crash of a test is reported as ``rerun`` instead (the letter ``R``, "1 rerun"
in the summary line), named at once on stderr (a run cut short by a time limit never prints its summary), and
does not fail the run: the test's next run decides. A second crash of the same test is reported failed, so a
test that crashes its worker every time still fails the run. Why: a worker died once of a segmentation fault
in the Apache Pulsar tests (the C++ client behind ``pulsar-client`` has known crashes while it closes, e.g.
apache/pulsar-client-cpp#550), which says nothing about the test's claim; pytest-rerunfailures cannot rerun
crashed tests under ``--dist loadgroup`` (its scheduler has no ``mark_test_pending``).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

_crashed: set[str] = set()


def _stopping(config: pytest.Config) -> bool:
    """Whether the run is stopping: a worker that received a keyboard interrupt makes pytest-xdist stop it."""
    return bool(getattr(config.pluginmanager.getplugin("dsession"), "shouldstop", False))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on pytest-xdist's workers under --dist loadgroup
        return
    for item in items:
        groups = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        if groups and not item.nodeid.endswith("@" + "_".join(groups)):
            from importlib.metadata import version

            message = (
                f"pytest-xdist did not put {item.nodeid} into its group {'_'.join(groups)!r} (pytest "
                f"{version('pytest')}, pytest-xdist {version('pytest-xdist')}): install the versions the "
                "dev extra of pyproject.toml names (make install)"
            )
            # A worker's error reaches the controller only as an internal error without the message: say it here.
            print(message, file=sys.__stderr__, flush=True)
            raise pytest.UsageError(message)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: Any, sched: Any) -> None:
    """Name the crashed test at once, on the controller's stderr (a run cut short by its time limit never
    prints its summary), and report its first crash as ``rerun``. A worker ended by a keyboard interrupt
    (Ctrl-C; a controller started in the background ignores it, its workers do not) did not crash: the run is
    stopping, and pytest-xdist's own report stands."""
    if _stopping(sched.config):
        return
    if crashitem in _crashed:
        print(
            f"\nA pytest-xdist worker crashed again while running {crashitem}: failed",
            file=sys.stderr,
            flush=True,
        )
        return
    _crashed.add(crashitem)
    report.outcome = "rerun"
    report.longrepr = f"{report.longrepr}; it runs once more on a new worker"
    print(
        f"\nA pytest-xdist worker crashed while running {crashitem}; it runs once more",
        file=sys.stderr,
        flush=True,
    )


def pytest_report_teststatus(report: Any, config: Any) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
    if getattr(report, "outcome", None) == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None
