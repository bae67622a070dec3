"""Turning Pulsar messages into Arrow rows: raw bytes, JSON or Avro by schema, or Debezium change envelopes.

Schemas are given the way Pulsar's schema registry stores JSON and Avro schemas: an Avro record
definition, e.g. ``{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
{"name": "note", "type": ["null", "string"]}]}``. Supported field types: boolean, int, long, float,
double, string, bytes (base64 in JSON), ``{"type": "long", "logicalType": "timestamp-millis"}`` (or
``-micros``), ``{"type": "int", "logicalType": "date"}``, each optionally in a union with ``"null"``.

``valueFormat=avro`` decodes each payload as one Avro binary-encoded record (what Pulsar's AVRO schema
producers send: no header, no schema id) with fastavro; a payload that does not decode, or that holds
bytes past the record, is malformed.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

import pyarrow as pa

from cdc.backends.pulsar.errors import SequenceRangeError
from cdc.errors import OptionError, SchemaChangedError
from cdc.formats import debezium
from cdc.model import ChangeSchema, Op

KEY, TOPIC, MESSAGE_ID, PUBLISH_TIME, EVENT_TIME, PROPERTIES = (
    "__key",
    "__topic",
    "__messageId",
    "__publishTime",
    "__eventTime",
    "__properties",
)
TS = pa.timestamp("us", tz="UTC")
METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(KEY, pa.string()),
    pa.field(TOPIC, pa.string()),
    pa.field(MESSAGE_ID, pa.binary()),
    pa.field(PUBLISH_TIME, TS),
    pa.field(EVENT_TIME, TS),
    pa.field(PROPERTIES, pa.map_(pa.string(), pa.string())),
)
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Malformed(Exception):
    """A message that does not decode; carries the reason (internal: becomes fail or quarantine)."""


@dataclass(frozen=True)
class _Field:
    name: str
    arrow: pa.DataType
    nullable: bool
    convert: Callable[[Any], Any]


# Converters check that a value fits its column (Arrow would refuse it when the batch is built, far from
# the message) and its meaning (a timestamp Spark can hold); they raise TypeError/ValueError saying what
# was expected, which _row turns into Malformed.
_CALENDAR = "within years 1 to 9999"
# float32's largest finite value plus half a unit in the last place: doubles below it round to a finite float.
_FLOAT32_LIMIT = float.fromhex("0x1.fffffep127") + 2.0**103


def _integer(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("an integer")
    return v


def _conv_int_of(bits: int) -> Callable[[Any], int]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def conv(v: Any) -> int:
        n = _integer(v)
        if not low <= n <= high:
            raise ValueError(f"an integer of {bits} bits")
        return n

    return conv


def _conv_double(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("a number")
    try:
        x = float(v)
    except OverflowError:  # an integer beyond a double's range
        raise ValueError("a finite number") from None
    if not math.isfinite(x):  # 1e400 parses as inf
        raise ValueError("a finite number")
    return x


def _conv_float(v: Any) -> float:
    x = _conv_double(v)
    if abs(x) >= _FLOAT32_LIMIT:
        raise ValueError("a number within float's range (3.4e38)")
    return x


def _conv_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError("true or false")
    return v


def _conv_str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError("a string")
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:  # JSON's "\ud800" escapes decode into text UTF-8 cannot hold
            raise ValueError("text without unpaired surrogates") from None
    return v


def _conv_bytes(v: Any) -> bytes:
    if not isinstance(v, str):
        raise TypeError("a base64 string")
    return base64.b64decode(v, validate=True)


def _conv_ts(scale: int) -> Callable[[Any], datetime]:
    unit = "milliseconds" if scale == 1000 else "microseconds"

    def conv(v: Any) -> datetime:
        return _from_epoch(_integer(v), scale, f"epoch {unit}")

    return conv


def _from_epoch(n: int, scale: int, what: str) -> datetime:
    try:
        return _EPOCH + timedelta(microseconds=n * scale)
    except OverflowError:
        raise ValueError(f"{what} {_CALENDAR}") from None


def _conv_date(v: Any) -> date:
    try:
        return _EPOCH_DAY + timedelta(days=_integer(v))
    except OverflowError:
        raise ValueError(f"days since 1970-01-01 {_CALENDAR}") from None


_PRIMITIVES: dict[str, tuple[pa.DataType, Callable[[Any], Any]]] = {
    "boolean": (pa.bool_(), _conv_bool),
    "int": (pa.int32(), _conv_int_of(32)),
    "long": (pa.int64(), _conv_int_of(64)),
    "float": (pa.float32(), _conv_float),
    "double": (pa.float64(), _conv_double),
    "string": (pa.string(), _conv_str),
    "bytes": (pa.binary(), _conv_bytes),
}


def _field(spec: Any) -> _Field:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise OptionError(f"option 'valueSchema': every field needs a name and a type, got {spec!r}", "valueSchema")
    name, t = spec["name"], spec.get("type")
    nullable = False
    if isinstance(t, list):
        others = [x for x in t if x != "null"]
        nullable = len(others) < len(t)
        if len(others) != 1:
            raise OptionError(f"option 'valueSchema': field {name!r}: only unions with null are supported", "valueSchema")
        t = others[0]
    if isinstance(t, dict):
        logical = t.get("logicalType")
        base = t.get("type")
        if logical in ("timestamp-millis", "timestamp-micros") and base == "long":
            return _Field(name, TS, nullable, _conv_ts(1000 if logical == "timestamp-millis" else 1))
        if logical == "date" and base == "int":
            return _Field(name, pa.date32(), nullable, _conv_date)
        t = base if logical is None else t
    if isinstance(t, str) and t in _PRIMITIVES:
        arrow, conv = _PRIMITIVES[t]
        return _Field(name, arrow, nullable, conv)
    raise OptionError(
        f"option 'valueSchema': field {name!r} has unsupported type {t!r}; accepted: "
        f"{', '.join(_PRIMITIVES)}, timestamp-millis, timestamp-micros, date, unions with null",
        "valueSchema",
    )


def parse_record_schema(text: str) -> list[_Field]:
    spec = json.loads(text)
    if not isinstance(spec, dict) or spec.get("type") != "record" or not isinstance(spec.get("fields"), list):
        raise OptionError(
            "option 'valueSchema': expected an Avro-style record: "
            '{"type": "record", "name": ..., "fields": [{"name": ..., "type": ...}, ...]}',
            "valueSchema",
        )
    fields = [_field(f) for f in spec["fields"]]
    if not fields:
        raise OptionError("option 'valueSchema': the record has no fields", "valueSchema")
    return fields


def _brief(value: Any) -> str:
    """A value for an error message: its repr, cut short (a payload's field may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _not_a_number(name: str) -> Any:
    raise Malformed(f"not JSON: {name} is not a JSON number")


def _decode_object(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload, parse_constant=_not_a_number)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise Malformed(f"not JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise Malformed("not JSON this decoder reads: nested deeper than Python's recursion limit") from None
    if not isinstance(obj, dict):
        raise Malformed(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _row(fields: Sequence[_Field], obj: dict[str, Any], what: str, unsent: Sequence[str] = ()) -> list[Any]:
    out: list[Any] = []
    for f in fields:
        v = obj.get(f.name)
        if f.name in unsent:  # a value the source did not send (see debezium's placeholder): null, named apart
            out.append(None)
            continue
        if v is None:
            if not f.nullable:
                raise Malformed(f"{what}field {f.name!r} is missing or null but not nullable")
            out.append(None)
            continue
        try:
            out.append(f.convert(v))
        except (TypeError, ValueError) as exc:
            raise Malformed(f"{what}field {f.name!r}: expected {exc}, got {_brief(v)}") from None
    return out


def parse_avro_schema(text: str) -> Any:
    """The fastavro form of an Avro record schema (JSON text); errors name option valueSchema."""
    import fastavro

    try:
        return fastavro.parse_schema(json.loads(text))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise OptionError(f"option 'valueSchema': not a valid Avro schema: {exc}", "valueSchema") from None


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
    """The last delete a channel read: the create of a key change follows it (see :mod:`.debezium`)."""

    source: Any
    key: dict[str, Any]
    before: dict[str, Any]


class Decoder:
    """Decodes one partition's messages into Arrow batches for one value format. A Debezium decoder keeps
    the channel's last delete, so it reads one channel's messages in order."""

    def __init__(
        self,
        value_format: str,
        value_schema: str | None,
        change_keys: str | None,
        events_schema: bool = False,
        envelope_avro: str | None = None,
        placeholder: str = debezium.DEFAULT_PLACEHOLDER,
    ) -> None:
        self.value_format = value_format
        # valueSchema read from the topic's first envelope: every later envelope's schema must give it too.
        self.events_schema = json.dumps(json.loads(value_schema), sort_keys=True) if events_schema and value_schema else None
        self._same_schemas: list[Any] = []
        # The Pulsar IO Debezium sources with Avro converters: envelopes are Avro records of this schema.
        self._envelope_avro: Any = parse_avro_schema(envelope_avro) if envelope_avro else None
        self.fields: list[_Field] = parse_record_schema(value_schema) if value_schema else []
        self._avro: Any = None
        if value_format == "avro":
            if not value_schema:
                raise OptionError("option 'valueSchema' is required with valueFormat=avro", "valueSchema")
            self._avro = parse_avro_schema(value_schema)
        self.change: ChangeSchema | None = None
        self._placeholders: dict[str, tuple[Any, ...]] = {}
        if value_format == "debezium":
            keys = [k.strip() for k in (change_keys or "").split(",") if k.strip()]
            table = pa.schema([pa.field(f.name, f.arrow, nullable=f.nullable) for f in self.fields])
            try:
                self.change = ChangeSchema.of(table, keys, partial=True, key_changes=True)
            except ValueError as exc:
                raise OptionError(f"options 'valueSchema'/'changeKeys': {exc}", "changeKeys") from None
            # The change model makes key columns non-null whatever the schema says.
            self.fields = [
                _Field(f.name, f.arrow, f.nullable and f.name not in keys, f.convert) for f in self.fields
            ]
            # How the placeholder appears in each text or bytes value column of an image (JSON: bytes as base64).
            octets = debezium.placeholder_octets(placeholder)
            forms = {pa.string(): (octets.decode("utf-8", "replace"),),
                     pa.binary(): (base64.b64encode(octets).decode("ascii"), octets)}
            self._placeholders = {f.name: forms[f.arrow] for f in self.fields if f.arrow in forms and f.name not in keys}
        self._deleted: _Deleted | None = None

    def schema(self) -> pa.Schema:
        if self.change is not None:
            return self.change.arrow()
        if self.value_format in ("json", "avro"):
            return pa.schema([pa.field(f.name, f.arrow) for f in self.fields] + list(METADATA_FIELDS))
        return pa.schema([pa.field("value", pa.binary()), *METADATA_FIELDS])

    # -- per message: returns the row's values (excluding metadata) or raises Malformed
    def decode_value(self, payload: bytes) -> list[Any]:
        if self.value_format == "json":
            return _row(self.fields, _decode_object(payload), "")
        if self.value_format == "avro":
            record = self._decode_avro(payload, self._avro)
            return [record.get(f.name) for f in self.fields]
        return [payload]

    def _decode_avro(self, payload: bytes, schema: Any) -> dict[str, Any]:
        import fastavro

        buffer = io.BytesIO(payload)
        try:
            record = fastavro.schemaless_reader(buffer, schema, None)
        except Exception as exc:  # noqa: BLE001 - fastavro raises EOFError, IndexError, ValueError, ...
            raise Malformed(f"not an Avro record of the schema: {type(exc).__name__} {exc}".rstrip()) from None
        if buffer.tell() != len(payload):
            raise Malformed(f"{len(payload) - buffer.tell()} bytes after the Avro record")
        if not isinstance(record, dict):
            raise Malformed("the Avro value is not a record")
        return record

    def decode_change(self, payload: bytes, publish_ms: int) -> Change | None:
        """The change of a Debezium envelope (see :mod:`cdc.formats.debezium`); ``None`` for a
        tombstone. A truncate raises :class:`TruncateEvent`; an envelope whose schema differs from the one the
        query read from the topic raises :class:`SchemaChangedError`."""
        assert self.change is not None
        value = debezium.value_of(payload)
        if not value:
            return None
        env = self._decode_avro(value, self._envelope_avro) if self._envelope_avro else _decode_object(value)
        if "op" not in env and isinstance(env.get("payload"), dict):
            if self.events_schema is not None:
                self._check_events_schema(env.get("schema"))
            env = env["payload"]  # Debezium's JSON converter with schemas.enable=true
        deleted, self._deleted = self._deleted, None
        op = env.get("op")
        if op == "t":
            raise debezium.TruncateEvent(debezium.source_table(env), self._commit_time(env, publish_ms))
        ops = {"c": Op.INSERT, "u": Op.UPDATE, "d": Op.DELETE, "r": Op.SNAPSHOT}
        if not isinstance(op, str) or op not in ops:
            raise Malformed(f"envelope 'op' must be one of c, u, d, r, t; got {_brief(op)}")
        image_name = "before" if op == "d" else "after"
        image = env.get(image_name)
        if not isinstance(image, dict):
            raise Malformed(f"op {op!r} needs an object in {image_name!r}, got {_brief(image)}")
        commit = self._commit_time(env, publish_ms)
        keys = self.change.keys
        if op == "d":
            row = _row(self.fields, {k: v for k, v in image.items() if k in keys}, f"{image_name}: ")
            self._deleted = _Deleted(env.get("source"), {f.name: v for f, v in zip(self.fields, row, strict=True)
                                                         if f.name in keys}, image)
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
        row = _row(self.fields, image, f"{image_name}: ", unsent)
        return Change(ops[op].value, commit, row, unsent or None, None if linked is None else linked.key)

    @staticmethod
    def _commit_time(env: dict[str, Any], publish_ms: int) -> datetime:
        name, ts, scale = debezium.commit_field(env)
        if ts is None:
            ts, scale = publish_ms, -1000
        try:
            return _from_epoch(debezium.epoch_micros(_integer(ts), scale), 1, "epoch time")
        except (TypeError, ValueError):
            unit = {1: "microseconds", 1000: "nanoseconds"}.get(scale, "milliseconds")
            raise Malformed(f"envelope {name!r} must be epoch {unit} {_CALENDAR}, got {_brief(ts)}") from None

    def _check_events_schema(self, schema: Any) -> None:
        if any(schema == known for known in self._same_schemas):
            return
        try:
            text = debezium.record_schema_of(schema)
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


# Sequence numbers of change records come from message ids: (ledger, entry, batch) packed into 63 bits.
# Ledger ids are cluster-wide BookKeeper counters that only grow, so they get the most room (4.29 billion);
# entries per ledger are capped by the broker's rollover (managedLedgerMaxEntriesPerLedger, 50,000 by
# default: 10x headroom); a batch holds at most 4,094 messages (producers batch 1,000 by default).
_LEDGER_BITS, _ENTRY_BITS, _BATCH_BITS = 32, 19, 12


def sequence_of(ledger: int, entry: int, batch: int) -> int:
    """A long that orders a partition's messages like their ids do (batch index -1: not in a batch)."""
    if not (0 <= ledger < 1 << _LEDGER_BITS and 0 <= entry < 1 << _ENTRY_BITS and -2 <= batch < (1 << _BATCH_BITS) - 2):
        raise SequenceRangeError(
            f"message id ({ledger}, {entry}, {batch}) does not fit the change model's 63-bit sequence "
            f"(ledger < 2^{_LEDGER_BITS}, entry < 2^{_ENTRY_BITS}, batch index < 2^{_BATCH_BITS} - 2); keep the "
            "broker's managedLedgerMaxEntriesPerLedger and the producers' batchingMaxMessages below those limits"
        )
    return (ledger << (_ENTRY_BITS + _BATCH_BITS)) | (entry << _BATCH_BITS) | (batch + 2)
