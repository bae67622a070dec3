"""Kafka messages into Arrow rows: Spark's Kafka columns (``valueFormat=bytes``), or Debezium change events
(``valueFormat=debezium``) into the change model.

The Debezium decoding is the one every backend shares (:class:`cdc.formats.debezium.ChangeDecoder`: JSON
envelopes with or without schemas, tombstones skipped, truncates); what is Kafka's own here is the framing:
a value in the Confluent wire format (magic byte 0, a 4-byte big-endian schema id, then the Avro record) is
decoded with the writer schema its id names in a Confluent-compatible schema registry
(:class:`~cdc.backends.kafka.registry.SchemaRegistry`, each id fetched once), as Debezium's Avro converters
(Confluent's, or Apicurio's in its Confluent-compatible mode) write them. A change record's ``_seq`` and
``_position`` are the message's offset.

:func:`spark_kafka_changes` decodes the output of Spark's own ``format("kafka")`` source the same way.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from cdc.backends.kafka.registry import SchemaRegistry
from cdc.formats.debezium import Change, ChangeDecoder
from cdc.formats.rows import TS, Malformed, decode_avro, parse_avro_schema

__all__ = ["BYTES_FIELDS", "HEADERS_FIELD", "ChangeValues", "bytes_schema", "confluent_schema_id"]

BYTES_FIELDS: tuple[pa.Field, ...] = (
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TS),
    pa.field("timestampType", pa.int32()),
)
"""Spark's Kafka source's columns, in its order."""
HEADERS_FIELD = pa.field(
    "headers", pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)

_MAGIC = 0
_HEADER = struct.Struct(">bI")


def bytes_schema(include_headers: bool) -> pa.Schema:
    return pa.schema([*BYTES_FIELDS, *([HEADERS_FIELD] if include_headers else [])])


def confluent_schema_id(value: bytes) -> int | None:
    """The schema id of a value in the Confluent wire format, ``None`` for any other value (JSON starts with
    ``{`` or white space, never with the magic byte 0)."""
    if len(value) > _HEADER.size and value[0] == _MAGIC:
        return int(_HEADER.unpack_from(value)[1])
    return None


class ChangeValues:
    """Debezium change events of one partition, in order, into change-record values: JSON, or Avro in the
    Confluent wire format through the registry (``registry``; without one such a value is malformed)."""

    def __init__(self, decoder: ChangeDecoder, registry: SchemaRegistry | None) -> None:
        self.decoder = decoder
        self.registry = registry
        self._avro: dict[int, Any] = {}

    def decode(self, value: bytes | None, timestamp_ms: int) -> Change | None:
        """The change, or ``None`` for a tombstone (a null or empty value)."""
        if not value:
            return None
        schema_id = confluent_schema_id(value)
        if schema_id is None:
            return self.decoder.decode(value, timestamp_ms)
        env = decode_avro(value[_HEADER.size:], self._writer_schema(schema_id))
        return self.decoder.decode_envelope(_plain(env), timestamp_ms)

    def _writer_schema(self, schema_id: int) -> Any:
        if schema_id not in self._avro:
            if self.registry is None:
                raise Malformed(f"an Avro value in the Confluent wire format (schema id {schema_id}) and no "
                                "schema.registry.url to read its schema from")
            text = json.dumps(_without_logical_types(json.loads(self.registry.schema(schema_id))))
            self._avro[schema_id] = parse_avro_schema(text)
        return self._avro[schema_id]


def _plain(value: Any) -> Any:
    """An Avro record as Debezium's JSON converter shows it: bytes as base64 text (the row conversions of
    :mod:`cdc.formats.rows` read JSON's form). Logical types were taken out of the writer schema
    (:func:`_without_logical_types`), so times and dates stay the numbers both converters write."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def _without_logical_types(schema: Any) -> Any:
    """The schema with every ``logicalType`` left out: the binary encoding is the same, and fastavro then
    returns the underlying numbers instead of Python dates and decimals."""
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(x) for x in schema]
    return schema


def change_row(c: Change, channel: str, offset: int) -> list[Any]:
    """A change's row of the change schema's columns; ``_seq`` and ``_position`` are the message's offset."""
    return [c.op, offset, c.commit, channel, offset, c.unchanged, c.old_key, *c.values]


def change_rows(
    values: ChangeValues,
    messages: Sequence[Any],
    channel: str,
    on_malformed: Callable[[Any, Malformed], None],
    on_truncate: Callable[[Any, Any], list[Any] | None],
) -> tuple[list[list[Any]], int]:
    """The change records of ``messages`` (confluent-kafka messages of one partition, in order) as rows of
    the change schema's columns; returns them and the tombstones skipped. ``on_malformed`` fails or
    quarantines a message; ``on_truncate`` gives a truncate's row (or raises)."""
    from cdc.errors import SchemaChangedError
    from cdc.formats.debezium import TruncateEvent

    rows: list[list[Any]] = []
    tombstones = 0
    for m in messages:
        offset = m.offset()
        try:
            decoded = values.decode(m.value(), m.timestamp()[1])
        except Malformed as exc:
            on_malformed(m, exc)
            continue
        except SchemaChangedError as exc:
            raise SchemaChangedError(f"channel {channel!r} offset {offset}: {exc}") from None
        except TruncateEvent as t:
            row = on_truncate(m, t)
            if row is not None:
                rows.append(["truncate", offset, t.commit, channel, offset, *row])
            continue
        if decoded is None:
            tombstones += 1
            continue
        rows.append(change_row(decoded, channel, offset))
    return rows, tombstones
