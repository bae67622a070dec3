"""The shared backend contract against the PostgreSQL backend: a real server, a real logical replication
slot (pgoutput), rows written by psycopg. Channels do not split or merge (one slot, one stream)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.testing import BackendContract, ChunkedSnapshotContract, Harness
from tests.backends.postgres.harness import PostgresHarness


@pytest.fixture
def harness(postgres_dsn: str) -> Iterator[Harness]:
    h = PostgresHarness(postgres_dsn)
    yield h
    h.close()


class TestPostgresContract(BackendContract):
    pass

    def test_acknowledge_is_harmless(self, harness: Harness) -> None:
        # Overrides the suite's version, which drains from earliest after acknowledging everything: here an
        # acknowledgement *is* the slot's consumption (the design: advance on commit so PostgreSQL
        # can recycle WAL), so earliest moves with it. What stays true: acknowledging twice is idempotent,
        # nothing after the acknowledged position is lost, and asking for a position before it is a
        # DataLossError, never a silently shorter read.
        from cdc.errors import DataLossError
        from cdc.testing import drain, read_range

        harness.append(10)
        backend = harness.backend()
        before = backend.earliest("changes")
        positions = {ch.id: backend.latest(ch.id) for ch in backend.list_channels()}
        backend.acknowledge(positions)
        backend.acknowledge(positions)
        assert harness.backend().earliest("changes") == positions["changes"]
        harness.append(7)
        assert sum(t.num_rows for t in drain(harness.backend())) == 7
        with pytest.raises(DataLossError):
            backend.plan("changes", before)
        with pytest.raises(DataLossError):
            read_range(backend, "changes", before, positions["changes"])


class TestPostgresChunkedSnapshotContract(ChunkedSnapshotContract):
    @pytest.fixture
    def harness(self, postgres_dsn: str, tmp_path: Path) -> Iterator[Harness]:
        h = PostgresHarness(postgres_dsn, **{"snapshot.path": str(tmp_path / "snap")})
        yield h
        h.close()
