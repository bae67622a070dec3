"""MySQL's binary value formats (row images) into Arrow arrays, a column at a time.

:func:`.records.decode_rows` keeps each value as it lies in the row image (ints and floats unpacked, the rest as
bytes); :func:`convert` turns a column of them into its Arrow type at once: fixed-width packed dates and times by
numpy, strings by Arrow's UTF-8 check, labels by a lookup. The formats are MySQL's (and MariaDB's, which
shares them): ``DECIMAL`` nine digits in four bytes, big-endian, the sign in the first bit; ``DATETIME2``,
``TIMESTAMP2``, ``TIME2`` big-endian with their fractional seconds in 0 to 3 more bytes; ``DATE`` 3 bytes,
little-endian. Zero and impossible dates become null (see :mod:`.catalog`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.json_binary import parse_json

from cdc.backends.mysql.catalog import (
    BINARY,
    BIT,
    DATE,
    DATETIME,
    DECIMAL,
    ENUM,
    JSON,
    SET,
    TEXT,
    TIME,
    TIMESTAMP,
    YEAR,
)

if TYPE_CHECKING:
    from cdc.backends.mysql.records import ColumnSpec

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decimal_bytes(precision: int, scale: int) -> int:
    """Bytes of a ``DECIMAL(precision, scale)`` in MySQL's binary form (nine digits in four bytes)."""
    whole = precision - scale
    return whole // 9 * 4 + _DIG2BYTES[whole % 9] + scale // 9 * 4 + _DIG2BYTES[scale % 9]


def fraction_bytes(fsp: int) -> int:
    """Bytes of the fractional seconds of a temporal type with ``fsp`` digits."""
    return (fsp + 1) // 2


def _packed(raw: Sequence[bytes | None], width: int, big_endian: bool) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-width packed integers (``width`` <= 8 bytes) as uint64, and which are not null."""
    valid = np.fromiter((v is not None for v in raw), dtype=bool, count=len(raw))
    zero = bytes(width)
    buf = b"".join(zero if v is None else v for v in raw)
    digits = np.frombuffer(buf, dtype=np.uint8).reshape(-1, width).astype(np.uint64)
    weights = np.array([1 << (8 * i) for i in range(width)], dtype=np.uint64)
    if big_endian:
        weights = weights[::-1]
    return digits @ weights, valid


def _days(year: np.ndarray, month: np.ndarray, day: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970-01-01 of (year, month, day), and the validity: zero and impossible dates are invalid."""
    ok = valid & (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)
    y = np.where(ok, year, 1970).astype(np.int64)
    m = np.where(ok, month, 1).astype(np.int64)
    d = np.where(ok, day, 1).astype(np.int64)
    months = (y - 1970) * 12 + (m - 1)
    first = months.astype("datetime64[M]").astype("datetime64[D]")
    dates = first + (d - 1).astype("timedelta64[D]")
    ok &= dates.astype("datetime64[M]") == months.astype("datetime64[M]")  # 31 February and the like
    return dates.astype(np.int64), ok


_FRACTION_SCALE = {0: 0, 1: 10_000, 2: 100, 3: 1}


def _datetime2(raw: Sequence[bytes | None], fsp: int) -> pa.Array:
    fraction = fraction_bytes(fsp)
    packed, valid = _packed(raw, 5 + fraction, True)
    shift = np.uint64(8 * fraction)
    whole = (packed >> shift).astype(np.int64) - 0x8000000000
    micros = (packed & np.uint64((1 << (8 * fraction)) - 1)).astype(np.int64) * _FRACTION_SCALE[fraction]
    ymd, hms = whole >> 17, whole & 0x1FFFF
    days, ok = _days((ymd >> 5) // 13, (ymd >> 5) % 13, ymd & 31, valid & (whole >= 0))
    hour, minute, second = hms >> 12, (hms >> 6) & 63, hms & 63
    ok &= (hour < 24) & (minute < 60) & (second < 60)
    value = days * 86_400_000_000 + (hour * 3600 + minute * 60 + second) * 1_000_000 + micros
    return pa.array(value, pa.timestamp("us", tz="UTC"), mask=~ok)


def _timestamp2(raw: Sequence[bytes | None], fsp: int) -> pa.Array:
    fraction = fraction_bytes(fsp)
    packed, valid = _packed(raw, 4 + fraction, True)
    shift = np.uint64(8 * fraction)
    seconds = (packed >> shift).astype(np.int64)
    micros = (packed & np.uint64((1 << (8 * fraction)) - 1)).astype(np.int64) * _FRACTION_SCALE[fraction]
    ok = valid & (seconds != 0)  # 0 is the zero TIMESTAMP (the epoch itself is out of TIMESTAMP's range)
    return pa.array(seconds * 1_000_000 + micros, pa.timestamp("us", tz="UTC"), mask=~ok)


def _date(raw: Sequence[bytes | None]) -> pa.Array:
    packed, valid = _packed(raw, 3, False)
    v = packed.astype(np.int64)
    days, ok = _days(v >> 9, (v >> 5) & 15, v & 31, valid)
    return pa.array(days.astype(np.int32), pa.date32(), mask=~ok)


def time_text(value: bytes, fsp: int) -> str:
    """A ``TIME(fsp)`` in MySQL's text form, ``[-]HH:MM:SS[.f...]`` (hours up to 838)."""
    fraction = fraction_bytes(fsp)
    whole = int.from_bytes(value[:3], "big") - 0x800000
    if fraction == 3:
        packed = int.from_bytes(value[:6], "big") - 0x800000000000
    else:
        frac = int.from_bytes(value[3 : 3 + fraction], "big") if fraction else 0
        if whole < 0 and frac:  # a negative time with a fraction is stored as (whole + 1, frac - 1.0)
            whole += 1
            frac -= 1 << (8 * fraction)
        packed = (whole << 24) + frac * _FRACTION_SCALE[fraction]
    sign = "-" if packed < 0 else ""
    packed = abs(packed)
    hms, micros = packed >> 24, packed & 0xFFFFFF
    text = f"{sign}{(hms >> 12) & 0x3FF:02d}:{(hms >> 6) & 63:02d}:{hms & 63:02d}"
    return text + (f".{micros:06d}"[: fsp + 1] if fsp else "")


def _time_v1(value: bytes) -> str:
    v = int.from_bytes(value, "little", signed=True)
    sign = "-" if v < 0 else ""
    v = abs(v)
    return f"{sign}{v // 10000:02d}:{v // 100 % 100:02d}:{v % 100:02d}"


def _datetime_v1(value: bytes) -> int | None:
    v = int.from_bytes(value, "little")
    d, t = divmod(v, 1_000_000)
    try:
        when = datetime(d // 10000, d // 100 % 100, d % 100, t // 10000, t // 100 % 100, t % 100, tzinfo=UTC)
    except ValueError:
        return None  # a zero or invalid date
    return int(when.timestamp()) * 1_000_000


@functools.lru_cache(maxsize=256)
def _decimal_layout(precision: int, scale: int) -> tuple[tuple[int, int, int], ...]:
    """(power of ten, bytes, mask) of each group of a ``DECIMAL``'s binary form, most significant first: the
    leading digits of the integer part, nine-digit groups, then the fraction's groups and its trailing digits."""
    whole = precision - scale
    groups = [(whole % 9, _DIG2BYTES[whole % 9]), *[(9, 4)] * (whole // 9), *[(9, 4)] * (scale // 9),
              (scale % 9, _DIG2BYTES[scale % 9])]
    return tuple((10**digits, size, (1 << (8 * size)) - 1) for digits, size in groups if size)


def unscaled_decimal(value: bytes, precision: int, scale: int) -> int:
    """A ``DECIMAL`` in MySQL's binary form as its unscaled integer (12.34 in ``DECIMAL(10,2)`` -> 1234): the sign
    is the first bit, inverted, and a negative number has every other bit inverted too."""
    bits = 8 * len(value)
    x = int.from_bytes(value, "big") ^ (1 << (bits - 1))
    negative = not value[0] & 0x80
    if negative:
        x ^= (1 << bits) - 1
    out = 0
    for power, size, mask in _decimal_layout(precision, scale):
        bits -= 8 * size
        out = out * power + (x >> bits & mask)
    return -out if negative else out


def _decimal(raw: Sequence[bytes | None], precision: int, scale: int, target: pa.DataType) -> pa.Array:
    values = [None if v is None else unscaled_decimal(v, precision, scale) for v in raw]
    if pa.types.is_decimal(target):
        # Built from the unscaled values' 16-byte two's complements: no Decimal object per value.
        data = b"".join((0 if v is None else v).to_bytes(16, "little", signed=True) for v in values)
        validity = pa.array([v is not None for v in values], pa.bool_()).buffers()[1] if None in values else None
        return pa.Array.from_buffers(target, len(values), [validity, pa.py_buffer(data)])
    # Decimal from text is exact (scaleb would round to the context's 28 digits).
    return pa.array([None if v is None else format(Decimal(f"{v}e-{scale}"), "f") for v in values], pa.string())


def _text(raw: Sequence[bytes | None], encoding: str | None) -> pa.Array:
    if encoding in (None, "utf8", "utf8mb4", "utf-8"):
        return pa.array(raw, pa.binary()).cast(pa.string())  # Arrow checks the UTF-8
    return pa.array([None if v is None else v.decode(encoding) for v in raw], pa.string())


def _labels(raw: Sequence[bytes | None], labels: tuple[str, ...]) -> pa.Array:
    """``ENUM`` indexes to their labels."""
    index = [None if v is None else int.from_bytes(v, "little") for v in raw]
    if any(i is not None and i >= len(labels) for i in index):
        raise ValueError(f"an ENUM index beyond its {len(labels) - 1} labels")
    return pa.array(labels, pa.string()).take(pa.array(index, pa.int32()))


def _set(raw: Sequence[bytes | None], labels: tuple[str, ...]) -> pa.Array:
    seen: dict[bytes, str] = {}
    out: list[str | None] = []
    for v in raw:
        if v is None:
            out.append(None)
            continue
        text = seen.get(v)
        if text is None:
            bits = int.from_bytes(v, "little")
            text = seen[v] = ",".join(label for i, label in enumerate(labels) if bits >> i & 1)
        out.append(text)
    return pa.array(out, pa.string())


def _json_text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_text(k): _json_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_text(v) for v in value]
    return value


def mysql_json(value: bytes) -> str:
    """A MySQL binary JSON value in MySQL's text form (``{"a": 1, "b": [1, 2]}``)."""
    if not value:
        return "null"
    return json.dumps(_json_text(parse_json(value[0], value[1:])), ensure_ascii=False)


def convert(spec: ColumnSpec, raw: Sequence[Any], target: pa.DataType) -> pa.Array:
    """A column of raw values (as :func:`decode_rows` appends them) as an Arrow array of ``target``."""
    kind, t = spec.type.kind, spec.field_type
    if kind == TEXT:
        return _text(raw, spec.encoding)
    if kind == BINARY:
        if spec.width:
            return pa.array([None if v is None else v.ljust(spec.width, b"\0") for v in raw], pa.binary())
        return pa.array(raw, pa.binary())
    if kind == DATETIME:
        if t == FIELD_TYPE.DATETIME:
            return pa.array([None if v is None else _datetime_v1(v) for v in raw], target)
        return _datetime2(raw, spec.fsp)
    if kind == TIMESTAMP:
        if t == FIELD_TYPE.TIMESTAMP:  # the old format: 4 bytes of seconds, little-endian; 0 is the zero value
            seconds = [None if v is None else int.from_bytes(v, "little") for v in raw]
            return pa.array([s * 1_000_000 if s else None for s in seconds], target)
        return _timestamp2(raw, spec.fsp)
    if kind == DATE:
        return _date(raw)
    if kind == TIME:
        if t == FIELD_TYPE.TIME:
            return pa.array([None if v is None else _time_v1(v) for v in raw], pa.string())
        return pa.array([None if v is None else time_text(v, spec.fsp) for v in raw], pa.string())
    if kind == DECIMAL:
        return _decimal(raw, spec.type.size, spec.type.scale, target)
    if kind == YEAR:
        return pa.array([None if v is None else (v + 1900 if v else 0) for v in raw], target)
    if kind == BIT:
        if pa.types.is_boolean(target):
            return pa.array([None if v is None else any(v) for v in raw], pa.bool_())
        return pa.array(raw, pa.binary())
    if kind == ENUM:
        return _labels(raw, spec.labels)
    if kind == SET:
        return _set(raw, spec.labels)
    if kind == JSON:
        return pa.array([None if v is None else mysql_json(v) for v in raw], pa.string())
    return pa.array(raw, target)  # integers, floats


# ------------------------------------------------------------------------------------------ the text protocol
def _strings(raw: Sequence[Any]) -> pa.Array:
    """Values as a query without converters returns them (``bytes`` or ``str``) as an Arrow string array."""
    return pa.array([v.decode() if isinstance(v, (bytes, bytearray)) else v for v in raw], pa.string())


def _temporal(raw: Sequence[Any], parse: Any) -> list[Any]:
    out: list[Any] = []
    for v in raw:
        if v is None:
            out.append(None)
            continue
        try:
            out.append(parse(v.decode() if isinstance(v, (bytes, bytearray)) else v))
        except ValueError:  # zero and impossible dates ('0000-00-00', '2024-00-10'): null, as in the binary log
            out.append(None)
    return out


def from_text(column: Any, raw: Sequence[Any], target: pa.DataType) -> pa.Array:
    """A column of values as the server's text protocol sends them (a snapshot's ``SELECT``, times in UTC) as an
    Arrow array of ``target``, equal to what :func:`convert` makes of the same values in the binary log.
    ``column`` is the column's :class:`~.catalog.ColumnType`."""
    kind = column.kind
    if kind in (TEXT, ENUM, SET, JSON, TIME):
        return _strings(raw)
    if kind == BINARY:
        return pa.array([None if v is None else v.encode() if isinstance(v, str) else bytes(v) for v in raw],
                        pa.binary())
    if kind == BIT:
        if pa.types.is_boolean(target):
            return pa.array([None if v is None else any(v) for v in raw], pa.bool_())
        return pa.array(raw, pa.binary())
    if kind == DATE:
        return pa.array(_temporal(raw, date.fromisoformat), pa.date32())
    if kind in (DATETIME, TIMESTAMP):
        return pa.array(_temporal(raw, lambda s: datetime.fromisoformat(s).replace(tzinfo=UTC)), target)
    if pa.types.is_decimal(target) and column.kind != DECIMAL:  # BIGINT UNSIGNED
        return pa.array([None if v is None else Decimal(v.decode() if isinstance(v, bytes) else v) for v in raw], target)
    return _strings(raw).cast(target)  # integers, YEAR, DECIMAL, floats
