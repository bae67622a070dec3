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
from cdc.options import parse
from cdc.servers.pulsar import EmbeddedBroker
from tests.backends.pulsar.helpers import backend, drain, produce

ROW = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]})
SOURCE = {"version": "3.4.3.Final", "connector": "postgresql", "name": "pg", "db": "app", "schema": "public",
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
    c = decoder().decode_change(wire(change("c", {"id": 1}, source=source)), 0)
    assert c is not None and (c.op, c.commit) == ("insert", expected)


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
        c = decoder().decode_change(payload, 0)
        assert c is not None
        assert (row["_op"], row["_commit_ts"].replace(tzinfo=UTC), [row["id"], row["name"]]) == (c.op, c.commit, c.values)


# What the PostgreSQL connector (3.4.3, pgoutput) sends for a table (id int primary key, n int, b text, raw
# bytea) whose b and raw are TOASTed, as tests/debezium's engine captured it: under REPLICA IDENTITY DEFAULT
# the unchanged TOASTed columns hold the placeholder (raw: its bytes, base64), a key change is a delete, a
# tombstone and a create from one source event (the same source block); under FULL Debezium sends values.
TOASTED = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "int"}, {"name": "n", "type": ["null", "int"]}, {"name": "b", "type": ["null", "string"]},
    {"name": "raw", "type": ["null", "bytes"]}]})
PLACEHOLDER_B64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="  # base64 of __debezium_unavailable_value
UNAVAILABLE = {"b": "__debezium_unavailable_value", "raw": PLACEHOLDER_B64}


def toasted(placeholder: str | None = None) -> Decoder:
    if placeholder is None:
        return Decoder("debezium", TOASTED, "id")
    return Decoder("debezium", TOASTED, "id", placeholder=placeholder)


def test_the_placeholder_is_an_unchanged_column_never_a_value() -> None:
    update = toasted().decode_change(wire(change("u", {"id": 1, "n": 5, **UNAVAILABLE})), 0)
    assert update is not None
    assert (update.op, update.values, update.unchanged, update.old_key) == ("update", [1, 5, None, None],
                                                                            ["b", "raw"], None)
    # A value that only looks like the placeholder in another column kind, or a real value, is a value
    snap = toasted().decode_change(wire(change("r", {"id": 2, "n": None, "b": "x", "raw": PLACEHOLDER_B64[:-4]})), 0)
    assert snap is not None and snap.unchanged is None and snap.values[2] == "x"


def test_a_before_image_that_holds_the_value_completes_the_update() -> None:
    """Under REPLICA IDENTITY FULL the before image has the old row: a placeholder left in after takes it."""
    env = change("u", {"id": 1, "n": 5, **UNAVAILABLE})
    env["before"] = {"id": 1, "n": 4, "b": "old text", "raw": "AQI="}
    update = toasted().decode_change(wire(env), 0)
    assert update is not None and (update.values, update.unchanged) == ([1, 5, "old text", b"\x01\x02"], None)


def test_a_key_change_links_the_create_to_the_deleted_key() -> None:
    dec = toasted()
    source = {**SOURCE, "lsn": 26441944, "sequence": '["26441888","26441944"]'}
    gone = dec.decode_change(wire(change("d", {"id": 1, "n": None, "b": None, "raw": None}, source=source)), 0)
    assert dec.decode_change(b"", 0) is None  # the tombstone between them
    moved = dec.decode_change(wire(change("c", {"id": 10, "n": 5, **UNAVAILABLE}, source=source)), 0)
    assert gone is not None and moved is not None
    assert (gone.op, gone.values) == ("delete", [1, None, None, None])
    assert (moved.op, moved.values, moved.unchanged, moved.old_key) == (
        "insert", [10, 5, None, None], ["b", "raw"], {"id": 1})
    # A create from another source event (another LSN) is a new row, not the delete's key moving
    dec.decode_change(wire(change("d", {"id": 2}, source=source)), 0)
    other = dec.decode_change(wire(change("c", {"id": 3, "n": 1}, source={**source, "lsn": 26441999})), 0)
    assert other is not None and other.old_key is None
    # Under FULL the delete's before image is the whole old row: the create's placeholders take it
    full_delete = change("d", {"id": 4, "n": 1, "b": "kept", "raw": "AQI="}, source=source)
    dec.decode_change(wire(full_delete), 0)
    moved = dec.decode_change(wire(change("c", {"id": 40, "n": 1, "b": UNAVAILABLE["b"], "raw": "AQI="},
                                          source=source)), 0)
    assert moved is not None and (moved.values, moved.unchanged, moved.old_key) == (
        [40, 1, "kept", b"\x01\x02"], None, {"id": 4})


@pytest.mark.parametrize("option, text", [("--none--", "--none--"), ("hex:2d2d", "--")])
def test_the_placeholder_option_names_what_debezium_was_told(option: str, text: str) -> None:
    import base64

    raw = base64.b64encode(text.encode()).decode()
    c = toasted(option).decode_change(wire(change("u", {"id": 1, "b": text, "raw": raw})), 0)
    assert c is not None and c.unchanged == ["b", "raw"]
    c = toasted(option).decode_change(wire(change("u", {"id": 1, **UNAVAILABLE})), 0)
    assert c is not None and c.unchanged is None and c.values[2] == UNAVAILABLE["b"]


@pytest.mark.parametrize("value, message", [("", "non-empty"), ("hex:zz", "hexadecimal")])
def test_a_bad_placeholder_option_names_it(value: str, message: str) -> None:
    from cdc.backends.pulsar.options import PulsarOptions

    with pytest.raises(OptionError, match=rf"debezium\.unavailableValuePlaceholder.*{message}"):
        parse(PulsarOptions, {"service.url": "pulsar://x:6650", "topic": "t", "valueFormat": "debezium",
                              "changeKeys": "id", "valueSchema": TOASTED,
                              "debezium.unavailableValuePlaceholder": value}, what="b")


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
