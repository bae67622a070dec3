"""Fuzzing the PlainBuffer decoder: random bytes and mutated valid rows either decode into well-typed rows
or raise :class:`PlainBufferError`, its documented decode error (never IndexError, struct.error,
UnicodeDecodeError, RecursionError, ...), so ``onMalformed`` sees every bad record."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backends.tablestore import plainbuffer
from cdc.backends.tablestore.plainbuffer import (
    DELETE_ALL_VERSION,
    DELETE_ONE_VERSION,
    INCREMENT,
    Cell,
    PlainBufferError,
    Row,
    SequenceInfo,
    Special,
    decode_rows,
    encode_row,
    encode_rows,
)


@pytest.fixture(autouse=True, params=["compiled", "python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs against both readers: the compiled one (native/plainbuffer.c) and the
    pure-Python fallback. The compiled one must have been built (``make native`` or the install)."""
    if request.param == "compiled":
        assert plainbuffer.COMPILED, "the compiled PlainBuffer reader is not built: run `make native`"
    monkeypatch.setattr(plainbuffer, "COMPILED", request.param == "compiled")
    return str(request.param)

_HEADER = struct.pack("<i", 0x75)
_int64 = st.integers(-(1 << 63), (1 << 63) - 1)
_names = st.text(min_size=1, max_size=6)
_values = st.one_of(_int64, st.floats(allow_nan=False), st.booleans(), st.text(max_size=12), st.binary(max_size=12))
_cells = st.one_of(
    st.builds(Cell, _names, _values, st.none(), st.none() | st.integers(0, (1 << 63) - 1)),
    st.builds(Cell, _names, st.none(), st.just(DELETE_ONE_VERSION), st.integers(0, 1 << 62)),
    st.builds(Cell, _names, st.none(), st.just(DELETE_ALL_VERSION), st.none()),
    st.builds(Cell, _names, _int64, st.just(INCREMENT), st.none()),
)
_rows = st.builds(
    Row,
    st.lists(st.tuples(_names, st.one_of(_int64, st.text(max_size=8), st.binary(max_size=8))), min_size=1,
             max_size=3).map(tuple),
    st.lists(_cells, max_size=4).map(tuple),
    st.booleans(),
    st.none() | st.builds(SequenceInfo, st.integers(-(1 << 31), (1 << 31) - 1), _int64,
                          st.integers(-(1 << 31), (1 << 31) - 1)),
)
# Bytes that mean something to the decoder: tags, value types, lengths that run past the end.
_meaningful = st.one_of(
    st.integers(0, 0x10).map(lambda b: bytes([b])),
    st.sampled_from([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff"]),
    st.binary(min_size=1, max_size=6),
)


def _well_typed(rows: list[Row]) -> None:
    """What a successful decode must look like: rows of the documented types, nothing half-built."""
    for row in rows:
        assert isinstance(row, Row) and row.primary_key
        for name, value in row.primary_key:
            assert isinstance(name, str) and isinstance(value, (int, str, bytes, bool, Special))
        for cell in row.cells:
            assert isinstance(cell, Cell) and isinstance(cell.name, str)
            assert cell.value is None or isinstance(cell.value, (int, float, bool, str, bytes))
            assert cell.timestamp is None or -(1 << 63) <= cell.timestamp < 1 << 63
        assert isinstance(row.delete_marker, bool)
        assert row.sequence_info is None or isinstance(row.sequence_info, SequenceInfo)


def _decodes_or_fails_cleanly(payload: bytes) -> None:
    try:
        rows = decode_rows(payload)
    except PlainBufferError:
        return
    _well_typed(rows)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_random_bytes_decode_or_raise_plainbuffer_error(blob: bytes, with_header: bool) -> None:
    _decodes_or_fails_cleanly(_HEADER + blob if with_header else blob)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    payload = bytearray(encode_rows(draw(st.lists(_rows, min_size=1, max_size=3))) if draw(st.booleans())
                        else encode_row(draw(_rows)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(payload)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "duplicate"]))
        if kind == "delete":
            del payload[at:at + draw(st.integers(1, 8))]
        elif kind == "insert":
            payload[at:at] = draw(_meaningful)
        elif kind == "replace" and at < len(payload):
            payload[at] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del payload[at:]
        elif kind == "duplicate":
            size = draw(st.integers(1, 16))
            payload[at:at] = payload[at:at + size]
    return bytes(payload)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_valid_rows_decode_or_raise_plainbuffer_error(payload: bytes) -> None:
    _decodes_or_fails_cleanly(payload)

