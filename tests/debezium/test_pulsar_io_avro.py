"""The Pulsar IO Debezium sources with Avro converters (issue 15 item 4): values are Avro records of the
Debezium envelope, whose schema the source registers as the value of a ``KEY_VALUE`` schema. The envelope's
Avro schema here is the one Debezium's AvroData makes for the PostgreSQL connector's events (abridged: the
``source`` block keeps the fields the decoder reads); the registry is Apache Pulsar's own."""

from __future__ import annotations

import io
import json
import urllib.request
from datetime import UTC, date, datetime
from typing import Any

import fastavro

from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.helpers import backend, close_all, drain, produce


def _row(name: str) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "pg.public.items", "fields": [
        {"name": "id", "type": {"type": "int", "connect.type": "int32"}},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "day", "type": ["null", {"type": "int", "connect.version": 1,
                                           "connect.name": "io.debezium.time.Date"}], "default": None},
        {"name": "at", "type": ["null", {"type": "long", "connect.version": 1,
                                          "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None},
    ], "connect.name": f"pg.public.items.{name}"}


ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "pg.public.items", "fields": [
    {"name": "before", "type": ["null", _row("Value")], "default": None},
    {"name": "after", "type": ["null", "pg.public.items.Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "db", "type": "string"}, {"name": "schema", "type": "string"},
                                           {"name": "table", "type": "string"}, {"name": "ts_ms", "type": "long"},
                                           {"name": "ts_us", "type": ["null", "long"], "default": None}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
], "connect.name": "pg.public.items.Envelope"}
KEY = {"type": "record", "name": "Key", "namespace": "pg.public.items", "fields": [{"name": "id", "type": "int"}]}
SOURCE = {"db": "postgres", "schema": "public", "table": "items", "ts_ms": 1700000000123, "ts_us": 1700000000123456}


def avro(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(json.dumps(ENVELOPE))),
                               {"before": before, "after": after, "source": SOURCE, "op": op, "ts_ms": 1})
    return out.getvalue()


def register_key_value(admin_url: str, topic: str) -> None:
    """What the Pulsar IO source registers: a KEY_VALUE schema, AVRO key and value, SEPARATED encoding."""
    body = {"type": "KEY_VALUE", "schema": json.dumps({"key": KEY, "value": ENVELOPE}), "properties": {
        "key.schema.type": "AVRO", "value.schema.type": "AVRO", "kv.encoding.type": "SEPARATED",
        "key.schema.name": "", "value.schema.name": "", "key.schema.properties": "{}",
        "value.schema.properties": "{}"}}
    rest = topic.split("://", 1)[1]
    request = urllib.request.Request(f"{admin_url}/admin/v2/schemas/{rest}/schema", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=30).read()


def test_avro_envelopes_of_a_key_value_topic_decode_like_json_ones(apache_pulsar: ApachePulsar) -> None:
    topic = "persistent://public/default/dbz-pulsar-io-avro"
    register_key_value(apache_pulsar.admin_url, topic)
    rows = [{"id": 1, "name": "a", "day": 19724, "at": 1704164645123456}, {"id": 2, "name": None, "day": None,
                                                                            "at": None}]
    produce(apache_pulsar.url, topic, [
        avro("r", None, rows[0]), avro("c", None, rows[1]), avro("u", rows[0], {**rows[0], "name": "b"}),
        avro("d", {"id": 2, "name": None, "day": None, "at": None}, None), b"",
    ], ['{"id":1}', '{"id":2}', '{"id":1}', '{"id":2}', '{"id":2}'])
    try:
        b = backend(apache_pulsar.url, topic, valueFormat="debezium", changeKeys="id",
                    **{"admin.url": apache_pulsar.admin_url})
        table, _ = drain(b)
    finally:
        close_all()
    assert table.column("_op").to_pylist() == ["snapshot", "insert", "update", "delete"]
    assert table.select(["id", "name", "day", "at"]).to_pylist()[2] == {
        "id": 1, "name": "b", "day": date(2024, 1, 2), "at": datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)}
    assert set(table.column("_commit_ts").to_pylist()) == {datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)}
