"""Unchanged TOASTed values through key changes, end to end: random transactions on a real PostgreSQL table
with a ~5 KB text column (stored out of line) insert, update (touching the text or not), change keys (once,
twice in one transaction, swapping two keys), delete and re-insert, under ``REPLICA IDENTITY DEFAULT`` (the
update's new row marks the text unchanged) and ``FULL`` (the logged old row holds it); a streaming query
(``format("cdc")``, ``startingOffsets=snapshot``, small micro-batches) applies them with ``DeltaUpsertSink``
on both engines and both SCD types, and the Delta table must equal ``SELECT *`` after the stream drains.

The same histories (:mod:`tests.backends.postgres.toasted`) through real Debezium events:
tests/debezium/test_toasted_key_changes.py."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sinks.delta import DeltaUpsertSink
from tests.backends.postgres.toasted import EVERY_KIND, HISTORIES, History, Op, delta_rows, first_difference

_examples = itertools.count()


SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
EXAMPLES = given(history=HISTORIES, identity=st.sampled_from(["DEFAULT", "FULL"]), scd_type=st.sampled_from([1, 2]),
                 per_trigger=st.integers(1, 6))


@pytest.mark.spark
@settings(SLOW, max_examples=4)
@EXAMPLES
def test_key_changes_keep_unchanged_toasted_values_in_delta(
    spark: Any, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory,
    history: tuple[int, list[list[list[Op]]]], identity: str, scd_type: int, per_trigger: int,
) -> None:
    _stream(spark, postgres_dsn, tmp_path_factory, "delta-rs", history, identity, scd_type, per_trigger)


# delta-spark: the history with every kind of statement in one batch under REPLICA IDENTITY DEFAULT, and one
# drawn from the same strategies. An example there costs one to three minutes on 2 busy cores (each of its
# batches is a few Spark jobs). What is the engine's own is the merge of a batch that the shared key-change
# rule resolved, the same whichever source sent the changes (Debezium's unavailable-value placeholders become
# the same `_unchanged` columns: tests/debezium/test_toasted_key_changes.py draws them on delta-rs); the rule is
# drawn four times on delta-rs above, with batch boundaries at every record, and
# tests/sinks/delta/test_delta_spark.py compares the engines' tables for the same changes.
@pytest.mark.spark
@settings(SLOW, max_examples=1)
@example(history=EVERY_KIND, identity="DEFAULT", scd_type=1, per_trigger=1)
@EXAMPLES
def test_key_changes_keep_unchanged_toasted_values_in_delta_spark(
    spark: Any, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory,
    history: tuple[int, list[list[list[Op]]]], identity: str, scd_type: int, per_trigger: int,
) -> None:
    _stream(spark, postgres_dsn, tmp_path_factory, "delta-spark", history, identity, scd_type, per_trigger)


def _stream(spark: Any, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory, engine: str,
            history: tuple[int, list[list[list[Op]]]], identity: str, scd_type: int, per_trigger: int) -> None:
    n = next(_examples)
    # delta-spark runs a few Spark jobs per batch: its examples take one batch per phase (the snapshot, then
    # each phase's transactions whole), so every key change, chain and swap of a phase meets the engine's merge
    # inside one batch, and its TOASTed values cross the batch boundaries between phases. Batch boundaries at
    # every record are exercised on delta-rs (the key-change rule is shared).
    limit = {} if engine == "delta-spark" else {"maxRecordsPerTrigger": str(per_trigger)}
    work = tmp_path_factory.mktemp(f"toast{n}")
    rows, phases = history
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        h = History(conn, f"toast_{n}")
        h.create()
        h.start(identity, rows)
        sink = DeltaUpsertSink(str(work / "t"), keys=["id"], engine=engine, scd_type=scd_type)
        query = (spark.readStream.format("cdc").option("backend", "postgres").option("dsn", postgres_dsn)
                 .option("tables", f"public.toast_{n}").option("slot.name", f"toast_{n}")
                 .option("startingOffsets", "snapshot").option("snapshot.path", str(work / "snapshots"))
                 .options(**limit).load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "ck")).start())
        try:
            query.processAllAvailable()  # the snapshot; the slot holds every later change
            for transactions in phases:
                h.run(transactions)
                query.processAllAvailable()
        finally:
            query.stop()
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (f"toast_{n}",))
        got, expected = delta_rows(spark, work / "t"), h.rows()
        assert got == expected, first_difference(got, expected)

