"""Unchanged TOASTed values through real Debezium events: the histories of
tests/backends/postgres/test_toasted_key_changes.py (inserts, updates touching the ~5 KB text or not, key
changes once and twice, swaps, deletes, re-inserts) run on PostgreSQL under ``REPLICA IDENTITY DEFAULT``
(Debezium sends its ``__debezium_unavailable_value`` placeholder for the unchanged text, and a key change as
a delete, a tombstone and a create) and ``FULL`` (Debezium sends the values); Debezium's embedded engine
(pgoutput) captures them, they go to Apache Pulsar as Debezium Server's Pulsar sink sends them, and a
streaming query (``valueFormat=debezium``) applies them with ``DeltaUpsertSink`` (delta-rs) under both SCD
types; the placeholders become the change model's ``_unchanged`` columns, which the delta-spark engine meets
from PostgreSQL's own stream in tests/backends/postgres/test_toasted_key_changes.py. The Delta table must equal ``SELECT *``: never the placeholder, never a null PostgreSQL did not
hold.

One engine captures one table for the whole module; each example works on keys of its own and publishes
its events to a topic of its own, each phase's before a query (Trigger.AvailableNow) reads them, so that a key
change's delete and create share a batch."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.servers.pulsar import ApachePulsar
from sinks.delta import DeltaUpsertSink
from tests.backends.postgres.toasted import HISTORIES, KEYS, History, Op, delta_rows, first_difference
from tests.debezium.conftest import Database
from tests.debezium.engine import DebeziumEngine, Event, publish

VALUE_SCHEMA = json.dumps({"type": "record", "name": "toast", "fields": [
    {"name": "id", "type": "int"}, {"name": "n", "type": ["null", "int"]}, {"name": "big", "type": ["null", "string"]}]})


class Capture:
    """The engine over ``public.toast`` (the examples' rows) and ``public.marks`` (a row after each phase, so
    that the phase's events are known to have all been emitted)."""

    def __init__(self, db: Database, work: Path) -> None:
        self.conn = psycopg.connect(db.dsn, autocommit=True)
        self.conn.execute("CREATE TABLE toast (id int PRIMARY KEY, n int, big text)")
        self.conn.execute("CREATE TABLE marks (id int PRIMARY KEY)")
        self.engine = DebeziumEngine(work, db, "public.toast,public.marks", "dbz_toast", schemas=False)
        self.marks = itertools.count(1)
        self.seen = 0

    def phase(self) -> list[Event]:
        """The events since the last call: every change committed before it, marks left out."""
        mark = next(self.marks)
        self.conn.execute("INSERT INTO marks VALUES (%s)", (mark,))
        while True:
            events = list(self.engine.events)
            at = next((i for i in range(self.seen, len(events)) if _mark_of(events[i]) == mark), None)
            if at is not None:
                out = [e for e in events[self.seen : at] if _mark_of(e) is None]
                self.seen = at + 1
                return out
            self.engine.wait_for(len(events) + 1)

    def close(self) -> None:
        self.engine.stop()
        self.conn.close()


def _mark_of(event: Event) -> int | None:
    if not event.value:
        return None
    env = json.loads(event.value)
    return int(env["after"]["id"]) if env["source"]["table"] == "marks" else None


@pytest.fixture(scope="module")
def capture(debezium_db: Database, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    c = Capture(debezium_db, tmp_path_factory.mktemp("dbz-toast"))
    try:
        c.phase()  # the engine is streaming
        yield c
    finally:
        c.close()


_examples = itertools.count(1)


SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
EXAMPLES = given(history=HISTORIES, identity=st.sampled_from(["DEFAULT", "FULL"]), scd_type=st.sampled_from([1, 2]))


@pytest.mark.spark
@settings(SLOW, max_examples=3)
@EXAMPLES
def test_debezium_key_changes_keep_unchanged_toasted_values_in_delta(
    capture: Capture, apache_pulsar: ApachePulsar, spark: Any, tmp_path_factory: pytest.TempPathFactory,
    history: tuple[int, list[list[list[Op]]]], identity: str, scd_type: int,
) -> None:
    _stream(capture, apache_pulsar, spark, tmp_path_factory, "delta-rs", history, identity, scd_type)


def _stream(capture: Capture, apache_pulsar: ApachePulsar, spark: Any, tmp_path_factory: pytest.TempPathFactory,
            engine: str, history: tuple[int, list[list[list[Op]]]], identity: str, scd_type: int) -> None:
    n = next(_examples)
    work = tmp_path_factory.mktemp(f"dbz-toast{n}")
    rows, phases = history
    h = History(capture.conn, "toast", base=n * (KEYS + 1))  # keys of its own
    h.start(identity, rows)
    topic = f"persistent://public/default/dbz-toast-{work.name}"
    sink = DeltaUpsertSink(str(work / "t"), keys=["id"], engine=engine, scd_type=scd_type)

    def apply(events: list[Event]) -> None:
        # The phase's events are all on the topic before a query looks: a query running while they are sent one
        # by one could end a batch between a key change's delete and its create (what Debezium's transaction
        # topic prevents for a running query: debezium.transactionTopic).
        if not events:
            return
        publish(apache_pulsar.url, topic, events)
        (spark.readStream.format("cdc").option("backend", "pulsar").option("service.url", apache_pulsar.url)
         .option("topic", topic).option("valueFormat", "debezium").option("changeKeys", "id")
         .option("valueSchema", VALUE_SCHEMA).load()
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "ck"))
         .trigger(availableNow=True).start().awaitTermination())

    apply(capture.phase())
    for transactions in phases:
        h.run(transactions)
        apply(capture.phase())
    got, expected = delta_rows(spark, work / "t"), h.rows()
    assert got == expected, first_difference(got, expected)
