"""Debezium events as Debezium and Pulsar write them (issue 15): the source's commit time, tombstones,
truncates, Pulsar IO's KeyValue framing, and the row schema carried by ``schema``+``payload`` envelopes.

The envelopes here follow the PostgreSQL connector's output (the same shapes tests/debezium gets from the
real engine); the end-to-end proof with Debezium itself is tests/debezium/test_real_debezium.py."""

from __future__ import annotations

import json
import logging
import struct
from datetime import UTC, datetime
from typing import Any

import pytest

from cdc.backends.pulsar.records import Decoder
from cdc.errors import OptionError, SchemaChangedError, TruncateError
from cdc.formats.debezium import TruncateEvent, record_schema_of
from cdc.servers.pulsar import EmbeddedBroker
from tests.backends.pulsar.helpers import backend, drain, produce

ROW = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]})
SOURCE = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg", "db": "app", "schema": "public",
          "table": "items", "ts_ms": 1700000000123, "ts_us": 1700000000123456, "ts_ns": 1700000000123456789}
# The Kafka Connect schema Debezium's JSON converter writes with schemas.enable=true (abridged: the source
# block's fields are left out; the decoder reads only before/after).
ROW_CONNECT = {"type": "struct", "name": "pg.public.items.Value", "optional": True, "field": "after", "fields": [
    {"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "name"}]}
ENVELOPE_SCHEMA = {"type": "struct", "name": "pg.public.items.Envelope", "optional": False, "fields": [
    {**ROW_CONNECT, "field": "before"}, ROW_CONNECT, {"type": "string", "optional": False, "field": "op"},
    {"type": "int64", "optional": True, "field": "ts_ms"}]}


def change(op: str, row: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    before, after = (row, None) if op == "d" else (None, row)
    return {"before": before, "after": after, "source": SOURCE, "op": op, "ts_ms": 1700000009999, **extra}


def wire(env: dict[str, Any], schemas: bool = False) -> bytes:
    return json.dumps({"schema": ENVELOPE_SCHEMA, "payload": env} if schemas else env).encode()


def inline(key: bytes, value: bytes | None) -> bytes:
    """Pulsar's INLINE KeyValue encoding: [key length][key][value length][value], lengths big-endian int32."""
    v = b"" if value is None else value
    return struct.pack(">i", len(key)) + key + struct.pack(">i", -1 if value is None else len(v)) + v


def decoder(schema_from_events: bool = False) -> Decoder:
    return Decoder("debezium", record_schema_of(ENVELOPE_SCHEMA) if schema_from_events else ROW, "id",
                   schema_from_events)


@pytest.mark.parametrize("source, expected", [
    (SOURCE, datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)),
    ({k: v for k, v in SOURCE.items() if k != "ts_us"}, datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)),
    ({k: v for k, v in SOURCE.items() if k not in ("ts_us", "ts_ns")}, datetime(2023, 11, 14, 22, 13, 20, 123000,
                                                                                  tzinfo=UTC)),
], ids=["ts_us", "ts_ns", "ts_ms"])
def test_commit_time_is_the_sources_not_when_debezium_processed_it(source: dict[str, Any], expected: datetime) -> None:
    op, commit, _ = decoder().decode_change(wire(change("c", {"id": 1}, source=source)), 0) or ("", None, [])
    assert (op, commit) == ("insert", expected)


def test_commit_time_falls_back_to_the_envelope_then_the_publish_time() -> None:
    env = change("c", {"id": 1})
    del env["source"]
    assert decoder().decode_change(wire(env), 0)[1] == datetime(2023, 11, 14, 22, 13, 29, 999000, tzinfo=UTC)  # type: ignore[index]
    del env["ts_ms"]
    assert decoder().decode_change(wire(env), 5000)[1] == datetime(1970, 1, 1, 0, 0, 5, tzinfo=UTC)  # type: ignore[index]


@pytest.mark.spark
def test_the_udf_and_the_decoder_give_one_envelope_the_same_change(spark: Any) -> None:
    from udfs import debezium

    envelopes = [wire(change("c", {"id": 1, "name": "a"})), wire(change("d", {"id": 1}, source={
        **SOURCE, "ts_us": None, "ts_ns": None}), schemas=True), wire(change("u", {"id": 2, "name": None}, source={
            k: v for k, v in SOURCE.items() if k != "ts_us"}))]
    df = spark.createDataFrame([(e.decode(),) for e in envelopes], "value string")
    rows = df.select(debezium("value", "id int, name string").alias("c")).select("c.*").collect()
    for payload, row in zip(envelopes, rows, strict=True):
        op, commit, values = decoder().decode_change(payload, 0) or ("", None, [])
        assert (row["_op"], row["_commit_ts"].replace(tzinfo=UTC), [row["id"], row["name"]]) == (op, commit, values)


def test_tombstones_are_no_change() -> None:
    assert decoder().decode_change(b"", 0) is None
    assert decoder().decode_change(inline(b'{"id": 1}', None), 0) is None


def test_pulsar_keyvalue_inline_payloads_decode_like_plain_envelopes() -> None:
    env = change("u", {"id": 3, "name": "x"})
    plain = decoder().decode_change(wire(env), 0)
    assert plain is not None
    assert decoder().decode_change(inline(b'{"id": 3}', wire(env)), 0) == plain
    assert decoder().decode_change(inline(b"", wire(env, schemas=True)), 0) == plain


def test_a_truncate_names_its_table() -> None:
    with pytest.raises(TruncateEvent) as err:
        decoder().decode_change(wire({"op": "t", "source": SOURCE, "ts_ms": 1}), 0)
    assert err.value.table == "app.public.items"


def test_the_row_schema_comes_from_the_connect_schema() -> None:
    assert json.loads(record_schema_of(ENVELOPE_SCHEMA))["fields"] == [
        {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]
    dated = {**ENVELOPE_SCHEMA, "fields": [{**ROW_CONNECT, "fields": [
        {"type": "int32", "optional": False, "field": "day", "name": "io.debezium.time.Date"},
        {"type": "int64", "optional": True, "field": "at", "name": "io.debezium.time.MicroTimestamp"},
        {"type": "struct", "optional": True, "field": "geo", "name": "io.debezium.data.geometry.Point"}]}]}
    with pytest.raises(ValueError, match="column 'geo' has Kafka Connect type 'struct'"):
        record_schema_of(dated)


def test_an_envelope_with_another_schema_is_refused_when_the_schema_came_from_the_events() -> None:
    dec = decoder(schema_from_events=True)
    assert dec.decode_change(wire(change("c", {"id": 1, "name": "a"}), schemas=True), 0) is not None
    wider = json.loads(json.dumps(ENVELOPE_SCHEMA))
    wider["fields"][1]["fields"].append({"type": "int64", "optional": True, "field": "qty"})
    payload = json.dumps({"schema": wider, "payload": change("c", {"id": 2, "qty": 4})}).encode()
    with pytest.raises(SchemaChangedError, match='"qty"'):
        dec.decode_change(payload, 0)
    assert decoder().decode_change(payload, 0) is not None  # a given valueSchema is the user's choice


# ---------------------------------------------------------------------------------------------- on a broker
def test_tombstones_are_skipped_and_counted(plain_broker: EmbeddedBroker, plain_topic: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    topic = plain_topic  # one partition: the test asserts the order across all messages
    broker = plain_broker
    payloads = [wire(change("c", {"id": 1, "name": "a"})), wire(change("d", {"id": 1})), b"",
                wire(change("c", {"id": 2, "name": "b"}))]
    produce(broker.url, topic, payloads, ["1", "1", "1", "2"])
    with caplog.at_level(logging.INFO, logger="cdc.backends.pulsar.reader"):
        table, _ = drain(backend(broker.url, topic, valueFormat="debezium", valueSchema=ROW, changeKeys="id"))
    assert table.column("_op").to_pylist() == ["insert", "delete", "insert"]
    counts = [r.getMessage() for r in caplog.records if "tombstones skipped" in r.getMessage()]
    assert sum(int(m.split(", ")[-1].split()[0]) for m in counts) == 1, counts


def test_a_truncate_fails_the_query_naming_table_and_message(plain_broker: EmbeddedBroker, plain_topic: str) -> None:
    # one partition: the message id the error names must be the one produce() returned for the truncate
    broker, topic = plain_broker, plain_topic
    ids = produce(broker.url, topic, [wire(change("c", {"id": 1})), wire({"op": "t", "source": SOURCE})], ["1", None])
    mid = ids[1]
    with pytest.raises(TruncateError, match=rf"message \[{mid.ledger_id()}, {mid.entry_id()}, -1\].*app\.public\.items"):
        drain(backend(broker.url, topic, valueFormat="debezium", valueSchema=ROW, changeKeys="id"))


def test_the_schema_is_read_from_the_first_envelope(plain_broker: EmbeddedBroker, plain_topic: str) -> None:
    topic = plain_topic  # one partition: the test asserts the order across all messages
    with pytest.raises(OptionError, match="valueSchema"):
        backend(plain_broker.url, topic, valueFormat="debezium", changeKeys="id")
    wider = json.loads(json.dumps(ENVELOPE_SCHEMA))
    wider["fields"][1]["fields"].append({"type": "int64", "optional": True, "field": "qty"})
    later = json.dumps({"schema": wider, "payload": change("c", {"id": 3, "qty": 1})}).encode()
    ids = produce(plain_broker.url, topic, [b"", wire(change("c", {"id": 1, "name": "a"}), True),
                                            wire(change("u", {"id": 1, "name": "b"}), True), later])
    b = backend(plain_broker.url, topic, valueFormat="debezium", changeKeys="id")
    assert b.schema().names[-2:] == ["id", "name"]
    mid = ids[3]
    with pytest.raises(SchemaChangedError, match=rf"message \[{mid.ledger_id()}, {mid.entry_id()}, -1\]"):
        drain(b)
