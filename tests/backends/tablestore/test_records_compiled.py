"""The compiled record layout (``layout_columns`` in native/plainbuffer.c) against the Python one it
replaces (:meth:`RecordLayout._row`): the same batch, or the same error, for any mix of records."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backends.tablestore import plainbuffer
from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.plainbuffer import (
    DELETE_ALL_VERSION,
    DELETE_ONE_VERSION,
    INF_MIN,
    Cell,
    Row,
    SequenceInfo,
    encode_row,
)
from cdc.backends.tablestore.records import RecordLayout
from cdc.errors import MalformedRecordError
from cdc.model import ChangeSchema

VALUES = [
    ("name", pa.string()),
    ("score", pa.float64()),
    ("flag", pa.bool_()),
    ("blob", pa.binary()),
    ("qty", pa.int64()),
]


def layout(ots: bool, two_keys: bool) -> RecordLayout:
    keys = [("id", pa.int64())] + ([("k2", pa.string())] if two_keys else [])
    cols = keys + VALUES
    if ots:
        cols += [("__ots_record_type__", pa.string()), ("__ots_record_timestamp__", pa.int64())]
        cols += [(f"__ots_column_type_{n}", pa.string()) for n, _ in VALUES]
    return RecordLayout(
        ChangeSchema.of(cols, [k for k, _ in keys], partial=True), tuple(n for n, _ in VALUES), ots
    )


_int64 = st.integers(-(1 << 63), (1 << 63) - 1)
_stamp = st.none() | st.integers(0, 1 << 40) | st.integers(0, 1 << 62)
_any_value = st.one_of(
    _int64, st.floats(), st.booleans(), st.text(max_size=6), st.binary(max_size=6), st.none()
)
# Mostly values of the column's own type (the records the compiled path lays out), sometimes any value.
_typed = {
    "name": st.text(max_size=6),
    "score": st.floats() | st.integers(-(1 << 60), 1 << 60),
    "flag": st.booleans(),
    "blob": st.binary(max_size=6),
    "qty": _int64,
    "id": _int64,
    "k2": st.text(max_size=4),
    "other": _any_value,
}


def _value_cell(name: str) -> st.SearchStrategy[Cell]:
    value = st.one_of(_typed[name], _typed[name], _typed[name], _any_value)
    return st.builds(Cell, st.just(name), value, st.none(), _stamp)


_names = st.sampled_from(list(_typed))
_cell = st.one_of(
    _names.flatmap(_value_cell),
    _names.flatmap(_value_cell),
    st.builds(Cell, _names, st.none(), st.sampled_from([DELETE_ONE_VERSION, DELETE_ALL_VERSION, 2]),
              _stamp),
)
_key = st.one_of(_int64, st.text(max_size=4), st.binary(max_size=4), st.just(INF_MIN))
_keys = st.one_of(
    st.tuples(st.tuples(st.just("id"), _int64), st.tuples(st.just("k2"), st.text(max_size=4))),
    st.lists(st.tuples(st.sampled_from(["id", "k2", "x"]), _key), min_size=1, max_size=3).map(tuple),
)
_row = st.builds(
    Row,
    _keys,
    st.lists(_cell, max_size=6).map(tuple),
    st.booleans(),
    st.builds(SequenceInfo, st.integers(0, 3), st.integers(0, 1 << 52), st.integers(0, 1023))
    | st.none()
    | st.builds(SequenceInfo, st.integers(0, 3), _int64, st.integers(-2, 1100)),
)
_record = st.tuples(st.sampled_from([pb.PUT_ROW, pb.UPDATE_ROW, pb.DELETE_ROW]), _row, st.integers(-300, 60))


def _payload(row: Row, flip: int) -> bytes:
    data = bytearray(encode_row(row))
    if 0 <= flip < len(data):  # a corrupt record now and then
        data[flip] ^= 0x5A
    return bytes(data)


def _outcome(lay: RecordLayout, compiled: bool, base: bool, records: list[Any]) -> object:
    saved = plainbuffer.COMPILED
    plainbuffer.COMPILED = compiled
    try:
        batch = lay.to_batch("ch/1", base, 40, records)
    except MalformedRecordError as exc:
        return ("error", str(exc))
    finally:
        plainbuffer.COMPILED = saved
    # reprs: a NaN is never equal to itself; a repr also tells 1 from True. Timestamps as integers: a
    # commit time past year 9999 is valid Arrow but no Python datetime.
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in batch.columns]
    return (batch.schema, repr([c.to_pylist() for c in columns]))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_record, max_size=3),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_compiled_and_python_layouts_agree(records: list[Any], base: bool, ots: bool, two_keys: bool) -> None:
    assert plainbuffer.COMPILED, "the compiled PlainBuffer reader is not built: run `make native`"
    lay = layout(ots, two_keys)
    recs = [pb.Record(action_type=a, record=_payload(row, flip)) for a, row, flip in records]
    assert _outcome(lay, True, base, recs) == _outcome(lay, False, base, recs)


@pytest.mark.parametrize("ots", [True, False])
def test_the_compiled_path_lays_out_well_formed_records(ots: bool) -> None:
    """Well-formed records of every action take the compiled path (a decline would fall back silently)."""
    assert plainbuffer.COMPILED, "the compiled PlainBuffer reader is not built: run `make native`"
    seq = SequenceInfo(1, 1_700_000_000_000_000, 3)
    rows = [
        (pb.PUT_ROW, Row((("id", 1),), (Cell("name", "a", timestamp=7), Cell("score", 2)), sequence_info=seq)),
        (pb.UPDATE_ROW, Row((("id", 1),), (Cell("qty", cell_type=DELETE_ALL_VERSION),), sequence_info=seq)),
        (pb.DELETE_ROW, Row((("id", 1),), delete_marker=True, sequence_info=seq)),
    ]
    recs = [pb.Record(action_type=a, record=encode_row(r)) for a, r in rows]
    lay = layout(ots, two_keys=False)
    columns = lay._compiled_columns("ch", False, 0, recs)
    assert columns is not None
    batch = lay.to_batch("ch", False, 0, recs)
    assert batch.column("_op").to_pylist() == ["insert", "update", "delete"]
    assert batch.column("_unchanged").to_pylist() == [None, ["name", "score", "flag", "blob"], None]
    assert batch.column("score").to_pylist() == [2.0, None, None]
    assert lay._compiled_columns("ch", True, 0, recs) is not None  # base data too


@pytest.mark.parametrize("name", ["plain", "a\x00b", "it's", 'q"uo\\te', "ü\n"])
def test_both_readers_name_a_cell_the_same_way_in_errors(name: str) -> None:
    """Error texts name the cell by its repr in both readers: the compiled one once cut a name at a NUL byte
    and quoted it without escaping (hypothesis found the NUL: the test above compared the two texts)."""
    assert plainbuffer.COMPILED, "the compiled PlainBuffer reader is not built: run `make native`"
    data = bytearray(encode_row(Row((("id", 1),), (Cell(name, "x"),))))
    data[-3] ^= 0x5A  # the cell's checksum
    errors = []
    for compiled in (True, False):
        saved, plainbuffer.COMPILED = plainbuffer.COMPILED, compiled
        try:
            with pytest.raises(Exception) as caught:
                plainbuffer.decode_row(bytes(data))
            errors.append(str(caught.value))
        finally:
            plainbuffer.COMPILED = saved
    assert errors[0] == errors[1]
    assert f"cell {name!r}" in errors[0], errors[0]
