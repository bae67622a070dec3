"""PlainBuffer reader/writer: round trips, interop with the real SDK's codec, corruption is always an error."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tablestore.metadata import INF_MAX as SDK_INF_MAX
from tablestore.metadata import INF_MIN as SDK_INF_MIN
from tablestore.plainbuffer.plain_buffer_builder import PlainBufferBuilder
from tablestore.plainbuffer.plain_buffer_coded_stream import PlainBufferCodedInputStream
from tablestore.plainbuffer.plain_buffer_stream import PlainBufferInputStream

from cdc.backends.tablestore import plainbuffer
from cdc.backends.tablestore.plainbuffer import (
    DELETE_ALL_VERSION,
    DELETE_ONE_VERSION,
    INCREMENT,
    INF_MAX,
    INF_MIN,
    Cell,
    PlainBufferError,
    Row,
    SequenceInfo,
    crc8,
    decode_row,
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

int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
int32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
names = st.text(min_size=1, max_size=8)
pk_values = st.one_of(int64, st.text(max_size=12), st.binary(max_size=12))
values = st.one_of(
    int64, st.floats(allow_nan=False), st.booleans(), st.text(max_size=20), st.binary(max_size=20)
)
cells = st.one_of(
    st.builds(Cell, names, values, st.none(), st.one_of(st.none(), st.integers(0, (1 << 63) - 1))),
    st.builds(Cell, names, st.none(), st.just(DELETE_ONE_VERSION), st.integers(0, (1 << 62))),
    st.builds(Cell, names, st.none(), st.just(DELETE_ALL_VERSION), st.none()),
    st.builds(Cell, names, int64, st.just(INCREMENT), st.none()),
)
seqs = st.builds(SequenceInfo, int32, int64, int32)
rows = st.builds(
    Row,
    st.lists(st.tuples(names, pk_values), min_size=1, max_size=4).map(tuple),
    st.lists(cells, max_size=6).map(tuple),
    st.booleans(),
    st.one_of(st.none(), seqs),
)


@given(st.lists(rows, max_size=4))
def test_round_trip(batch: list[Row]) -> None:
    assert decode_rows(encode_rows(batch)) == batch


@given(rows)
def test_single_row_round_trip(row: Row) -> None:
    assert decode_row(encode_row(row)) == row


def test_crc8_is_crc8_atm() -> None:
    # CRC-8/ATM ("CRC-8" in the catalogue): check value of "123456789" is 0xF4.
    assert crc8(0, b"123456789") == 0xF4


def _sdk_read(data: bytes) -> list[tuple[list, list]]:
    stream = PlainBufferCodedInputStream(PlainBufferInputStream(data))
    return [(r.primary_key, r.attribute_columns) for r in stream.read_rows()]


plain_cells = st.builds(
    Cell,
    st.text(alphabet="abcxyz", min_size=1, max_size=5),
    st.one_of(int64, st.floats(allow_nan=False), st.booleans(), st.text(max_size=10), st.binary(max_size=10)),
    st.none(),
    st.one_of(st.none(), st.integers(0, (1 << 62))),
)


@given(
    st.lists(
        st.tuples(st.text(alphabet="pk", min_size=1, max_size=3), st.one_of(int64, st.text(max_size=8))),
        min_size=1,
        max_size=3,
    ),
    st.lists(plain_cells, max_size=5),
)
def test_sdk_reads_what_we_write(pk: list[tuple[str, object]], data: list[Cell]) -> None:
    row = Row(tuple(pk), tuple(data))  # type: ignore[arg-type]
    [(sdk_pk, sdk_cols)] = _sdk_read(encode_rows([row]))
    assert [tuple(p) for p in sdk_pk] == list(pk)
    expected = [
        (c.name, bytearray(c.value) if isinstance(c.value, bytes) else c.value, c.timestamp) for c in data
    ]
    assert [tuple(c) for c in sdk_cols] == expected


@given(
    st.lists(
        st.tuples(st.text(alphabet="pk", min_size=1, max_size=3), st.one_of(int64, st.text(max_size=8))),
        min_size=1,
        max_size=3,
    ),
    st.lists(
        st.tuples(
            st.text(alphabet="abc", min_size=1, max_size=3),
            st.one_of(int64, st.text(max_size=8), st.floats(allow_nan=False), st.booleans()),
        ),
        max_size=4,
    ),
)
def test_we_read_what_the_sdk_writes(pk: list[tuple[str, object]], columns: list[tuple[str, object]]) -> None:
    row = decode_row(bytes(PlainBufferBuilder.serialize_for_put_row(pk, columns)))
    assert list(row.primary_key) == pk
    assert [(c.name, c.value) for c in row.cells] == columns
    assert not row.delete_marker and row.sequence_info is None


def test_sdk_update_and_delete_rows() -> None:
    update = PlainBufferBuilder.serialize_for_update_row(
        [("id", 7)],
        {
            "PUT": [("a", 1), ("b", "x", 99)],
            "DELETE": [("c", None, 5)],
            "DELETE_ALL": ["d"],
            "INCREMENT": [("e", 2)],
        },
    )
    row = decode_row(bytes(update))
    assert row.primary_key == (("id", 7),)
    assert row.cells == (
        Cell("a", 1),
        Cell("b", "x", None, 99),
        Cell("c", None, DELETE_ONE_VERSION, 5),
        Cell("d", None, DELETE_ALL_VERSION),
        Cell("e", 2, INCREMENT),
    )
    assert [c.cell_type_name for c in row.cells] == [
        None,
        None,
        "DELETE_ONE_VERSION",
        "DELETE_ALL_VERSION",
        "INCREMENT",
    ]
    deleted = decode_row(bytes(PlainBufferBuilder.serialize_for_delete_row([("id", 7), ("s", "k")])))
    assert deleted == Row((("id", 7), ("s", "k")), (), True)
    bounds = decode_row(
        bytes(PlainBufferBuilder.serialize_primary_key([("id", SDK_INF_MIN), ("s", SDK_INF_MAX)]))
    )
    assert bounds.primary_key == (("id", INF_MIN), ("s", INF_MAX))
    blob = decode_row(bytes(PlainBufferBuilder.serialize_for_put_row([("b", bytearray(b"\x00\xff"))], [])))
    assert blob.primary_key == (("b", b"\x00\xff"),)


def test_stream_record_layout_matches_java_sdk() -> None:
    """Bytes laid out by hand from the Java SDK's writer (writeRow/writeExtension/writeSequenceInfo)."""
    row = Row((("id", 1),), (Cell("v", None, DELETE_ONE_VERSION, 10),), False, SequenceInfo(2, 3, 4))
    data = encode_row(row)
    ext = bytes([0x0B]) + struct.pack("<i", 24) + bytes([0x0C]) + struct.pack("<i", 19)
    ext += (
        bytes([0x0D])
        + struct.pack("<i", 2)
        + bytes([0x0E])
        + struct.pack("<q", 3)
        + bytes([0x0F])
        + struct.pack("<i", 4)
    )
    assert ext in data
    assert data[:4] == struct.pack("<i", 0x75)
    assert data[-2] == 0x09  # TAG_ROW_CHECKSUM then the checksum byte
    # the extension is not covered by the row checksum: the same row without it has the same checksum
    assert encode_row(Row(row.primary_key, row.cells))[-1] == data[-1]


def test_unknown_extension_is_skipped() -> None:
    row = Row((("id", 1),), (), False, SequenceInfo(1, 2, 3))
    data = encode_row(row)
    at = len(data) - 2 - 29  # the extension block is 29 bytes, right before the row checksum
    assert data[at] == 0x0B
    ext_len = struct.unpack_from("<i", data, at + 1)[0]
    unknown = bytes([0x20]) + struct.pack("<i", 3) + b"abc"
    patched = (
        data[: at + 1]
        + struct.pack("<i", ext_len + len(unknown))
        + data[at + 5 : at + 5 + ext_len]
        + unknown
        + data[at + 5 + ext_len :]
    )
    assert decode_row(patched) == row


def test_corrupted_row_checksum_is_an_error() -> None:
    data = bytearray(encode_row(Row((("id", 1),), (Cell("a", "hello"),))))
    data[-1] ^= 0x01
    with pytest.raises(PlainBufferError, match="row checksum mismatch"):
        decode_row(bytes(data))


def test_corrupted_cell_value_is_an_error() -> None:
    data = bytearray(encode_row(Row((("id", 1),), (Cell("a", "hello"),))))
    data[data.index(b"hello")] ^= 0x20
    with pytest.raises(PlainBufferError, match="checksum mismatch in cell 'a'"):
        decode_row(bytes(data))


@given(rows.map(lambda r: Row(r.primary_key, r.cells, r.delete_marker)), st.data())
def test_any_single_bit_flip_is_detected(row: Row, data: st.DataObject) -> None:
    encoded = bytearray(encode_row(row))
    at = data.draw(st.integers(0, len(encoded) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    encoded[at] ^= 1 << bit
    with pytest.raises(PlainBufferError):
        decoded = decode_rows(bytes(encoded))
        # a flip may only go unnoticed if it produced the very same row (impossible for CRC-covered bytes)
        assert decoded == [row], decoded


@given(st.binary(max_size=64))
def test_garbage_raises_only_plainbuffer_errors(blob: bytes) -> None:
    try:
        decode_rows(struct.pack("<i", 0x75) + blob)
    except PlainBufferError:
        pass


@pytest.mark.parametrize(
    "payload, message",
    [
        (struct.pack("<i", 0x76) + b"\x01", "header"),
        (struct.pack("<i", 0x75) + b"\x01\x03\x04\xff\x00\x00\x00", "truncated"),
        (struct.pack("<i", 0x75) + b"\x02", "primary-key tag"),
    ],
)
def test_malformed_payloads_name_the_problem(payload: bytes, message: str) -> None:
    with pytest.raises(PlainBufferError, match=message):
        decode_rows(payload)


# The Node.js SDK's ``serializePrimaryKey([{pk_int: INF_MIN}, {pk_str: INF_MAX}])``, as it sends a GetRange
# bound: it sizes its buffer with a spare byte per infinite value and sends the two unused zero bytes.
_NODE_SDK_RANGE_BOUND = bytes.fromhex(
    "7500000001030406000000706b5f696e740501000000090a57030406000000706b5f73747205010000000a0afe09f00000"
)


def test_trailing_zero_padding_after_the_last_row_is_accepted() -> None:
    assert decode_row(_NODE_SDK_RANGE_BOUND) == Row((("pk_int", INF_MIN), ("pk_str", INF_MAX)))
    two = [Row((("id", 1),), (Cell("a", "x"),)), Row((("id", 2),))]
    assert decode_rows(encode_rows(two) + bytes(7)) == two


@pytest.mark.parametrize(
    "trailer",
    [b"\x01", b"\x00\x01", bytes(5) + b"\x09", b"\x00\x01\x03"],
    ids=["a-row-tag", "zero-then-row-tag", "zeros-then-checksum-tag", "zero-then-a-partial-row"],
)
def test_trailing_bytes_other_than_zero_padding_are_rejected(trailer: bytes) -> None:
    with pytest.raises(PlainBufferError):
        decode_rows(_NODE_SDK_RANGE_BOUND + trailer)
    with pytest.raises(PlainBufferError):
        decode_row(encode_row(Row((("id", 1),))) + trailer)


def test_zero_padding_without_a_row_is_rejected() -> None:
    with pytest.raises(PlainBufferError, match="primary-key tag"):
        decode_rows(encode_rows([]) + bytes(2))


def test_errors_pickle_and_belong_to_the_cdc_hierarchy() -> None:
    import pickle

    from cdc.errors import MalformedRecordError

    err = pickle.loads(pickle.dumps(PlainBufferError("bad")))
    assert isinstance(err, MalformedRecordError) and str(err) == "bad"
    with pytest.raises(PlainBufferError, match="int64"):
        encode_row(Row((("id", 1 << 63),)))
    with pytest.raises(PlainBufferError, match="exactly one"):
        decode_row(encode_rows([]))


_HEAVY = (
    "pydantic",
    "pyspark",
    "pulsar",
    "tablestore",
    "tenacity",
    "cdc.backends.tablestore.backend",
    "cdc.backends.tablestore.connection",
    "cdc.backends.tablestore.options",
)


@pytest.mark.parametrize(
    "module", ["cdc.backends.tablestore.plainbuffer", "cdc.backends.tablestore.tunnel_pb"]
)
def test_wire_format_modules_load_no_backend_nor_sdk(module: str) -> None:
    """The local server and the UDFs import the codecs alone: the tablestore package must stay lazy. What
    ``import cdc`` itself loads is subtracted, so this checks the package and the codec, not the core."""
    code = (
        "import importlib, json, sys\n"
        "import cdc\n"
        "before = set(sys.modules)\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert [m for m in loaded if m.split(".")[0] in _HEAVY or m in _HEAVY] == []
