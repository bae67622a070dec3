"""PostgreSQL killed with ``kill -9`` under a running Spark streaming query: the query fails or stalls, the
server restarts (same data, the slot survives), the query restarts from its checkpoint, and the output holds
every change exactly once (Spark's file sink commits with its own log, the slot moves only on commit)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.backends.postgres.harness import PostgresHarness


def _start(spark: Any, options: dict[str, str], out: Path, checkpoint: Path, available_now: bool) -> Any:
    reader = spark.readStream.format("cdc")
    for k, v in options.items():
        reader = reader.option(k, v)
    writer = (reader.load().select("id", "_op", "_seq").writeStream.format("parquet")
              .option("path", str(out)).option("checkpointLocation", str(checkpoint)))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_postgres_kill_9_under_a_running_streaming_query(
    spark: Any, postgres_server: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    h = PostgresHarness(postgres_dsn, **{"slot.name": "server_kill"})
    options = {**h.options, "backend": "postgres", "startingOffsets": "earliest"}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    try:
        h.txn_size = 10
        h.append(200)
        query = _start(spark, {**options, "maxRecordsPerTrigger": "10"}, out, checkpoint, available_now=False)
        try:
            # Killed mid-stream: some batches committed, most of the backlog not yet read.
            assert _wait(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 20, 120)
            postgres_server.kill()
            assert sum(p["numInputRows"] for p in query.recentProgress) < 200
            h.conn.close()
            # The query fails on its next batch (or stalls on a connection); either way it is stopped.
            _wait(lambda: not query.isActive, 10)
        finally:
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - a query that failed reports its error on stop; expected here
                pass
        postgres_server.start()
        h.conn = psycopg.connect(postgres_dsn, autocommit=True)
        h.append(100)
        final = _start(spark, options, out, checkpoint, available_now=True)
        final.awaitTermination(240)
        assert final.exception() is None
        rows = spark.read.parquet(str(out)).collect()
        ids = sorted(r["id"] for r in rows)
        assert ids == list(range(300)), (len(ids), len(set(ids)))  # nothing lost, nothing duplicated
        assert {r["_op"] for r in rows} == {"insert"}
    finally:
        h.close()
