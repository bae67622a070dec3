"""Rows of Avro-style record schemas: the column types and checked conversions every decoder of JSON or Avro
values shares (Pulsar's ``valueFormat=json|avro``, Debezium's row images from any backend).

A schema is an Avro record definition, e.g. ``{"type": "record", "name": "Order", "fields": [{"name": "id",
"type": "long"}, {"name": "note", "type": ["null", "string"]}]}``. Supported field types: boolean, int, long,
float, double, string, bytes (base64 in JSON), ``{"type": "long", "logicalType": "timestamp-millis"}`` (or
``-micros``), ``{"type": "int", "logicalType": "date"}``, each optionally in a union with ``"null"``.
A value that does not fit its column raises :class:`Malformed`, which the reading backend turns into a failure
or a quarantined message (``onMalformed``).
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from cdc.errors import OptionError

TS = pa.timestamp("us", tz="UTC")
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Malformed(Exception):
    """A message that does not decode; carries the reason (internal: becomes fail or quarantine)."""


@dataclass(frozen=True)
class RowField:
    name: str
    arrow: pa.DataType
    nullable: bool
    convert: Callable[[Any], Any]


# Converters check that a value fits its column (Arrow would refuse it when the batch is built, far from
# the message) and its meaning (a timestamp Spark can hold); they raise TypeError/ValueError saying what
# was expected, which row_values turns into Malformed.
CALENDAR = "within years 1 to 9999"
# float32's largest finite value plus half a unit in the last place: doubles below it round to a finite float.
_FLOAT32_LIMIT = float.fromhex("0x1.fffffep127") + 2.0**103


def integer(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("an integer")
    return v


def _conv_int_of(bits: int) -> Callable[[Any], int]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def conv(v: Any) -> int:
        n = integer(v)
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
        return from_epoch(integer(v), scale, f"epoch {unit}")

    return conv


def from_epoch(n: int, scale: int, what: str) -> datetime:
    try:
        return _EPOCH + timedelta(microseconds=n * scale)
    except OverflowError:
        raise ValueError(f"{what} {CALENDAR}") from None


def _conv_date(v: Any) -> date:
    try:
        return _EPOCH_DAY + timedelta(days=integer(v))
    except OverflowError:
        raise ValueError(f"days since 1970-01-01 {CALENDAR}") from None


_PRIMITIVES: dict[str, tuple[pa.DataType, Callable[[Any], Any]]] = {
    "boolean": (pa.bool_(), _conv_bool),
    "int": (pa.int32(), _conv_int_of(32)),
    "long": (pa.int64(), _conv_int_of(64)),
    "float": (pa.float32(), _conv_float),
    "double": (pa.float64(), _conv_double),
    "string": (pa.string(), _conv_str),
    "bytes": (pa.binary(), _conv_bytes),
}


def _field(spec: Any) -> RowField:
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
            return RowField(name, TS, nullable, _conv_ts(1000 if logical == "timestamp-millis" else 1))
        if logical == "date" and base == "int":
            return RowField(name, pa.date32(), nullable, _conv_date)
        t = base if logical is None else t
    if isinstance(t, str) and t in _PRIMITIVES:
        arrow, conv = _PRIMITIVES[t]
        return RowField(name, arrow, nullable, conv)
    raise OptionError(
        f"option 'valueSchema': field {name!r} has unsupported type {t!r}; accepted: "
        f"{', '.join(_PRIMITIVES)}, timestamp-millis, timestamp-micros, date, unions with null",
        "valueSchema",
    )


def parse_record_schema(text: str) -> list[RowField]:
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


def brief(value: Any) -> str:
    """A value for an error message: its repr, cut short (a payload's field may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _not_a_number(name: str) -> Any:
    raise Malformed(f"not JSON: {name} is not a JSON number")


def decode_object(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload, parse_constant=_not_a_number)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise Malformed(f"not JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise Malformed("not JSON this decoder reads: nested deeper than Python's recursion limit") from None
    if not isinstance(obj, dict):
        raise Malformed(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def row_values(fields: Sequence[RowField], obj: dict[str, Any], what: str, unsent: Sequence[str] = ()) -> list[Any]:
    """The values of ``fields`` in ``obj``, converted; a field named in ``unsent`` (a value the source did not
    send, see :mod:`cdc.formats.debezium`'s placeholder) is null whatever ``obj`` holds."""
    out: list[Any] = []
    for f in fields:
        v = obj.get(f.name)
        if f.name in unsent:
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
            raise Malformed(f"{what}field {f.name!r}: expected {exc}, got {brief(v)}") from None
    return out


def parse_avro_schema(text: str) -> Any:
    """The fastavro form of an Avro record schema (JSON text); errors name option valueSchema."""
    import fastavro

    try:
        return fastavro.parse_schema(json.loads(text))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise OptionError(f"option 'valueSchema': not a valid Avro schema: {exc}", "valueSchema") from None


def decode_avro(payload: bytes, schema: Any) -> dict[str, Any]:
    """One Avro binary record of ``schema`` (fastavro's parsed form) filling ``payload`` exactly."""
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


def type_default(t: pa.DataType) -> Any:
    """A value of type ``t`` that means nothing (a truncate record's key columns, which cannot be null)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_boolean(t):
        return False
    if pa.types.is_timestamp(t):
        return datetime(1970, 1, 1, tzinfo=UTC)
    if pa.types.is_date(t):
        return date(1970, 1, 1)
    if pa.types.is_decimal(t):
        return Decimal(0)
    return 0
