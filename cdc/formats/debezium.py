"""Debezium change events as they reach a message broker, turned into the pieces of a change record.

Backend-neutral: ``backend=pulsar`` reads them (``valueFormat=debezium``), and any backend whose messages
carry Debezium envelopes can.

The shapes read (JSON; Avro records of a known envelope schema, whichever way the backend found it: Pulsar's
schema registry, or a Confluent-compatible registry and the Confluent wire format on Kafka):

* the envelope itself (``op``, ``before``, ``after``, ``source``, ``ts_ms``): Debezium's JSON converter with
  ``schemas.enable=false``, Debezium Server's Pulsar sink, and the Pulsar IO Debezium source, whose
  ``KeyValue`` schema with ``SEPARATED`` encoding puts the key in the message key and the value in the payload;
* ``{"schema": ..., "payload": <envelope>}`` (``schemas.enable=true``); the schema gives the row's columns
  (:func:`record_schema_of`) when option ``valueSchema`` is not given;
* a ``KeyValue`` payload with ``INLINE`` encoding (Pulsar's framing: 4-byte big-endian key length, key,
  4-byte value length, value), whose value is one of the above;
* a tombstone: an empty value (what Debezium sends after a delete for log compaction): no change.

The commit time is the source's (``source.ts_us``, ``source.ts_ns`` or ``source.ts_ms``, the most precise
given); the top-level ``ts_ms`` is when Debezium processed the event, used only when ``source`` has none.

Values Debezium does not have. When PostgreSQL does not log a value (an unchanged TOASTed column of an update
under ``REPLICA IDENTITY DEFAULT``), Debezium writes its ``unavailable.value.placeholder``
(``__debezium_unavailable_value`` unless configured; option ``debezium.unavailableValuePlaceholder``) in the
``after`` image instead. The placeholder is never a value: such a column becomes an unchanged column of the
record (``_unchanged``, see :mod:`cdc.model`), exactly like pgoutput's marker, unless the event's ``before``
image holds the value (``REPLICA IDENTITY FULL``), which is then taken.

Key changes. Debezium sends an update that changes a row's key as a delete of the old key, a tombstone and a
create of the new key, all from one source event: the delete and the create carry the same ``source`` block.
A create whose ``source`` equals that of the delete read just before it in the same channel (tombstones
between them skipped) is the insert half of a key change: its ``_old_key`` is the delete's key, and its
unavailable values are taken from the delete's ``before`` image when that holds them (``REPLICA IDENTITY
FULL``). The two halves must be read in one range for the link: keyed partitions can put them on different
partitions, and a batch can end between them unless transactions are kept whole (Pulsar's
``debezium.transactionTopic``).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from cdc.errors import OptionError, SchemaChangedError

if TYPE_CHECKING:
    from cdc.model import ChangeSchema


class TruncateEvent(Exception):
    """Internal: a decoded truncate (``table`` is ``schema.table`` from its source block, ``commit`` its
    commit time at the source)."""

    def __init__(self, table: str, commit: datetime | None = None) -> None:
        super().__init__(table)
        self.table = table
        self.commit = commit


_U32 = struct.Struct(">i")

#: Debezium's default ``unavailable.value.placeholder``.
DEFAULT_PLACEHOLDER = "__debezium_unavailable_value"


def placeholder_octets(option: str) -> bytes:
    """The placeholder's bytes, read as Debezium reads ``unavailable.value.placeholder``: text, or
    hexadecimal octets after a ``hex:`` prefix. Text columns carry them decoded as UTF-8, bytes columns as
    the octets (base64 in JSON)."""
    if option.startswith("hex:"):
        return bytes.fromhex(option[4:])
    return option.encode("utf-8")


PLACEHOLDER_DESCRIPTION = (
    "valueFormat=debezium: the connector's unavailable.value.placeholder (Debezium's default "
    f"`{DEFAULT_PLACEHOLDER}` when not given; `hex:` followed by hexadecimal octets, as Debezium reads it). "
    "A text or bytes column of a create or update holding it was not sent by the database (PostgreSQL: an "
    "unchanged TOASTed value): it becomes an unchanged column (_unchanged), taken from the event's before "
    "image when that holds it (REPLICA IDENTITY FULL), never a value."
)
"""The description of every backend's option ``debezium.unavailableValuePlaceholder``."""


def checked_placeholder(option: str) -> str:
    """Option ``debezium.unavailableValuePlaceholder`` as given, once :func:`placeholder_octets` reads it
    into at least one octet (the ValueError says what is accepted)."""
    try:
        octets = placeholder_octets(option)
    except ValueError:
        raise ValueError(f"accepted values: text, or hex: followed by hexadecimal octets; got {option!r}") from None
    if not octets:
        raise ValueError("accepted values: a non-empty text, or hex: followed by hexadecimal octets; got an empty one")
    return option


def value_of(payload: bytes) -> bytes:
    """The envelope bytes of a message: the payload, or the value of an INLINE KeyValue payload."""
    if not payload or payload[:1] in (b"{", b" ", b"\n", b"\t", b"\r"):
        return payload
    if len(payload) >= 8:
        (key_len,) = _U32.unpack_from(payload, 0)
        at = 4 + max(key_len, 0)
        if 0 <= key_len and at + 4 <= len(payload):
            (value_len,) = _U32.unpack_from(payload, at)
            if value_len < 0 and at + 4 == len(payload):
                return b""  # a null value: a tombstone
            if at + 4 + value_len == len(payload):
                return payload[at + 4 :]
    return payload


def is_truncate(payload: bytes) -> bool:
    """Whether a message is a Debezium truncate, without decoding the others: only a payload holding the
    bytes ``"t"`` is parsed (JSON envelopes; an Avro envelope is never recognised here)."""
    if b'"t"' not in payload:
        return False
    try:
        doc = json.loads(value_of(payload))
    except ValueError:
        return False
    if isinstance(doc, dict) and "op" not in doc and isinstance(doc.get("payload"), dict):
        doc = doc["payload"]
    return isinstance(doc, dict) and doc.get("op") == "t"


def source_table(env: dict[str, Any]) -> str:
    source = env.get("source")
    if not isinstance(source, dict):
        return "?"
    parts = [source.get(k) for k in ("db", "schema", "table")]
    return ".".join(str(p) for p in parts if isinstance(p, str) and p) or "?"


def commit_field(env: dict[str, Any]) -> tuple[str, Any, int]:
    """(the field's name, its value, microseconds per unit as a divisor: -1000 means multiply by 1000)."""
    source = env.get("source")
    if isinstance(source, dict):
        for name, scale in (("ts_us", 1), ("ts_ns", 1000), ("ts_ms", -1000)):
            if source.get(name) is not None:
                return f"source.{name}", source[name], scale
    return "ts_ms", env.get("ts_ms"), -1000


def epoch_micros(value: int, scale: int) -> int:
    return value * -scale if scale < 0 else value // scale


# Kafka Connect schema types (what Debezium's JSON converter writes in "schema") -> the record schema's.
_CONNECT_TYPES = {
    "boolean": "boolean",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float": "float",
    "float32": "float",
    "float64": "double",
    "double": "double",
    "string": "string",
    "bytes": "bytes",
}
_CONNECT_LOGICAL: dict[str, Any] = {
    "io.debezium.time.Date": {"type": "int", "logicalType": "date"},
    "org.apache.kafka.connect.data.Date": {"type": "int", "logicalType": "date"},
    "io.debezium.time.Timestamp": {"type": "long", "logicalType": "timestamp-millis"},
    "org.apache.kafka.connect.data.Timestamp": {"type": "long", "logicalType": "timestamp-millis"},
    "io.debezium.time.MicroTimestamp": {"type": "long", "logicalType": "timestamp-micros"},
}


def record_schema_of(schema: Any) -> str:
    """The row's record schema (JSON text, as option ``valueSchema`` takes it) from the Kafka Connect schema
    of a Debezium envelope: its ``after`` (or ``before``) struct. Raises ValueError naming what it cannot map."""
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
        raise ValueError("the envelope's 'schema' is not a Kafka Connect struct schema")
    images = {f.get("field"): f for f in schema["fields"] if isinstance(f, dict)}
    row = images.get("after") or images.get("before")
    if row is None or not isinstance(row.get("fields"), list):
        raise ValueError("the envelope's schema has no 'after' or 'before' struct")
    fields = []
    for col in row["fields"]:
        name, kind, logical = col.get("field"), col.get("type"), col.get("name")
        t: Any = _CONNECT_LOGICAL.get(logical) if isinstance(logical, str) else None
        if t is None:
            t = _CONNECT_TYPES.get(kind) if isinstance(kind, str) else None
        if t is None or not isinstance(name, str):
            raise ValueError(
                f"column {name!r} has Kafka Connect type {kind!r}{f' ({logical})' if logical else ''}, which "
                "has no column type here; give option valueSchema"
            )
        fields.append({"name": name, "type": ["null", t] if col.get("optional") else t})
    return json.dumps({"type": "record", "name": str(row.get("name") or "Row"), "fields": fields}, sort_keys=True)


def schema_from_first_message(client: Any, topics: list[str], timeout_ms: int) -> str:
    """``valueSchema`` from the first message with a schema of the query's topics (read when the query is
    defined). Fails naming option valueSchema when a topic is empty or its first change has no schema."""
    found: dict[str, list[str]] = {}
    for topic in topics:
        reader = client.create_reader(topic, _earliest())
        try:
            text = _first_schema(reader, topic, timeout_ms)
        finally:
            reader.close()
        found.setdefault(text, []).append(topic)
    if len(found) != 1:
        groups = "; ".join(", ".join(ts) for ts in found.values())
        raise OptionError(
            f"option 'valueSchema': the topics' first envelopes carry different schemas ({groups}); give "
            "option valueSchema",
            "valueSchema",
        )
    return next(iter(found))


def _earliest() -> Any:
    import pulsar

    return pulsar.MessageId.earliest


def _first_schema(reader: Any, topic: str, timeout_ms: int) -> str:
    import pulsar

    while True:
        try:
            msg = reader.read_next(timeout_ms)
        except pulsar.Timeout:
            raise OptionError(
                f"option 'valueSchema' is required: topic {topic} has no Debezium change to read the row schema "
                "from (it is empty); give option valueSchema",
                "valueSchema",
            ) from None
        value = value_of(msg.data())
        if not value:
            continue  # a tombstone
        try:
            doc = json.loads(value)
            schema = doc["schema"]
            if isinstance(doc.get("payload"), dict) and doc["payload"].get("op") == "t":
                continue  # a truncate's schema has no row
            return record_schema_of(schema)
        except (ValueError, KeyError, TypeError) as exc:
            mid = msg.message_id()
            raise OptionError(
                f"option 'valueSchema' is required: the first change of topic {topic} (message "
                f"{[mid.ledger_id(), mid.entry_id(), mid.batch_index()]}) carries no row schema ({exc}); give "
                "option valueSchema, or publish envelopes with schemas (converter schemas.enable=true)",
                "valueSchema",
            ) from None



# ------------------------------------------------------------------ Avro: the Pulsar IO Debezium sources
def registry_envelope_avro(admin: Any, topics: list[str]) -> str | None:
    """The Avro schema (JSON text) of the Debezium envelope when the schema registry says the topics' values
    are Avro: a ``KEY_VALUE`` schema whose value is ``AVRO`` (what the Pulsar IO Debezium sources register
    with Avro converters), or a plain ``AVRO`` one. ``None`` when the values are JSON or have no schema."""
    found: set[str] = set()
    for topic in topics:
        answer = admin.topic_schema(topic)
        if answer is None:
            continue
        kind, data, props = answer.get("type"), answer.get("data"), answer.get("properties") or {}
        if kind == "KEY_VALUE" and props.get("value.schema.type") == "AVRO" and isinstance(data, str):
            found.add(json.dumps(json.loads(data)["value"], sort_keys=True))
        elif kind == "AVRO" and isinstance(data, str):
            found.add(json.dumps(json.loads(data), sort_keys=True))
    if len(found) > 1:
        raise OptionError(
            f"option 'valueSchema': the topics' Debezium envelopes have different Avro schemas in the schema "
            f"registry ({', '.join(topics)}); read them in separate queries",
            "valueSchema",
        )
    return next(iter(found), None)


def record_schema_of_avro(envelope: Any) -> str:
    """The row's record schema (as option ``valueSchema`` takes it) from a Debezium envelope's Avro schema:
    its ``after`` field (a union of null and the row record); Debezium's ``connect.name`` time types become
    logical types."""
    fields = envelope.get("fields") if isinstance(envelope, dict) else None
    images = {f.get("name"): f.get("type") for f in fields or [] if isinstance(f, dict)}
    # Avro defines a named type once: "after" usually refers by name to the record "before" defines, by its
    # short name when it shares the envelope's namespace (as Avro's Java library writes schemas out).
    space = _namespace(envelope) if isinstance(envelope, dict) else None
    named = {_full_name(t, space): t for image in images.values()
             for t in (image if isinstance(image, list) else [image]) if isinstance(t, dict) and t.get("type") == "record"}
    row = images.get("after")
    for t in row if isinstance(row, list) else [row]:
        row = named.get(t if "." in t or not space else f"{space}.{t}") if isinstance(t, str) else t
        if isinstance(row, dict):
            break
    if not isinstance(row, dict) or not isinstance(row.get("fields"), list):
        raise OptionError("option 'valueSchema': the registry's Avro envelope has no 'after' record", "valueSchema")
    out = []
    for col in row["fields"]:
        t = col.get("type")
        options = t if isinstance(t, list) else [t]
        typed = [_avro_type(x) for x in options]
        out.append({"name": col.get("name"), "type": typed if isinstance(t, list) else typed[0]})
    return json.dumps({"type": "record", "name": str(row.get("name") or "Row"), "fields": out}, sort_keys=True)


def _namespace(record: dict[str, Any]) -> str | None:
    name = str(record.get("name"))
    return name.rpartition(".")[0] if "." in name else (record.get("namespace") or None)


def _full_name(record: dict[str, Any], enclosing: str | None = None) -> str:
    """A named type's full name; without a namespace of its own it takes the enclosing one (Avro's rule)."""
    name = str(record.get("name"))
    space = record.get("namespace") or enclosing
    return name if "." in name or not space else f"{space}.{name}"


def _avro_type(t: Any) -> Any:
    if isinstance(t, dict):
        logical = _CONNECT_LOGICAL.get(str(t.get("connect.name")))
        if logical is not None:
            return logical
        if "logicalType" not in t and isinstance(t.get("type"), str):
            return t["type"]
    return t


# ------------------------------------------------------------------ envelopes into change records
class Change(NamedTuple):
    """A decoded Debezium change: the change record's columns other than the sequence and channel ones."""

    op: str
    commit: datetime
    values: list[Any]
    """The table's columns, in the schema's order."""
    unchanged: list[str] | None = None
    """``_unchanged``: columns Debezium did not have (its placeholder), see :mod:`cdc.model`."""
    old_key: dict[str, Any] | None = None
    """``_old_key``: on the create that ends a key change, the deleted key."""


@dataclass
class _Deleted:
    """The last delete a channel read: the create of a key change follows it (see the module)."""

    source: Any
    key: dict[str, Any]
    before: dict[str, Any]


class ChangeDecoder:
    """Decodes one channel's Debezium envelopes, in order, into the pieces of change records of one table:
    ``valueSchema`` (the row's record schema) and ``changeKeys`` give the change schema (:attr:`change`,
    partial and with key changes: see the module on placeholders and key changes).

    ``events_schema``: ``valueSchema`` was read from the first envelope's schema, so every later envelope's
    schema (``schemas.enable=true``) must give the same row. ``envelope_avro``: the envelopes are Avro records
    of this schema (JSON text) rather than JSON. ``placeholder``: the connector's
    ``unavailable.value.placeholder``. Backends call :meth:`decode` with an envelope's bytes, or
    :meth:`decode_envelope` with one they decoded themselves (Confluent-framed Avro). The decoder keeps the
    channel's last delete, so it reads one channel's envelopes in order."""

    def __init__(
        self,
        value_schema: str | None,
        change_keys: str | None,
        events_schema: bool = False,
        envelope_avro: str | None = None,
        placeholder: str = DEFAULT_PLACEHOLDER,
    ) -> None:
        import pyarrow as pa

        from cdc.formats.rows import RowField, parse_avro_schema, parse_record_schema
        from cdc.model import ChangeSchema

        self.events_schema = json.dumps(json.loads(value_schema), sort_keys=True) if events_schema and value_schema else None
        self._same_schemas: list[Any] = []
        self._envelope_avro: Any = parse_avro_schema(envelope_avro) if envelope_avro else None
        if not value_schema:
            raise OptionError("option 'valueSchema' is required with valueFormat=debezium", "valueSchema")
        fields = parse_record_schema(value_schema)
        keys = [k.strip() for k in (change_keys or "").split(",") if k.strip()]
        table = pa.schema([pa.field(f.name, f.arrow, nullable=f.nullable) for f in fields])
        try:
            self.change: ChangeSchema = ChangeSchema.of(table, keys, partial=True, key_changes=True)
        except ValueError as exc:
            raise OptionError(f"options 'valueSchema'/'changeKeys': {exc}", "changeKeys") from None
        # The change model makes key columns non-null whatever the schema says.
        self.fields = [RowField(f.name, f.arrow, f.nullable and f.name not in keys, f.convert) for f in fields]
        # How the placeholder appears in each text or bytes value column of an image (JSON: bytes as base64).
        octets = placeholder_octets(placeholder)
        forms = {pa.string(): (octets.decode("utf-8", "replace"),),
                 pa.binary(): (base64.b64encode(octets).decode("ascii"), octets)}
        self._placeholders: dict[str, tuple[Any, ...]] = {
            f.name: forms[f.arrow] for f in self.fields if f.arrow in forms and f.name not in keys
        }
        self._deleted: _Deleted | None = None

    def decode(self, value: bytes, fallback_ms: int) -> Change | None:
        """The change of an envelope's bytes; ``None`` for a tombstone (empty). The commit time falls back to
        ``fallback_ms`` (the message's own time) when the envelope has none. A truncate raises
        :class:`TruncateEvent`; an undecodable envelope :class:`~cdc.formats.rows.Malformed`; an envelope whose
        schema differs from the one the query read from the topic :class:`~cdc.errors.SchemaChangedError`."""
        from cdc.formats.rows import decode_avro, decode_object

        if not value:
            return None
        env = decode_avro(value, self._envelope_avro) if self._envelope_avro else decode_object(value)
        return self.decode_envelope(env, fallback_ms)

    def decode_envelope(self, env: dict[str, Any], fallback_ms: int) -> Change:
        """:meth:`decode` of an envelope already decoded into a dict."""
        from cdc.formats.rows import Malformed, brief, row_values
        from cdc.model import Op

        if "op" not in env and isinstance(env.get("payload"), dict):
            if self.events_schema is not None:
                self._check_events_schema(env.get("schema"))
            env = env["payload"]  # Debezium's JSON converter with schemas.enable=true
        deleted, self._deleted = self._deleted, None
        op = env.get("op")
        if op == "t":
            raise TruncateEvent(source_table(env), self._commit_time(env, fallback_ms))
        ops = {"c": Op.INSERT, "u": Op.UPDATE, "d": Op.DELETE, "r": Op.SNAPSHOT}
        if not isinstance(op, str) or op not in ops:
            raise Malformed(f"envelope 'op' must be one of c, u, d, r, t; got {brief(op)}")
        image_name = "before" if op == "d" else "after"
        image = env.get(image_name)
        if not isinstance(image, dict):
            raise Malformed(f"op {op!r} needs an object in {image_name!r}, got {brief(image)}")
        commit = self._commit_time(env, fallback_ms)
        keys = self.change.keys
        if op == "d":
            row = row_values(self.fields, {k: v for k, v in image.items() if k in keys}, f"{image_name}: ")
            key = {f.name: v for f, v in zip(self.fields, row, strict=True) if f.name in keys}
            self._deleted = _Deleted(env.get("source"), key, image)
            return Change(ops[op].value, commit, row)
        # A key change's create: the delete just before it came from the same source event.
        linked = deleted if op == "c" and deleted is not None and deleted.source == env.get("source") else None
        unsent = [c for c, forms in self._placeholders.items() if image.get(c) in forms]
        if unsent:
            # The old row's image has what the new one lacks when the source logged it (REPLICA IDENTITY FULL;
            # under DEFAULT a delete's before image holds nulls there: a TOASTed value is never null).
            before = linked.before if linked is not None else env.get("before") if op == "u" else None
            if isinstance(before, dict):
                known = [c for c in unsent if before.get(c) is not None and before[c] not in self._placeholders[c]]
                if known:
                    image = {**image, **{c: before[c] for c in known}}
                    unsent = [c for c in unsent if c not in known]
        row = row_values(self.fields, image, f"{image_name}: ", unsent)
        return Change(ops[op].value, commit, row, unsent or None, None if linked is None else linked.key)
    @staticmethod
    def _commit_time(env: dict[str, Any], fallback_ms: int) -> datetime:
        from cdc.formats.rows import CALENDAR, Malformed, brief, from_epoch, integer

        name, ts, scale = commit_field(env)
        if ts is None:
            ts, scale = fallback_ms, -1000
        try:
            return from_epoch(epoch_micros(integer(ts), scale), 1, "epoch time")
        except (TypeError, ValueError):
            unit = {1: "microseconds", 1000: "nanoseconds"}.get(scale, "milliseconds")
            raise Malformed(f"envelope {name!r} must be epoch {unit} {CALENDAR}, got {brief(ts)}") from None

    def _check_events_schema(self, schema: Any) -> None:
        if any(schema == known for known in self._same_schemas):
            return
        try:
            text = record_schema_of(schema)
        except ValueError as exc:
            raise SchemaChangedError(f"its schema no longer gives the row's columns: {exc}") from None
        if text != self.events_schema:
            raise SchemaChangedError(
                f"its row schema {text} differs from the one the query read from the topic when it was "
                f"defined, {self.events_schema}; restart the query to read the new schema (or give option "
                "valueSchema)"
            )
        if len(self._same_schemas) < 16:
            self._same_schemas.append(schema)
