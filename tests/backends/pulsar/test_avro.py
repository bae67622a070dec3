"""valueFormat=avro: payloads decoded with an Avro schema given as an option or read from the schema registry.

Messages come from a real pulsar-lite broker. pulsar-lite has no admin API (and its own Avro schema support
blocks), so payloads are Avro binary records encoded with fastavro (what Pulsar's AVRO producers send) and
the schema registry is served on loopback with responses recorded from the documented endpoint
``GET /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema`` (a ``GetSchemaResponse``)."""

from __future__ import annotations

import io
import json
import urllib.request
from datetime import UTC, date, datetime, timedelta
from typing import Any

import fastavro
import pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.backends.pulsar import PulsarBackend, PulsarOptions
from cdc.backends.pulsar.connection import open_client
from cdc.backends.pulsar.errors import SchemaMismatchError
from cdc.backends.pulsar.records import Decoder, Malformed
from cdc.errors import MalformedRecordError, OptionError
from cdc.options import parse
from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.admin_api import serve_admin
from tests.backends.pulsar.helpers import backend, drain, produce

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": ["null", "double"]},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {"name": "ok", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "qty", "type": "int"},
        {"name": "ratio", "type": "float"},
    ],
}
SCHEMA_TEXT = json.dumps(SCHEMA)
PARSED = fastavro.parse_schema(SCHEMA)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def encode(record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, PARSED, record)
    return buffer.getvalue()


def record(i: int, **changes: Any) -> dict[str, Any]:
    base = {"id": i, "amount": i * 1.5, "note": f"n{i}", "at": AT, "day": date(2026, 1, i % 28 + 1), "ok": i % 2 == 0,
            "blob": bytes([i % 256]), "qty": i, "ratio": 0.5}
    return {**base, **changes}


def upload(broker: ApachePulsar, topic: str, schema: str, kind: str = "AVRO") -> None:
    """Put a schema in the broker's schema registry (``POST /admin/v2/schemas/<topic>/schema``)."""
    request = urllib.request.Request(
        broker.admin_url + "/admin/v2/schemas/" + topic.split("://", 1)[1] + "/schema",
        data=json.dumps({"type": kind, "schema": schema, "properties": {}}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


# ---------------------------------------------------------------------------------------------- option schema
def test_avro_records_decode_to_columns(broker: ApachePulsar, topic: str) -> None:
    records = [record(1), record(2, amount=None, note=None, day=None), record(3)]
    produce(broker.url, topic, [encode(r) for r in records], ["a", "a", "a"], batching=True)
    b = backend(broker.url, topic, valueFormat="avro", valueSchema=SCHEMA_TEXT)
    assert b.schema().names[:9] == [f["name"] for f in SCHEMA["fields"]]
    assert b.schema().names[9] == "__key"
    table, _ = drain(b)
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert rows[1]["amount"] is None and rows[1]["note"] is None and rows[1]["day"] is None
    assert rows[0]["at"] == AT and rows[0]["day"] == date(2026, 1, 2)
    assert (rows[0]["ok"], rows[0]["blob"], rows[0]["qty"], rows[0]["ratio"]) == (False, b"\x01", 1, 0.5)
    assert rows[0]["__key"] == "a" and rows[0]["__topic"].startswith(topic)


def test_malformed_avro_fails_naming_the_message(broker: ApachePulsar, topic: str) -> None:
    produce(broker.url, topic, [encode(record(1)), b"\x02\xff\xff"], ["good", "bad-key"])
    b = backend(broker.url, topic, valueFormat="avro", valueSchema=SCHEMA_TEXT)
    with pytest.raises(MalformedRecordError, match=r"bad-key.*does not decode as avro.*onMalformed=quarantine"):
        drain(b)


def test_malformed_avro_is_quarantined_not_dropped(broker: ApachePulsar, topic: str) -> None:
    payloads = [encode(record(1)), b"garbage", encode(record(2)) + b"\x00", encode(record(3))]
    produce(broker.url, topic, payloads, ["k"] * 4)
    q = topic + "-quarantine"
    b = backend(broker.url, topic, valueFormat="avro", valueSchema=SCHEMA_TEXT, onMalformed="quarantine",
                quarantineTopic=q)
    table, _ = drain(b)
    assert table.column("id").to_pylist() == [1, 3]
    client = open_client(broker.url)
    try:
        reader = client.create_reader(q, pulsar.MessageId.earliest)
        set_aside = [reader.read_next(5000) for _ in range(2)]
        assert [m.data() for m in set_aside] == [b"garbage", payloads[2]]
        assert "not an Avro record" in set_aside[0].properties()["cdc.error"]
        assert "1 bytes after the Avro record" in set_aside[1].properties()["cdc.error"]
    finally:
        client.close()


def test_avro_options_name_the_problem() -> None:
    with pytest.raises(OptionError, match=r"'valueSchema' is required with valueFormat=avro.*admin.url"):
        parse(PulsarOptions, {"service.url": "u", "topic": "t", "valueFormat": "avro"}, what="backend 'pulsar'")
    bad = json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})
    with pytest.raises(OptionError, match="valueSchema"):
        Decoder("avro", bad, None)
    with pytest.raises(OptionError, match=r"valueFormat.*'avro'"):
        parse(PulsarOptions, {"service.url": "u", "topic": "t", "valueFormat": "protobuf"}, what="b")


# ---------------------------------------------------------------------------------------------- registry
# The broker's own schema registry, through its admin API.
def test_schema_read_from_the_registry(broker: ApachePulsar, topic: str) -> None:
    produce(broker.url, topic, [encode(record(7))], ["k"])
    upload(broker, topic, SCHEMA_TEXT)
    b = backend(broker.url, topic, valueFormat="avro", **{"admin.url": broker.admin_url})
    table, _ = drain(b)
    assert table.column("id").to_pylist() == [7]
    assert json.loads(b.options.value_schema or "") == SCHEMA  # travels to executors in the options


def test_registry_requests_carry_the_token() -> None:
    """Recorded responses: the session's broker runs without authentication, so it cannot show which header
    a request carried (the security tests run a broker that refuses a missing token)."""
    topic = "persistent://public/default/recorded"
    with serve_admin() as registry:
        registry.responses["/admin/v2/schemas/public/default/recorded/schema"] = {
            "version": 0, "type": "AVRO", "timestamp": 1_767_225_600_000, "data": SCHEMA_TEXT, "properties": {}
        }
        PulsarBackend(PulsarOptions.model_validate(
            {"service.url": "pulsar://127.0.0.1:1", "topic": topic, "valueFormat": "avro",
             "admin.url": registry.url, "auth.token": "tok"}
        ))
        assert registry.seen == [("/admin/v2/schemas/public/default/recorded/schema", "Bearer tok")]


def test_json_schema_read_from_the_registry(broker: ApachePulsar, topic: str) -> None:
    schema = json.dumps({"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"}]})
    produce(broker.url, topic, [b'{"id": 4}'], ["k"])
    upload(broker, topic, schema, "JSON")
    table, _ = drain(backend(broker.url, topic, valueFormat="json", **{"admin.url": broker.admin_url}))
    assert table.column("id").to_pylist() == [4]


def test_registry_problems_are_clear(broker: ApachePulsar, topic: str) -> None:
    other, text = topic + "-other", topic + "-string"
    admin = {"admin.url": broker.admin_url}
    with pytest.raises(OptionError, match=r"has no schema in the schema registry.*give option valueSchema"):
        backend(broker.url, topic, valueFormat="avro", **admin)
    upload(broker, text, "", "STRING")
    with pytest.raises(OptionError, match=r"STRING schema.*valueFormat=avro needs AVRO"):
        backend(broker.url, text, valueFormat="avro", **admin)
    upload(broker, topic, SCHEMA_TEXT)
    upload(broker, other, json.dumps({**SCHEMA, "fields": SCHEMA["fields"][:1]}))
    with pytest.raises(OptionError, match="must share one schema"):
        backend(broker.url, None, topics=f"{topic},{other}", valueFormat="avro", **admin)
    # The option wins over the registry (which holds another schema for `other`).
    b = backend(broker.url, other, valueFormat="avro", valueSchema=SCHEMA_TEXT, **admin)
    assert json.loads(b.options.value_schema or "") == SCHEMA


def test_topics_discovered_later_are_checked_against_the_registry(broker: ApachePulsar, topic: str) -> None:
    """topicsPattern + registry: a topic that appears after the query started is read when its registry schema
    is the query's, and fails planning, naming it, when the registry holds another schema for it."""
    name = topic.rsplit("/", 1)[1]
    first, same, other = topic + "-a", topic + "-b", topic + "-c"
    upload(broker, first, SCHEMA_TEXT)
    produce(broker.url, first, [encode(record(1))], ["k"])
    b = backend(broker.url, None, topicsPattern=f"{name}-.*", valueFormat="avro", **{"admin.url": broker.admin_url})
    table, offset = drain(b)
    assert table.column("id").to_pylist() == [1]
    # Same schema (other key order in the registry's JSON): read.
    upload(broker, same, json.dumps(SCHEMA, sort_keys=True, indent=1))
    produce(broker.url, same, [encode(record(2))], ["k"])
    table, offset = drain(b, offset)
    assert table.column("id").to_pylist() == [2]
    # Another schema: planning fails naming the topic; no message of it is decoded with the wrong schema.
    upload(broker, other, json.dumps({**SCHEMA, "fields": SCHEMA["fields"][:1]}))
    produce(broker.url, other, [b"\x02"], ["k"])
    with pytest.raises(SchemaMismatchError, match=rf"{other}.*another avro schema.*narrow topicsPattern"):
        drain(b, offset)


# ---------------------------------------------------------------------------------------------- properties
FIELD_VALUES = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**63), 2**63 - 1),
        "amount": st.none() | st.floats(allow_nan=False),
        "note": st.none() | st.text(),
        "at": st.integers(-(2**40), 2**40).map(lambda ms: EPOCH + timedelta(milliseconds=ms)),
        "day": st.none() | st.dates(min_value=date(1, 1, 1)),
        "ok": st.booleans(),
        "blob": st.binary(),
        "qty": st.integers(-(2**31), 2**31 - 1),
        "ratio": st.floats(width=32, allow_nan=False),
    }
)


@settings(max_examples=200, deadline=None)
@given(FIELD_VALUES)
def test_avro_records_round_trip(values: dict[str, Any]) -> None:
    decoder = Decoder("avro", SCHEMA_TEXT, None)
    row = decoder.decode_value(encode(values))
    assert row == [values[f["name"]] for f in SCHEMA["fields"]]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_payload_decodes_or_is_malformed(payload: bytes) -> None:
    """Never another exception (that would escape onMalformed) and never a partial read."""
    decoder = Decoder("avro", SCHEMA_TEXT, None)
    try:
        row = decoder.decode_value(payload)
    except Malformed:
        return
    assert len(row) == len(SCHEMA["fields"])
    assert encode(dict(zip([f["name"] for f in SCHEMA["fields"]], row, strict=True)))  # a valid record
