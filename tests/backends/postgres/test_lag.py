"""Lag per channel on the PostgreSQL backend: WAL bytes between the query's position and the flushed WAL."""

from __future__ import annotations

from cdc.planner import Planner
from tests.backends.postgres.harness import PostgresHarness


def test_heads_measure_wal_bytes_behind(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        backend = h.backend()
        planner = Planner(backend)
        start = planner.initial("earliest")
        pos = start["channels"]["changes"]["pos"]
        h.append(200)
        behind = backend.heads({"changes": pos})["changes"]
        assert behind.behind is None and behind.measures["walBytesBehind"] > 200 * 20  # 200 inserted rows
        end = planner.next(start, None)
        caught_up = backend.heads({"changes": end["channels"]["changes"]["pos"]})["changes"]
        assert caught_up.measures["walBytesBehind"] < behind.measures["walBytesBehind"] / 10
    finally:
        h.close()
