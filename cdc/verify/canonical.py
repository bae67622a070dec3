"""The canonical row encoding both sides of ``cdc verify`` compute, and its hash.

A row is encoded as the concatenation of its columns' pieces, in the source table's column order: ``N`` for
a null, else ``<byte length>:<bytes>`` for text and binary, ``<bytes>,`` for the other kinds (digits, signs,
points, ``true``/``false``: never a comma, never a leading ``N``), so the encoding is injective (no value
can imitate a separator or a null). A column's bytes depend on its :class:`Kind`, chosen from the Delta column's type, so that a source
value and the value the pipeline wrote for it encode alike:

========== =========================================== =============================================
kind       Delta (Arrow) type                          bytes
========== =========================================== =============================================
text       string                                      its UTF-8 text (the source's text form)
integer    int8/16/32/64                               decimal digits
boolean    bool                                        ``true`` / ``false``
decimal    decimal128(p, s)                            digits with exactly ``s`` decimals (``-1.50``)
float64    float64                                     the IEEE 754 bits as a signed 64-bit integer
float32    float32                                     the IEEE 754 bits as a signed 32-bit integer
date       date32                                      days since 1970-01-01
timestamp  timestamp (any unit, any zone)              microseconds since 1970-01-01 00:00 UTC
binary     binary                                      the bytes themselves
========== =========================================== =============================================

A chunk's checksum is its row count and the MD5 of its rows' encodings in key order, each row written as
``R<encoding>``, or ``H<MD5 of the encoding in hex>`` when the encoding is longer than :data:`SHORT` bytes (so
a chunk's text stays small whatever its values' sizes): one MD5 over the chunk, none per row. Narrowing a
differing chunk down takes the same digest of each sub-range; rows are then compared by their hashes, the
first 8 bytes of the MD5 of their encodings as an unsigned big-endian integer. MD5 is used as a checksum
here, not for security. On the Delta side the pieces are
built by Arrow compute kernels and hashed by DuckDB (vectorised C++, no Python per row); a backend builds the
same bytes in its own SQL (PostgreSQL: :mod:`cdc.backends.postgres.verify`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MOD = 1 << 64
SHORT = 256
"""Rows whose encoding is longer enter a chunk's digest by their MD5."""
EMPTY = (0, 0xD41D8CD98F00B204E9800998ECF8427E)
"""The checksum of a chunk without rows (the MD5 of nothing)."""


class Kind(Enum):
    TEXT = "text"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    DECIMAL = "decimal"
    FLOAT64 = "float64"
    FLOAT32 = "float32"
    DATE = "date"
    TIMESTAMP = "timestamp"
    BINARY = "binary"


PREFIXED = frozenset({Kind.TEXT, Kind.BINARY})
"""Kinds whose bytes are any bytes: their pieces carry their length."""


def kind_of(t: pa.DataType) -> Kind | None:
    """The encoding of a Delta column of type ``t`` (None: a type ``cdc verify`` cannot compare)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return Kind.TEXT
    if pa.types.is_integer(t):
        return Kind.INTEGER
    if pa.types.is_boolean(t):
        return Kind.BOOLEAN
    if pa.types.is_decimal(t):
        return Kind.DECIMAL
    if pa.types.is_float64(t):
        return Kind.FLOAT64
    if pa.types.is_float32(t):
        return Kind.FLOAT32
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        return Kind.DATE
    if pa.types.is_timestamp(t):
        return Kind.TIMESTAMP
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return Kind.BINARY
    return None


def _large(value: bytes) -> pa.Scalar:
    return pa.scalar(value, pa.large_binary())


def _value_bytes(array: pa.Array, kind: Kind) -> pa.Array:
    """The column's values as the canonical bytes of ``kind`` (nulls stay null)."""
    if kind is Kind.BINARY:
        return array.cast(pa.large_binary())
    if kind is Kind.FLOAT64:
        array = array.cast(pa.float64()).view(pa.int64())
    elif kind is Kind.FLOAT32:
        array = array.cast(pa.float32()).view(pa.int32())
    elif kind is Kind.DATE:
        array = array.cast(pa.date32()).cast(pa.int32())
    elif kind is Kind.TIMESTAMP:
        array = array.cast(pa.timestamp("us", tz=array.type.tz)).cast(pa.int64())
    return array.cast(pa.large_string()).cast(pa.large_binary())


def encode(table: pa.Table, columns: Sequence[tuple[str, Kind]]) -> pa.Array:
    """Each row's canonical encoding of ``columns`` (large binary, so a table's encodings may pass 2 GiB;
    never null)."""
    pieces = []
    for name, kind in columns:
        values = _value_bytes(table.column(name).combine_chunks(), kind)
        if kind in PREFIXED:
            length = pc.binary_length(values).cast(pa.large_string()).cast(pa.large_binary())
            piece = pc.binary_join_element_wise(length, values, _large(b":"))
        else:
            piece = pc.binary_join_element_wise(values, _large(b""), _large(b","))
        pieces.append(pc.fill_null(piece, _large(b"N")))
    if not pieces:
        return pa.array([b""] * table.num_rows, pa.large_binary())
    return pc.binary_join_element_wise(*pieces, _large(b""))


SMALL = 4096
"""Arrays of fewer values are hashed by hashlib (a DuckDB query costs more than their hashing)."""


@functools.cache
def _duckdb() -> Any:
    import duckdb

    return duckdb.connect()


def _md5_query(encoded: pa.Array, select: str) -> pa.Array:
    """``select`` (over the column ``r``) of each value, by DuckDB (a cursor per call: threads may share it)."""
    cur = _duckdb().cursor()
    try:
        cur.register("rows_", pa.table({"r": encoded}))
        return cur.execute(f"SELECT {select} AS h FROM rows_").fetch_arrow_table().column("h").combine_chunks()
    finally:
        cur.close()


def row_hashes(encoded: pa.Array) -> np.ndarray:
    """The hash of each encoded row (uint64): the first 8 bytes of its MD5, big-endian."""
    if len(encoded) < SMALL:
        return np.array([int.from_bytes(hashlib.md5(v).digest()[:8], "big") for v in encoded.to_pylist()],
                        dtype=np.uint64)
    # md5_number_upper is those 8 bytes read little-endian: swapped back below.
    return np.asarray(_md5_query(encoded, "md5_number_upper(r)").to_numpy(), dtype=np.uint64).byteswap()


def _md5_hex(encoded: pa.Array) -> pa.Array:
    if len(encoded) < SMALL:
        return pa.array([hashlib.md5(v).hexdigest() for v in encoded.to_pylist()], pa.string())
    return _md5_query(encoded, "md5(r)")


def chunk_digests(encoded: pa.Array, order: np.ndarray, chunk: np.ndarray, n: int) -> list[tuple[int, int]]:
    """Per chunk index ``0..n-1``: (rows, the MD5 of its rows' pieces in key order, as an int). ``order`` is
    the permutation that sorts the rows in the source's key order (chunks are consecutive key ranges)."""
    counts = np.bincount(chunk, minlength=n)
    lengths = pc.binary_length(encoded)
    long = pc.greater(lengths, SHORT)
    encoded = encoded.cast(pa.large_binary())
    pieces = pc.binary_join_element_wise(_large(b"R"), encoded, _large(b""))
    if pc.any(long).as_py():
        hexes = _md5_hex(encoded.filter(long))
        hashed = pc.binary_join_element_wise(_large(b"H"), hexes.cast(pa.large_binary()), _large(b""))
        filled = pc.replace_with_mask(pieces, long, hashed)
        pieces = filled.combine_chunks() if isinstance(filled, pa.ChunkedArray) else filled
    ordered = pieces.take(pa.array(order, pa.int64()))
    if isinstance(ordered, pa.ChunkedArray):
        ordered = ordered.combine_chunks()
    offsets = np.frombuffer(ordered.buffers()[1], dtype=np.int64)[ordered.offset:ordered.offset + len(ordered) + 1]
    data = memoryview(ordered.buffers()[2] or b"")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    out = []
    for i in range(n):
        lo, hi = offsets[bounds[i]], offsets[bounds[i + 1]]
        out.append((int(counts[i]), int(hashlib.md5(data[lo:hi]).hexdigest(), 16)))
    return out
