"""The examples that need no server end to end (short), each in a subprocess: `make demo` must keep working.
The ones that use a server are tested in that backend's folder (e.g. tests/backends/kafka/test_example.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples_run import run_example


@pytest.mark.slow
def test_orders_demo_ends_with_the_delta_table_equal_to_the_source(tmp_path: Path) -> None:
    out = run_example("orders_demo.py", "--dir", str(tmp_path / "demo"), "--seconds", "4",
                      result="the Delta table equals the source table", timeout=600)
    assert "split a channel mid-run" in out


@pytest.mark.slow
def test_offset_recovery_example_kill_restart_and_new_query(tmp_path: Path) -> None:
    out = run_example("offset_recovery.py", "--dir", str(tmp_path / "rec"), result="every change exactly once")
    assert "killed the query (SIGKILL)" in out


@pytest.mark.slow
def test_windowed_orders_example_stream_equals_batch(tmp_path: Path) -> None:
    run_example("windowed_orders.py", "--dir", str(tmp_path / "win"), "--seconds", "4",
                result="every closed window equals the batch job's, and every late change was dropped")
    assert (tmp_path / "win" / "windows.png").stat().st_size > 10_000
