"""Real Debezium output (issue 15): Debezium's embedded engine (3.6.1.Final, PostgreSQL connector, pgoutput)
captures a PostgreSQL table's snapshot, inserts, updates, deletes with their tombstones, a primary-key change
and a truncate, with and without schemas; the events go to Apache Pulsar the way Debezium Server's Pulsar
sink sends them, and our source reads them into Delta, which must equal ``SELECT *`` of the table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import TruncateError
from cdc.planner import Planner
from cdc.servers.pulsar import ApachePulsar
from cdc.testing import batches
from sinks.delta import DeltaUpsertSink, read
from tests.backends.pulsar.helpers import backend, close_all, drain
from tests.debezium.conftest import Database
from tests.debezium.engine import Event, engines, publish

TABLE = "public.items"
COLUMNS = ("id", "name", "qty", "price", "ok", "day", "at")
# What a user gives as valueSchema when the envelopes carry no schema (converter schemas.enable=false):
# PostgreSQL integer -> int, bigint -> long, double precision -> double, date -> days (io.debezium.time.Date),
# timestamp(6) -> epoch microseconds (io.debezium.time.MicroTimestamp, time.precision.mode=adaptive).
VALUE_SCHEMA = json.dumps({"type": "record", "name": "items", "fields": [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "qty", "type": ["null", "long"]},
    {"name": "price", "type": ["null", "double"]},
    {"name": "ok", "type": ["null", "boolean"]},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
]})
SNAPSHOT_ROWS, CHANGES = 5, 9  # see captured()


class Captured:
    def __init__(self, events: dict[bool, list[Event]], truncates: dict[bool, Event], rows: list[tuple[Any, ...]],
                 after: dict[bool, list[Event]], rows_after: list[tuple[Any, ...]]):
        self.events, self.truncates, self.rows = events, truncates, rows
        self.after, self.rows_after = after, rows_after  # the inserts after the truncate, SELECT * after them


@pytest.fixture(scope="module")
def captured(debezium_db: Database, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """Two engines (schemas on and off) over one table: a snapshot of 5 rows, then 9 change events, then a
    truncate; ``rows`` is ``SELECT *`` before the truncate."""
    work = tmp_path_factory.mktemp("debezium")
    with debezium_db.connect() as db:
        db.execute("DROP TABLE IF EXISTS items")
        db.execute("CREATE TABLE items (id integer PRIMARY KEY, name text, qty bigint, price double precision, "
                   "ok boolean, day date, at timestamp(6))")
        db.execute("INSERT INTO items SELECT i, 'row ' || i, i * 10, i / 4.0, i % 2 = 0, DATE '2024-01-01' + i, "
                   "TIMESTAMP '2024-01-01 00:00:00.000001' + i * INTERVAL '1 hour 1 microsecond' "
                   "FROM generate_series(1, 5) i")
        started = list(engines(work, debezium_db, TABLE, ("dbz_schemas", True), ("dbz_plain", False)))
        try:
            for e in started:
                e.wait_for(SNAPSHOT_ROWS)
            db.execute("INSERT INTO items VALUES (6, 'six', NULL, NULL, NULL, NULL, NULL), "
                       "(7, 'seven', 70, -1.5e300, true, DATE '1969-12-31', TIMESTAMP '1960-06-01 12:00:00.5')")  # 2
            db.execute("UPDATE items SET name = NULL, qty = qty + 1 WHERE id = 2")  # 1
            db.execute("UPDATE items SET price = 2.25, ok = NOT ok, day = day + 400 WHERE id = 3")  # 1
            db.execute("DELETE FROM items WHERE id = 4")  # delete + tombstone: 2
            db.execute("UPDATE items SET id = 50 WHERE id = 5")  # delete + tombstone + create: 3
            rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM items ORDER BY id").fetchall()
            db.execute("TRUNCATE items")
            db.execute("INSERT INTO items (id, name) VALUES (2, 'two again'), (8, 'eight')")  # 2
            rows_after = db.execute(f"SELECT {', '.join(COLUMNS)} FROM items ORDER BY id").fetchall()
            total = SNAPSHOT_ROWS + CHANGES + 1 + 2
            events = {e.schemas: e.wait_for(total) for e in started}
        finally:
            for e in started:
                e.stop()
    cut = SNAPSHOT_ROWS + CHANGES
    yield Captured({k: v[:cut] for k, v in events.items()}, {k: v[cut] for k, v in events.items()}, rows,
                   {k: v[cut + 1:] for k, v in events.items()}, rows_after)


def test_the_engine_emits_every_kind_of_event(captured: Captured) -> None:
    for schemas, events in captured.events.items():
        ops = [json.loads(e.value)["payload" if schemas else "op"] if e.value else None for e in events]
        ops = [(o["op"] if isinstance(o, dict) else o) if o is not None else "tombstone" for o in ops]
        assert ops == ["r"] * 5 + ["c", "c", "u", "u", "d", "tombstone", "d", "tombstone", "c"], (schemas, ops)


def _as_source_row(row: Any) -> tuple[Any, ...]:
    values = [row[c] for c in COLUMNS]
    if values[-1] is not None:  # Delta holds UTC timestamps; the PostgreSQL column has no zone
        values[-1] = values[-1].astimezone(UTC).replace(tzinfo=None) if values[-1].tzinfo else values[-1]
    return tuple(values)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("schemas", [True, False], ids=["schema+payload", "plain envelope"])
def test_real_events_stream_into_delta_equal_to_the_table(
    captured: Captured, apache_pulsar: ApachePulsar, spark: Any, tmp_path: Path, schemas: bool
) -> None:
    topic = f"persistent://public/default/dbz-{'schemas' if schemas else 'plain'}-{tmp_path.name}"
    publish(apache_pulsar.url, topic, captured.events[schemas])
    reader = (spark.readStream.format("cdc").option("backend", "pulsar").option("service.url", apache_pulsar.url)
              .option("topic", topic).option("valueFormat", "debezium").option("changeKeys", "id")
              .option("maxRecordsPerTrigger", "4"))
    if not schemas:
        reader = reader.option("valueSchema", VALUE_SCHEMA)
    table = tmp_path / "items"
    q = (reader.load().writeStream.foreachBatch(DeltaUpsertSink(str(table), keys=["id"]))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None
    rows = read(spark, str(table)).collect()
    assert sorted(_as_source_row(r) for r in rows) == [tuple(r) for r in captured.rows]
    # _commit_ts is the source's commit time of the row's last change (source.ts_us), not when Debezium ran
    last: dict[int, int] = {}
    for e in captured.events[schemas]:
        if e.value:
            env = json.loads(e.value)["payload"] if schemas else json.loads(e.value)
            if env["after"] is not None:
                last[env["after"]["id"]] = env["source"]["ts_us"]
    assert {r["id"]: r["_commit_ts"].replace(tzinfo=UTC) for r in rows} == {
        k: datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=v) for k, v in last.items() if k in
        {r["id"] for r in rows}}


def test_a_real_truncate_fails_the_query_naming_the_table(captured: Captured, apache_pulsar: ApachePulsar,
                                                           tmp_path: Path) -> None:
    topic = f"persistent://public/default/dbz-truncate-{tmp_path.name}"
    ids = publish(apache_pulsar.url, topic, [*captured.events[True][-3:], captured.truncates[True]])
    mid = ids[-1]
    try:
        with pytest.raises(TruncateError, match=rf"message \[{mid.ledger_id()}, {mid.entry_id()}, -1\].*"
                                                r"truncate of table dbz_\w+\.public\.items"):
            drain(backend(apache_pulsar.url, topic, valueFormat="debezium", changeKeys="id"))
    finally:
        close_all()


@pytest.mark.parametrize("per_batch", [3, 100], ids=["truncate-in-its-own-batch", "truncate-mid-batch"])
def test_a_real_truncate_applied_empties_delta_in_order(captured: Captured, apache_pulsar: ApachePulsar,
                                                        tmp_path: Path, per_batch: int) -> None:
    """debezium.truncate=apply: the rows before the truncate go, the inserts after it stay; a replay of every
    batch (a crash before Spark recorded them) changes nothing."""
    topic = f"persistent://public/default/dbz-truncate-apply-{tmp_path.name}"
    publish(apache_pulsar.url, topic, [*captured.events[True], captured.truncates[True], *captured.after[True]])
    sink = DeltaUpsertSink(str(tmp_path / "t"), keys=["id"], app_id="truncate")
    try:
        b = backend(apache_pulsar.url, topic, valueFormat="debezium", changeKeys="id",
                    **{"debezium.truncate": "apply"})
        planned = list(batches(b, Planner(b).initial("earliest"), per_batch))
    finally:
        close_all()
    assert sum(c.num_rows for _, c in planned) == SNAPSHOT_ROWS + CHANGES - 2 + 1 + 2  # tombstones skipped
    ops = [c.sort_by("_seq").column("_op").to_pylist() for _, c in planned]
    assert sum(o.count("truncate") for o in ops) == 1
    assert all(o.index("truncate") == 0 for o in ops if "truncate" in o), ops  # a batch ends right before it
    assert any(o[-1] != "truncate" for o in ops)
    for replay in (False, True):
        for batch_id, (_, changes) in enumerate(planned):
            assert sink.write(changes, batch_id) is not replay
        live = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
        assert sorted(_as_source_row(r) for r in live) == [tuple(r) for r in captured.rows_after]
        state = DeltaTable(str(tmp_path / "t" / "_cdc_state")).to_pyarrow_table()
        assert sorted(state.column("id").to_pylist()) == [2, 8]


# ------------------------------------------------------------------------------------- model-based check
_KEYS = st.integers(1, 6)
_VALUES = st.fixed_dictionaries({
    "name": st.none() | st.text(max_size=5), "qty": st.none() | st.integers(-(2**63), 2**63 - 1),
    "price": st.none() | st.floats(allow_nan=False, allow_infinity=False), "ok": st.none() | st.booleans(),
    "day": st.none() | st.integers(-719162, 2932896), "at": st.none() | st.integers(-62135596800000000, 253402300799999999),
})
_STEPS = st.lists(st.tuples(st.sampled_from(["upsert", "delete"]), _KEYS, _VALUES), min_size=1, max_size=25)


def _events_like(real: list[Event], schemas: bool, steps: list[tuple[str, int, dict[str, Any]]]) -> tuple[
        list[Event], dict[int, dict[str, Any]]]:
    """Events for ``steps`` made from the engine's own events (one of each op as the template, so every field
    Debezium writes is there), and the table they leave behind."""
    templates = {_op(e, schemas): e for e in real if e.value}
    model: dict[int, dict[str, Any]] = {}
    out: list[Event] = []
    for kind, key, values in steps:
        row = {"id": key, **values}
        if kind == "upsert":
            op = "u" if key in model else "c"
            out.append(_event(templates[op], schemas, op, model.get(key), row))
            model[key] = row
        elif key in model:
            out.append(_event(templates["d"], schemas, "d", {"id": key, **dict.fromkeys(values)}, None))
            out.append(Event(json.dumps({"id": key}).encode(), b""))
            del model[key]
    return out, model


def _op(event: Event, schemas: bool) -> str:
    doc = json.loads(event.value)
    return str((doc["payload"] if schemas else doc)["op"])


def _event(template: Event, schemas: bool, op: str, before: Any, after: Any) -> Event:
    doc = json.loads(template.value)
    env = doc["payload"] if schemas else doc
    env.update(op=op, before=before, after=after)
    key = {"id": (after or before)["id"]}
    return Event(json.dumps({"schema": json.loads(template.key)["schema"], "payload": key} if schemas else key)
                 .encode(), json.dumps(doc).encode())


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(steps=_STEPS, schemas=st.booleans(), per_batch=st.integers(1, 8))
def test_any_sequence_of_debezium_events_leaves_delta_equal_to_a_model(
    captured: Captured, apache_pulsar: ApachePulsar, tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, int, dict[str, Any]]], schemas: bool, per_batch: int,
) -> None:
    events, model = _events_like(captured.events[schemas], schemas, steps)
    work = tmp_path_factory.mktemp("model")
    topic = f"persistent://public/default/dbz-model-{work.name}"
    if not events:
        return
    publish(apache_pulsar.url, topic, events)
    options: dict[str, Any] = {"valueFormat": "debezium", "changeKeys": "id"}
    if not schemas:
        options["valueSchema"] = VALUE_SCHEMA
    try:
        b = backend(apache_pulsar.url, topic, **options)
        sink = DeltaUpsertSink(str(work / "t"), keys=["id"], app_id="model")
        for batch_id, (_, changes) in enumerate(batches(b, Planner(b).initial("earliest"), per_batch)):
            sink.write(changes, batch_id)
    finally:
        close_all()
    live = DeltaTable(str(work / "t")).to_pyarrow_table()  # the sink's main table holds only live rows
    got = {r["id"]: {c: r[c] for c in COLUMNS[1:]} for r in live.to_pylist()}
    expected = {k: _as_table_values(v) for k, v in model.items()}
    assert got == expected


def _as_table_values(row: dict[str, Any]) -> dict[str, Any]:
    out = {c: row[c] for c in COLUMNS[1:]}
    if out["day"] is not None:
        out["day"] = date(1970, 1, 1) + timedelta(days=out["day"])
    if out["at"] is not None:
        out["at"] = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=out["at"])
    return out
