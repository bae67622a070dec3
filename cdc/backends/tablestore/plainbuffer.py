"""PlainBuffer: Tablestore's row encoding, read and written (stream records included).

The format (checked against the public Java and Go SDKs' ``PlainBufferCodedInputStream`` /
``PlainBufferCrc8``, and the Python SDK's ``tablestore/plainbuffer/``)::

    rows     = header:uint32le(0x75) row*
    row      = TAG_ROW_PK cell* [TAG_ROW_DATA cell*] [TAG_DELETE_ROW_MARKER] [extension] TAG_ROW_CHECKSUM crc8
    cell     = TAG_CELL [TAG_CELL_NAME len:int32le utf8] [TAG_CELL_VALUE len:int32le variant]
               [TAG_CELL_TYPE byte] [TAG_CELL_TIMESTAMP int64le] TAG_CELL_CHECKSUM crc8
    variant  = VT_INTEGER int64le | VT_DOUBLE float64le | VT_BOOLEAN byte | VT_STRING len:int32le utf8
               | VT_BLOB len:int32le bytes | VT_INF_MIN | VT_INF_MAX | VT_AUTO_INCREMENT
    extension= TAG_EXTENSION len:int32le (TAG_SEQ_INFO len:int32le TAG_SEQ_INFO_EPOCH int32le
               TAG_SEQ_INFO_TS int64le TAG_SEQ_INFO_ROW_INDEX int32le | unknown-tag len:int32le bytes)*

Checksums are CRC-8/ATM (polynomial x^8 + x^2 + x + 1). A cell's checksum covers its name bytes, its
value (type byte, then for strings/blobs the int32 length and the bytes, for integers/doubles the 8
little-endian bytes, for booleans one byte 0/1), then its timestamp (8 bytes), then its cell type
byte, in that order (the order differs from the wire order of type and timestamp). A row's checksum
covers each cell checksum (primary key, then data cells), then one byte: 1 if the row carries the
delete marker, else 0. The extension is NOT covered by the row checksum (as in the Java SDK).

Stream records (tunnel ``ReadRecords``) are one row each, with header, data cells that may carry a
cell type (``DELETE_ONE_VERSION`` = 3, ``DELETE_ALL_VERSION`` = 1) and a timestamp, and the extension
with the sequence info ``(epoch, timestamp, row_index)``. The PyPI SDK's reader fails on those (it
names an undefined variable on typed cells and rejects the extension tag), hence this module.

Every malformed input raises :class:`PlainBufferError` (a bad checksum included); nothing is
silently skipped.

Example::

    >>> row = Row(primary_key=(("id", 1),), cells=(Cell("v", "x", timestamp=5),),
    ...           sequence_info=SequenceInfo(epoch=1, timestamp=1700000000000000, row_index=0))
    >>> decode_row(encode_row(row)) == row
    True
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cdc.errors import MalformedRecordError

__all__ = [
    "AUTO_INCREMENT",
    "DELETE_ALL_VERSION",
    "DELETE_ONE_VERSION",
    "HEADER",
    "INCREMENT",
    "INF_MAX",
    "INF_MIN",
    "Cell",
    "PlainBufferError",
    "PrimaryKeyValue",
    "Row",
    "SequenceInfo",
    "Special",
    "Value",
    "crc8",
    "decode_row",
    "decode_rows",
    "encode_row",
    "encode_rows",
]

HEADER = 0x75

TAG_ROW_PK = 0x01
TAG_ROW_DATA = 0x02
TAG_CELL = 0x03
TAG_CELL_NAME = 0x04
TAG_CELL_VALUE = 0x05
TAG_CELL_TYPE = 0x06
TAG_CELL_TIMESTAMP = 0x07
TAG_DELETE_ROW_MARKER = 0x08
TAG_ROW_CHECKSUM = 0x09
TAG_CELL_CHECKSUM = 0x0A
TAG_EXTENSION = 0x0B
TAG_SEQ_INFO = 0x0C
TAG_SEQ_INFO_EPOCH = 0x0D
TAG_SEQ_INFO_TS = 0x0E
TAG_SEQ_INFO_ROW_INDEX = 0x0F
_KNOWN_TAGS = frozenset(range(0x01, 0x10))

DELETE_ALL_VERSION = 0x01
DELETE_ONE_VERSION = 0x03
INCREMENT = 0x04
_CELL_TYPES = {
    DELETE_ALL_VERSION: "DELETE_ALL_VERSION",
    DELETE_ONE_VERSION: "DELETE_ONE_VERSION",
    INCREMENT: "INCREMENT",
}

VT_INTEGER = 0x0
VT_DOUBLE = 0x1
VT_BOOLEAN = 0x2
VT_STRING = 0x3
VT_BLOB = 0x7
VT_INF_MIN = 0x9
VT_INF_MAX = 0xA
VT_AUTO_INCREMENT = 0xB

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
# epoch tag + int32, timestamp tag + int64, row-index tag + int32 (Java: computeSkipLengthForSequenceInfo)
_SEQ_INFO_SIZE = 5 + 9 + 5


class PlainBufferError(MalformedRecordError, ValueError):
    """A PlainBuffer payload is malformed (bad header, truncated, unknown type, checksum mismatch)."""


class Special(enum.Enum):
    """Primary-key placeholders that only appear in requests (range bounds, auto-increment columns)."""

    INF_MIN = VT_INF_MIN
    INF_MAX = VT_INF_MAX
    AUTO_INCREMENT = VT_AUTO_INCREMENT

    def __repr__(self) -> str:
        return self.name


INF_MIN = Special.INF_MIN
INF_MAX = Special.INF_MAX
AUTO_INCREMENT = Special.AUTO_INCREMENT

# str = VT_STRING, bytes = VT_BLOB, bool = VT_BOOLEAN, int = VT_INTEGER, float = VT_DOUBLE.
Value = int | float | bool | str | bytes
PrimaryKeyValue = int | str | bytes | bool | Special


def _build_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        x = i
        for _ in range(8):
            x = ((x << 1) ^ (0x07 if x & 0x80 else 0)) & 0xFF
        table.append(x)
    return tuple(table)


_CRC8_TABLE = _build_table()


def crc8(crc: int, data: bytes) -> int:
    """Continue a CRC-8/ATM over ``data`` (the checksum PlainBuffer uses)."""
    table = _CRC8_TABLE
    for byte in data:
        crc = table[crc ^ byte]
    return crc


def _crc_byte(crc: int, byte: int) -> int:
    return _CRC8_TABLE[crc ^ (byte & 0xFF)]


_pack_i32 = struct.Struct("<i").pack
_pack_i64 = struct.Struct("<q").pack
_pack_f64 = struct.Struct("<d").pack
_unpack_i32 = struct.Struct("<i").unpack_from
_unpack_i64 = struct.Struct("<q").unpack_from
_unpack_f64 = struct.Struct("<d").unpack_from


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    """A stream record's position in its partition: records are ordered by ``(epoch, timestamp, row_index)``."""

    epoch: int
    timestamp: int
    row_index: int

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("epoch", self.epoch, _INT32_MIN, _INT32_MAX),
            ("timestamp", self.timestamp, _INT64_MIN, _INT64_MAX),
            ("row_index", self.row_index, _INT32_MIN, _INT32_MAX),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise PlainBufferError(f"sequence info {name}={value!r} is not an integer in [{low}, {high}]")


@dataclass(frozen=True, slots=True)
class Cell:
    """A data cell. ``value`` is None for delete-typed cells; ``cell_type`` is None for a plain put."""

    name: str
    value: Value | None = None
    cell_type: int | None = None
    timestamp: int | None = None

    @property
    def cell_type_name(self) -> str | None:
        """``DELETE_ONE_VERSION``, ``DELETE_ALL_VERSION``, ``INCREMENT`` or None."""
        return (
            None if self.cell_type is None else _CELL_TYPES.get(self.cell_type, f"UNKNOWN({self.cell_type})")
        )


@dataclass(frozen=True, slots=True)
class Row:
    """One PlainBuffer row: primary key (ordered name/value pairs), data cells, delete marker, sequence info."""

    primary_key: tuple[tuple[str, PrimaryKeyValue], ...]
    cells: tuple[Cell, ...] = ()
    delete_marker: bool = False
    sequence_info: SequenceInfo | None = None


# ---------------------------------------------------------------------------------------------- writing


def _encode_value(out: bytearray, value: Value | Special, crc: int, what: str) -> int:
    out.append(TAG_CELL_VALUE)
    if isinstance(value, Special):
        out += _pack_i32(1)
        out.append(value.value)
        return _crc_byte(crc, value.value)
    if isinstance(value, bool):
        out += _pack_i32(2)
        out.append(VT_BOOLEAN)
        out.append(1 if value else 0)
        return _crc_byte(_crc_byte(crc, VT_BOOLEAN), 1 if value else 0)
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise PlainBufferError(f"{what}: integer {value} does not fit in int64")
        raw = _pack_i64(value)
        out += _pack_i32(9)
        out.append(VT_INTEGER)
        out += raw
        return crc8(_crc_byte(crc, VT_INTEGER), raw)
    if isinstance(value, float):
        raw = _pack_f64(value)
        out += _pack_i32(9)
        out.append(VT_DOUBLE)
        out += raw
        return crc8(_crc_byte(crc, VT_DOUBLE), raw)
    if isinstance(value, str):
        data, vtype = value.encode("utf-8"), VT_STRING
    elif isinstance(value, bytes | bytearray | memoryview):
        data, vtype = bytes(value), VT_BLOB
    else:
        raise PlainBufferError(f"{what}: unsupported value type {type(value).__name__}")
    length = _pack_i32(len(data))
    out += _pack_i32(5 + len(data))
    out.append(vtype)
    out += length
    out += data
    return crc8(crc8(_crc_byte(crc, vtype), length), data)


def _encode_cell(
    out: bytearray,
    name: str,
    value: Value | Special | None,
    cell_type: int | None,
    timestamp: int | None,
) -> int:
    out.append(TAG_CELL)
    raw_name = name.encode("utf-8")
    out.append(TAG_CELL_NAME)
    out += _pack_i32(len(raw_name))
    out += raw_name
    crc = crc8(0, raw_name)
    if value is not None:
        crc = _encode_value(out, value, crc, f"cell {name!r}")
    if cell_type is not None:
        if not 0 <= cell_type <= 0xFF:
            raise PlainBufferError(f"cell {name!r}: cell type {cell_type} is not a byte")
        out.append(TAG_CELL_TYPE)
        out.append(cell_type)
    if timestamp is not None:
        if not _INT64_MIN <= timestamp <= _INT64_MAX:
            raise PlainBufferError(f"cell {name!r}: timestamp {timestamp} does not fit in int64")
        raw_ts = _pack_i64(timestamp)
        out.append(TAG_CELL_TIMESTAMP)
        out += raw_ts
        crc = crc8(crc, raw_ts)
    if cell_type is not None:
        crc = _crc_byte(crc, cell_type)
    out.append(TAG_CELL_CHECKSUM)
    out.append(crc)
    return crc


def _encode_row_body(out: bytearray, row: Row) -> None:
    row_crc = 0
    out.append(TAG_ROW_PK)
    for name, value in row.primary_key:
        row_crc = _crc_byte(row_crc, _encode_cell(out, name, value, None, None))
    if row.cells:
        out.append(TAG_ROW_DATA)
        for cell in row.cells:
            row_crc = _crc_byte(
                row_crc, _encode_cell(out, cell.name, cell.value, cell.cell_type, cell.timestamp)
            )
    if row.delete_marker:
        out.append(TAG_DELETE_ROW_MARKER)
    row_crc = _crc_byte(row_crc, 1 if row.delete_marker else 0)
    seq = row.sequence_info
    if seq is not None:
        out.append(TAG_EXTENSION)
        out += _pack_i32(5 + _SEQ_INFO_SIZE)
        out.append(TAG_SEQ_INFO)
        out += _pack_i32(_SEQ_INFO_SIZE)
        out.append(TAG_SEQ_INFO_EPOCH)
        out += _pack_i32(seq.epoch)
        out.append(TAG_SEQ_INFO_TS)
        out += _pack_i64(seq.timestamp)
        out.append(TAG_SEQ_INFO_ROW_INDEX)
        out += _pack_i32(seq.row_index)
    out.append(TAG_ROW_CHECKSUM)
    out.append(row_crc)


def encode_rows(rows: Iterable[Row]) -> bytes:
    """Encode rows behind one header (the layout of ``GetRange``/``BatchGetRow`` payloads)."""
    out = bytearray(_pack_i32(HEADER))
    for row in rows:
        _encode_row_body(out, row)
    return bytes(out)


def encode_row(row: Row) -> bytes:
    """Encode one row with its header (the layout of a request row and of a stream record)."""
    return encode_rows((row,))


# ---------------------------------------------------------------------------------------------- reading


class _Reader:
    __slots__ = ("buf", "end", "pos", "tag")

    def __init__(self, data: bytes) -> None:
        self.buf = data
        self.end = len(data)
        self.pos = 0
        self.tag = 0

    def fail(self, message: str) -> PlainBufferError:
        return PlainBufferError(f"malformed PlainBuffer at byte {self.pos} of {self.end}: {message}")

    def need(self, size: int) -> int:
        pos = self.pos
        if size < 0 or pos + size > self.end:
            raise self.fail(f"truncated (needs {size} more bytes)")
        self.pos = pos + size
        return pos

    def read_tag(self) -> int:
        if self.pos >= self.end:
            self.tag = 0
        else:
            self.tag = self.buf[self.pos]
            self.pos += 1
        return self.tag

    def byte(self) -> int:
        return self.buf[self.need(1)]

    def i32(self) -> int:
        value: int = _unpack_i32(self.buf, self.need(4))[0]
        return value

    def i64(self) -> int:
        value: int = _unpack_i64(self.buf, self.need(8))[0]
        return value

    def raw(self, size: int) -> bytes:
        pos = self.need(size)
        return bytes(self.buf[pos : pos + size])

    def text(self, size: int, what: str) -> str:
        data = self.raw(size)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8") from exc


def _read_value(r: _Reader, crc: int, name: str) -> tuple[Value | Special, int]:
    length = r.i32()
    start = r.pos
    vtype = r.byte()
    value: Value | Special
    if vtype == VT_INTEGER:
        pos = r.need(8)
        value = _unpack_i64(r.buf, pos)[0]
        crc = crc8(_crc_byte(crc, vtype), r.buf[pos : pos + 8])
    elif vtype == VT_DOUBLE:
        pos = r.need(8)
        value = _unpack_f64(r.buf, pos)[0]
        crc = crc8(_crc_byte(crc, vtype), r.buf[pos : pos + 8])
    elif vtype == VT_BOOLEAN:
        flag = r.byte()
        value = flag != 0
        crc = _crc_byte(_crc_byte(crc, vtype), flag)
    elif vtype in (VT_STRING, VT_BLOB):
        size = r.i32()
        pos = r.need(size)
        data = bytes(r.buf[pos : pos + size])
        crc = crc8(crc8(_crc_byte(crc, vtype), _pack_i32(size)), data)
        if vtype == VT_BLOB:
            value = data
        else:
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise r.fail(f"string value of cell {name!r} is not valid UTF-8") from exc
    elif vtype in (VT_INF_MIN, VT_INF_MAX, VT_AUTO_INCREMENT):
        value = Special(vtype)
        crc = _crc_byte(crc, vtype)
    else:
        raise r.fail(f"cell {name!r} has unsupported value type 0x{vtype:02x}")
    if r.pos - start != length:
        raise r.fail(f"cell {name!r} value length prefix {length} does not match its {r.pos - start} bytes")
    r.read_tag()
    return value, crc


def _read_cell(r: _Reader) -> tuple[str, Value | Special | None, int | None, int | None, int]:
    # precondition: r.tag == TAG_CELL
    r.read_tag()
    if r.tag != TAG_CELL_NAME:
        raise r.fail(f"expected a cell name tag, got 0x{r.tag:02x}")
    size = r.i32()
    pos = r.need(size)
    raw_name = r.buf[pos : pos + size]
    try:
        name = bytes(raw_name).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise r.fail("cell name is not valid UTF-8") from exc
    crc = crc8(0, raw_name)
    r.read_tag()
    value: Value | Special | None = None
    cell_type: int | None = None
    timestamp: int | None = None
    if r.tag == TAG_CELL_VALUE:
        value, crc = _read_value(r, crc, name)
    if r.tag == TAG_CELL_TYPE:
        cell_type = r.byte()
        r.read_tag()
    if r.tag == TAG_CELL_TIMESTAMP:
        pos = r.need(8)
        timestamp = _unpack_i64(r.buf, pos)[0]
        crc = crc8(crc, r.buf[pos : pos + 8])
        r.read_tag()
    if cell_type is not None:
        crc = _crc_byte(crc, cell_type)
    if r.tag != TAG_CELL_CHECKSUM:
        raise r.fail(f"expected the checksum of cell {name!r}, got tag 0x{r.tag:02x}")
    stored = r.byte()
    if stored != crc:
        raise r.fail(f"checksum mismatch in cell {name!r}: stored 0x{stored:02x}, computed 0x{crc:02x}")
    r.read_tag()
    return name, value, cell_type, timestamp, crc


def _read_extension(r: _Reader) -> SequenceInfo | None:
    # precondition: r.tag == TAG_EXTENSION
    length = r.i32()
    end = r.pos + length
    if length < 0 or end > r.end:
        raise r.fail(f"extension length {length} runs past the end")
    seq: SequenceInfo | None = None
    r.read_tag()
    while r.pos <= end and (r.tag == TAG_SEQ_INFO or r.tag not in _KNOWN_TAGS) and r.tag != 0:
        if r.tag == TAG_SEQ_INFO:
            size = r.i32()
            start = r.pos
            values = []
            for expected, reader in (
                (TAG_SEQ_INFO_EPOCH, r.i32),
                (TAG_SEQ_INFO_TS, r.i64),
                (TAG_SEQ_INFO_ROW_INDEX, r.i32),
            ):
                if r.read_tag() != expected:
                    raise r.fail(f"sequence info: expected tag 0x{expected:02x}, got 0x{r.tag:02x}")
                values.append(reader())
            if r.pos - start != size:
                raise r.fail(f"sequence info length {size} does not match its {r.pos - start} bytes")
            seq = SequenceInfo(epoch=values[0], timestamp=values[1], row_index=values[2])
        else:  # an extension this reader does not know: skip it, as the Java SDK does
            r.need(r.i32())
        r.read_tag()
    if r.pos != end + 1:
        raise r.fail(f"extension length {length} does not match its contents")
    return seq


def _read_row(r: _Reader, index: int) -> Row:
    if r.tag != TAG_ROW_PK:
        raise r.fail(f"row {index}: expected the primary-key tag, got 0x{r.tag:02x}")
    row_crc = 0
    primary_key: list[tuple[str, PrimaryKeyValue]] = []
    r.read_tag()
    while r.tag == TAG_CELL:
        name, value, cell_type, timestamp, crc = _read_cell(r)
        if value is None or cell_type is not None or timestamp is not None or isinstance(value, float):
            raise r.fail(f"row {index}: primary-key cell {name!r} must hold exactly one key value")
        primary_key.append((name, value))
        row_crc = _crc_byte(row_crc, crc)
    cells: list[Cell] = []
    if r.tag == TAG_ROW_DATA:
        r.read_tag()
        while r.tag == TAG_CELL:
            name, value, cell_type, timestamp, crc = _read_cell(r)
            if isinstance(value, Special):
                raise r.fail(f"row {index}: data cell {name!r} holds a primary-key placeholder")
            cells.append(Cell(name, value, cell_type, timestamp))
            row_crc = _crc_byte(row_crc, crc)
    delete_marker = r.tag == TAG_DELETE_ROW_MARKER
    if delete_marker:
        r.read_tag()
    row_crc = _crc_byte(row_crc, 1 if delete_marker else 0)
    seq = _read_extension(r) if r.tag == TAG_EXTENSION else None
    if r.tag != TAG_ROW_CHECKSUM:
        raise r.fail(f"row {index}: expected the row checksum tag, got 0x{r.tag:02x}")
    stored = r.byte()
    if stored != row_crc:
        raise r.fail(f"row {index}: row checksum mismatch: stored 0x{stored:02x}, computed 0x{row_crc:02x}")
    r.read_tag()
    return Row(tuple(primary_key), tuple(cells), delete_marker, seq)


def decode_rows(data: bytes | bytearray | memoryview) -> list[Row]:
    """Decode every row of a payload (header, then rows until the end). An empty payload has no rows."""
    buf = bytes(data)
    if not buf:
        return []
    r = _Reader(buf)
    header = r.i32()
    if header != HEADER:
        raise r.fail(f"header is 0x{header & 0xFFFFFFFF:x}, expected 0x{HEADER:x}")
    rows: list[Row] = []
    r.read_tag()
    while r.pos < r.end or r.tag != 0:
        rows.append(_read_row(r, len(rows)))
    return rows


def decode_row(data: bytes | bytearray | memoryview) -> Row:
    """Decode a payload that must hold exactly one row (a request row, a stream record)."""
    rows = decode_rows(data)
    if len(rows) != 1:
        raise PlainBufferError(f"expected exactly one PlainBuffer row, found {len(rows)}")
    return rows[0]


def row_from_sdk(primary_key: Sequence[tuple[str, PrimaryKeyValue]], cells: Sequence[Cell] = ()) -> Row:
    """Build a row from the SDK's ``[(name, value), ...]`` primary-key shape (bytearray becomes bytes)."""
    return Row(
        tuple((name, bytes(v) if isinstance(v, bytearray) else v) for name, v in primary_key),
        tuple(cells),
    )
