"""Debezium's Avro events in the Confluent wire format (magic byte 0, a 4-byte schema id, the Avro record) on the
session's Kafka, their schemas read from a schema registry's Confluent-compatible API.

A recorded registry, not a running one: Apicurio Registry cannot run here. Its Maven Central artifact is the
Quarkus module before Quarkus' build step, not the runnable distribution (tried 2026-11-27):

    $ mvn dependency:get -Dartifact=io.apicurio:apicurio-registry-app:3.3.3   # resolves; 2.8 MB
    $ unzip -p apicurio-registry-app-3.3.3.jar META-INF/MANIFEST.MF             # no Main-Class
    Manifest-Version: 1.0 / Created-By: Maven JAR Plugin 3.4.2 / Build-Jdk-Spec: 21
    $ java -cp apicurio-registry-app-3.3.3.jar io.apicurio.registry.RegistryQuarkusMain
    java.lang.UnsupportedClassVersionError: ... class file version 65.0 ... up to 61.0

(Java 21 classes, and even on a newer JDK the Quarkus entry point needs the augmented ``quarkus-run.jar`` of
the distribution, which is not on Maven Central; Karapace is not in the package lists this project installs from.) The registry below serves on
loopback the answers of the documented endpoint ``GET /apis/ccompat/v7/schemas/ids/{id}`` (``{"schema": ...}``,
Avro's schemaType left out as Confluent's API does), and the events are Debezium's PostgreSQL envelope schema
written with fastavro, as Debezium's Avro converter writes them."""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro
import pytest

from cdc.errors import MalformedRecordError, OptionError
from cdc.servers.kafka import ApacheKafka
from tests.backends.kafka.helpers import backend, drain, produce

ROW = {"type": "record", "name": "Value", "namespace": "pg.public.items", "fields": [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "qty", "type": ["null", "long"], "default": None},
    {"name": "day", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}], "default": None},
]}
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"}, {"name": "name", "type": "string"},
    {"name": "ts_ms", "type": "long"}, {"name": "db", "type": "string"}, {"name": "schema", "type": "string"},
    {"name": "table", "type": "string"}, {"name": "txId", "type": ["null", "long"], "default": None},
    {"name": "lsn", "type": ["null", "long"], "default": None},
]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "pg.public.items", "connect.name":
            "pg.public.items.Envelope", "fields": [
                {"name": "before", "type": ["null", ROW], "default": None},
                {"name": "after", "type": ["null", "Value"], "default": None},
                {"name": "source", "type": SOURCE},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
            ]}
KEY = {"type": "record", "name": "Key", "namespace": "pg.public.items", "fields": [{"name": "id", "type": "int"}]}
IDS = {1: KEY, 2: ENVELOPE}


class _Registry(BaseHTTPRequestHandler):
    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).asked.append(self.path)
        prefix = "/apis/ccompat/v7/schemas/ids/"
        schema = IDS.get(int(self.path[len(prefix):])) if self.path.startswith(prefix) else None
        if schema is None:
            body, code = {"error_code": 40403, "message": "Schema not found"}, 404
        else:
            body, code = {"schema": json.dumps(schema)}, 200
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"
    server.shutdown()


def _wire(schema_id: int, schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(json.dumps(schema))), record)
    return out.getvalue()


def _event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int) -> bytes:
    source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1_700_000_000_000 + lsn,
              "db": "shop", "schema": "public", "table": "items", "txId": 700 + lsn, "lsn": lsn}
    return _wire(2, ENVELOPE, {"before": before, "after": after, "source": source, "op": op,
                               "ts_ms": 1_700_000_000_100 + lsn})


def test_avro_events_through_the_registry(kafka: ApacheKafka, topic: str, registry: str) -> None:
    row1 = {"id": 1, "name": 'a "quoted" \\ name', "qty": 10, "day": 19_700}
    row2 = {"id": 2, "name": None, "qty": None, "day": None}
    events = [
        _event("r", None, row1, 1),
        _event("c", None, row2, 2),
        _event("u", row2, {**row2, "qty": 5}, 3),
        _event("d", row1, None, 4),
        None,  # the delete's tombstone
    ]
    keys = [_wire(1, KEY, {"id": i}) for i in (1, 2, 2, 1, 1)]
    produce(kafka.bootstrap, topic, events, keys, partition=0)
    _Registry.asked.clear()
    b = backend(kafka.bootstrap, topic, valueFormat="debezium", changeKeys="id", **{"schema.registry.url": registry})
    table, _ = drain(b)
    assert table.column("_op").to_pylist() == ["snapshot", "insert", "update", "delete"]
    assert table.column("id").to_pylist() == [1, 2, 2, 1]
    assert table.column("name").to_pylist()[:3] == ['a "quoted" \\ name', None, None]
    assert table.column("qty").to_pylist()[:3] == [10, None, 5]
    assert str(table.column("day").to_pylist()[0]) == "2023-12-09"  # io.debezium.time.Date: days since 1970
    assert table.column("_position").to_pylist() == [0, 1, 2, 3]
    # the row schema came from the registry (the envelope's id only: the keys' Avro is never decoded)
    assert set(_Registry.asked) == {"/apis/ccompat/v7/schemas/ids/2"}


def test_avro_without_a_registry_or_with_an_unknown_id_names_what_to_fix(kafka: ApacheKafka, topic: str,
                                                                          registry: str) -> None:
    row = {"id": 1, "name": "x", "qty": 1, "day": 1}
    produce(kafka.bootstrap, topic, [_event("c", None, row, 1)], partition=0)
    with pytest.raises(OptionError, match=r"'schema.registry.url' is required.*offset 0.*schema id 2"):
        backend(kafka.bootstrap, topic, valueFormat="debezium", changeKeys="id")
    unknown = _event("c", None, row, 2)
    produce(kafka.bootstrap, topic, [unknown[:1] + struct.pack(">I", 99) + unknown[5:]], partition=0)
    b = backend(kafka.bootstrap, topic, valueFormat="debezium", changeKeys="id", **{"schema.registry.url": registry})
    with pytest.raises(MalformedRecordError, match=r"offset 1.*schema id 99 is not in the registry"):
        drain(b)
