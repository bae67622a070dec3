"""examples/mysql_to_delta.py end to end (short), on the session's MariaDB: a chunked snapshot of two tables
with a writer running, through Spark into two Delta tables, each equal to SELECT * at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples_run import run_example


@pytest.mark.slow
def test_mysql_to_delta_example_ends_with_equal_tables(mysql_dsn: str, tmp_path: Path) -> None:
    run_example("mysql_to_delta.py", "--dir", str(tmp_path / "ex"), "--seconds", "4", "--orders", "4000",
                "--dsn", mysql_dsn, result="both Delta tables equal SELECT * of their MariaDB tables", timeout=600)
