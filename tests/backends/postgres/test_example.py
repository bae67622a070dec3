"""examples/postgres_to_delta.py end to end (short): its own PostgreSQL, Spark, two Delta tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples_run import run_example


@pytest.mark.slow
def test_postgres_to_delta_example_ends_with_equal_tables(tmp_path: Path) -> None:
    run_example("postgres_to_delta.py", "--dir", str(tmp_path / "ex"), "--seconds", "4",
                result="both Delta tables equal SELECT * of their PostgreSQL tables", timeout=600)
