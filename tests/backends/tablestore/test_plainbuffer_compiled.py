"""The compiled PlainBuffer reader (native/plainbuffer.c) against the pure-Python one it ports: the same
outcome on the fuzz test's payloads."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backends.tablestore import plainbuffer
from cdc.backends.tablestore.plainbuffer import PlainBufferError, decode_rows, decode_rows_python
from tests.backends.tablestore.test_plainbuffer_fuzz import _HEADER, _mutated


def _outcome(decode: object, payload: bytes) -> object:
    try:
        return decode(payload)  # type: ignore[operator]
    except PlainBufferError:
        return PlainBufferError


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_mutated(), st.binary(max_size=120).map(lambda b: _HEADER + b)))
def test_compiled_and_python_readers_agree(payload: bytes) -> None:
    """The compiled reader is a port of the Python one: on valid and broken payloads alike, the same rows
    (types included: a bool stays a bool) or both a PlainBufferError."""
    assert plainbuffer.COMPILED, "the compiled PlainBuffer reader is not built: run `make native`"
    expected = _outcome(decode_rows_python, payload)
    got = _outcome(decode_rows, payload)  # the compiled reader (COMPILED), empty payloads included
    if not isinstance(expected, list):
        assert got is PlainBufferError
    else:  # reprs: a mutated double may be a NaN (never equal to itself); a repr also tells 1 from True
        assert isinstance(got, list) and [repr(r) for r in got] == [repr(r) for r in expected]
