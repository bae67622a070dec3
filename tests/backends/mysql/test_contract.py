"""The shared backend contract against the MySQL backend: a real MariaDB, its row-based binary log read as a
replica reads it, rows written by PyMySQL. Channels do not split or merge (one binary log, one stream)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.testing import BackendContract, ChunkedSnapshotContract, Harness
from tests.backends.mysql.harness import MySQLHarness


@pytest.fixture
def harness(mysql_dsn: str) -> Iterator[Harness]:
    h = MySQLHarness(mysql_dsn)
    yield h
    h.close()


class TestMySQLContract(BackendContract):
    pass


class TestMySQLChunkedSnapshotContract(ChunkedSnapshotContract):
    @pytest.fixture
    def harness(self, mysql_dsn: str, tmp_path: Path) -> Iterator[Harness]:
        h = MySQLHarness(mysql_dsn, **{"snapshot.path": str(tmp_path / "snapshot")})
        yield h
        h.close()
