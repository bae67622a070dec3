"""Debezium envelopes (``valueFormat=debezium``): every message either decodes into a change record that
builds into the batch, or is one ``Malformed`` case (quarantined, or failing the query naming the message
id). No other error may escape ``onMalformed`` (issue 11 item 6)."""

from __future__ import annotations

import json
import math
import struct
from datetime import UTC, date, datetime
from typing import Any

import pulsar
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backends.pulsar.connection import Channel, open_client
from cdc.backends.pulsar.options import PulsarOptions
from cdc.backends.pulsar.reader import _Columns
from cdc.backends.pulsar.records import Change, Decoder, Malformed, _Field
from cdc.errors import MalformedRecordError, OptionError
from cdc.formats.debezium import TruncateEvent, value_of
from cdc.options import parse
from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.helpers import backend, drain, produce

SCHEMA = json.dumps({"type": "record", "name": "T", "fields": [
    {"name": "id", "type": "long"},
    {"name": "n", "type": ["null", "int"]},
    {"name": "f", "type": ["null", "float"]},
    {"name": "d", "type": ["null", "double"]},
    {"name": "s", "type": ["null", "string"]},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    {"name": "us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
]})
FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


def decoder() -> Decoder:
    return Decoder("debezium", SCHEMA, "id")


def build(dec: Decoder, c: Change) -> pa.RecordBatch:
    """The batch the reader builds from one decoded message (the change model's columns)."""
    schema = dec.schema()
    row = [c.op, 1, c.commit, "t-partition-0", 1, c.unchanged, c.old_key, *c.values]
    return pa.RecordBatch.from_arrays([pa.array([v], type=f.type) for v, f in zip(row, schema, strict=True)],
                                      schema=schema)


def envelope(after: dict[str, Any] | None = None, **top: Any) -> bytes:
    return json.dumps({"op": "c", "after": {"id": 1, **(after or {})}, **top}, allow_nan=True).encode()


UNDECODABLE = {
    "op is a list": (b'{"op": [], "after": {"id": 1}}', "'op' must be one of"),
    "op is an object": (b'{"op": {}, "after": {"id": 1}}', "'op' must be one of"),
    "ts_ms beyond the calendar": (envelope(ts_ms=10**20), "'ts_ms'"),
    "ts_ms as a float": (envelope(ts_ms=1e20), "'ts_ms'"),
    "source.ts_ms beyond the calendar": (envelope(source={"ts_ms": -(10**17)}), "'source.ts_ms'"),
    "timestamp-millis beyond the calendar": (envelope({"at": 10**17}), "field 'at'"),
    "timestamp-micros beyond the calendar": (envelope({"us": 2**62}), "field 'us'"),
    "date beyond the calendar": (envelope({"day": 10**8}), "field 'day'"),
    "date beyond int": (envelope({"day": 2**40}), "field 'day'"),
    "deeply nested JSON": (b'{"op": "c", "after": {"id": 1}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                           "nested"),
    "int beyond int32": (envelope({"n": 2**31}), "field 'n'"),
    "int below int32": (envelope({"n": -(2**31) - 1}), "field 'n'"),
    "long beyond int64": (envelope({"id": 2**63}), "field 'id'"),
    "1e400 (infinity)": (b'{"op": "c", "after": {"id": 1, "d": 1e400}}', "field 'd'"),
    "NaN": (b'{"op": "c", "after": {"id": 1, "d": NaN}}', "NaN"),
    "-Infinity": (b'{"op": "c", "after": {"id": 1, "d": -Infinity}}', "Infinity"),
    "double from a 400-digit integer": (b'{"op": "c", "after": {"id": 1, "d": ' + b"9" * 400 + b"}}", "field 'd'"),
    "float beyond float32": (envelope({"f": 1e39}), "field 'f'"),
    "integer of 5000 digits": (b'{"op": "c", "after": {"id": ' + b"9" * 5000 + b"}}", "not JSON"),
    "unpaired surrogate": (b'{"op": "c", "after": {"id": 1, "s": "\\ud800"}}', "field 's'"),
    "not UTF-8": (b'{"op": "c", "after": {"id": 1, "s": "\xff"}}', "not JSON"),
}


@pytest.mark.parametrize("payload, reason", UNDECODABLE.values(), ids=UNDECODABLE.keys())
def test_undecodable_envelopes_are_malformed(payload: bytes, reason: str) -> None:
    with pytest.raises(Malformed, match=reason) as err:
        decoder().decode_change(payload, 0)
    assert len(str(err.value)) < 400  # the reason, not the payload


def test_values_at_the_edges_of_their_types_still_decode() -> None:
    dec = decoder()
    edges = {"id": -(2**63), "n": 2**31 - 1, "f": FLOAT32_MAX, "d": 1.7e308, "s": "\u00e9\U0001f600",
             "at": 253402300799999, "us": -62135596800000000, "day": 2932896}  # 9999-12-31, 0001-01-01
    decoded = dec.decode_change(envelope(edges, ts_ms=-62135596800000), 0)
    assert decoded is not None
    commit, values = decoded.commit, decoded.values
    assert values == [-(2**63), 2**31 - 1, FLOAT32_MAX, 1.7e308, "\u00e9\U0001f600",
                      datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC),
                      date(9999, 12, 31)]
    assert commit == datetime(1, 1, 1, tzinfo=UTC)
    assert build(dec, decoded).num_rows == 1


# ---------------------------------------------------------------------------------------------- the batch
class _Id:
    def __init__(self, entry: int) -> None:
        self.entry = entry

    def ledger_id(self) -> int:
        return 7

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return -1

    def partition(self) -> int:
        return 0

    def serialize(self) -> bytes:
        return b""


class _Message:
    def __init__(self, payload: bytes, key: str) -> None:
        self.payload, self.key = payload, key

    def data(self) -> bytes:
        return self.payload

    def publish_timestamp(self) -> int:
        return 1000

    def partition_key(self) -> str:
        return self.key

    def properties(self) -> dict[str, str]:
        return {}


def test_an_applied_truncate_is_a_truncate_record_in_its_place() -> None:
    """debezium.truncate=apply: the truncate is a record between the changes around it, with the source's
    commit time and a value of its type in each not-null key column (Spark expects no null there)."""
    schema = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "k", "type": "string"}, {"name": "id", "type": "long"}, {"name": "n", "type": ["null", "int"]}]})
    options = PulsarOptions.model_validate({"service.url": "pulsar://unused:6650", "topic": "t",
                                            "valueFormat": "debezium", "valueSchema": schema, "changeKeys": "k,id",
                                            "debezium.truncate": "apply"})
    columns = _Columns(None, options, Channel("persistent://public/default/t", 0))
    row = json.dumps({"op": "c", "after": {"k": "a", "id": 1, "n": 2}, "source": {"ts_us": 5}}).encode()
    truncate = json.dumps({"op": "t", "before": None, "after": None,
                           "source": {"schema": "public", "table": "t", "ts_us": 7}}).encode()
    batch = columns.batch([_Message(row, "a"), _Message(truncate, ""), _Message(row, "a")], [_Id(1), _Id(2), _Id(3)])
    assert batch is not None
    got = batch.to_pylist()
    assert [r["_op"] for r in got] == ["insert", "truncate", "insert"]
    assert (got[1]["k"], got[1]["id"], got[1]["n"]) == ("", 0, None)
    assert got[1]["_commit_ts"] == datetime(1970, 1, 1, 0, 0, 0, 7, tzinfo=UTC)
    assert got[0]["_seq"] < got[1]["_seq"] < got[2]["_seq"]


def test_a_bad_truncate_option_names_it_and_its_values() -> None:
    with pytest.raises(OptionError, match=r"debezium\.truncate.*'fail' or 'apply'"):
        parse(PulsarOptions, {"service.url": "pulsar://unused:6650", "topic": "t", "valueFormat": "debezium",
                              "valueSchema": SCHEMA, "changeKeys": "id", "debezium.truncate": "skip"}, what="pulsar")


def test_a_value_the_batch_cannot_hold_fails_naming_the_message_not_arrow() -> None:
    """The batch build itself is covered: a value a converter let through (simulated by a converter that
    checks nothing) fails the read naming its message id and key, not with a bare ArrowInvalid."""
    options = PulsarOptions.model_validate({"service.url": "pulsar://unused:6650", "topic": "t",
                                            "valueFormat": "debezium", "valueSchema": SCHEMA, "changeKeys": "id"})
    columns = _Columns(None, options, Channel("persistent://public/default/t", 0))
    columns.decoder.fields = [_Field(f.name, f.arrow, f.nullable, lambda v: v) for f in columns.decoder.fields]
    msgs = [_Message(envelope(), "good"), _Message(envelope({"n": 2**40}), "too-big")]
    with pytest.raises(MalformedRecordError, match=r"message \[7, 2, -1\] \(key 'too-big'\).*column 'n'"):
        columns.batch(msgs, [_Id(1), _Id(2)])


def test_undecodable_envelopes_are_quarantined_and_the_rest_is_read(broker: ApachePulsar, topic: str) -> None:
    good = [envelope({"n": i}, ts_ms=1000 + i) for i in range(3)]
    bad = [payload for payload, _ in UNDECODABLE.values()]
    produce(broker.url, topic, [good[0], *bad[:10], good[1], *bad[10:], good[2]], ["k"] * (len(bad) + 3))
    q = topic + "-quarantine"
    b = backend(broker.url, topic, valueFormat="debezium", valueSchema=SCHEMA, changeKeys="id",
                onMalformed="quarantine", quarantineTopic=q)
    table, _ = drain(b)
    assert table.column("n").to_pylist() == [0, 1, 2]
    client = open_client(broker.url)
    try:
        reader = client.create_reader(q, pulsar.MessageId.earliest)
        quarantined = []
        for _ in bad:
            msg = reader.read_next(5000)
            quarantined.append(msg.data())
            assert msg.properties()["cdc.error"] and msg.properties()["cdc.messageId"]
        assert sorted(quarantined) == sorted(bad)
    finally:
        client.close()


def test_a_value_beyond_its_column_fails_the_query_naming_the_message(broker: ApachePulsar, topic: str) -> None:
    ids = produce(broker.url, topic, [envelope(), envelope({"n": 2**31})], ["ok", "too-big"])
    b = backend(broker.url, topic, valueFormat="debezium", valueSchema=SCHEMA, changeKeys="id")
    mid = ids[1]
    where = rf"message \[{mid.ledger_id()}, {mid.entry_id()}, {mid.batch_index()}\] \(key 'too-big'\)"
    with pytest.raises(MalformedRecordError, match=where + r".*field 'n'.*onMalformed=quarantine"):
        drain(b)


# ---------------------------------------------------------------------------------------------- fuzzing
_SPECIAL_STRINGS = st.sampled_from(["c", "u", "d", "r", "t", "", "\ud800", "\udfff", "1e400", "NaN", "op", "after"])
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**80), 2**80), st.floats(), st.floats(width=32),
    st.text(max_size=6), _SPECIAL_STRINGS,
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4) | _SPECIAL_STRINGS, inner,
                                                                 max_size=3),
    max_leaves=8,
)


def _near(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in the type's range and just outside it, where conversions break."""
    edge = st.sampled_from([lo - 1, lo, hi, hi + 1, 0])
    return st.one_of(st.integers(lo, hi), edge, st.integers(lo - 2**20, lo), st.integers(hi, hi + 2**20))


_typed = {
    "id": _near(-(2**63), 2**63 - 1),
    "n": _near(-(2**31), 2**31 - 1),
    "f": st.one_of(st.floats(), st.floats(width=32), st.sampled_from([FLOAT32_MAX, 3.4028235e38, 3.40282357e38])),
    "d": st.floats(),
    "s": st.text(max_size=8) | _SPECIAL_STRINGS,
    "at": _near(-62135596800000, 253402300799999),
    "us": _near(-62135596800000000, 253402300799999999),
    "day": _near(-719162, 2932896),
}
_image = st.one_of(
    st.fixed_dictionaries({}, optional={k: v | _json for k, v in _typed.items()}),
    st.fixed_dictionaries({"id": _typed["id"]}, optional={k: v for k, v in _typed.items() if k != "id"}),
    _json,
)
_ts = st.one_of(_near(-62135596800000, 253402300799999), _json)
_source = st.fixed_dictionaries({}, optional={
    "ts_ms": _ts,
    "ts_us": st.one_of(_near(-62135596800000000, 253402300799999999), _json),
    "ts_ns": st.one_of(_near(-62135596800000000000, 253402300799999999999), _json),
})
_envelope = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(["c", "u", "d", "r", "t"]) | _json,
    "before": _image,
    "after": _image,
    "ts_ms": _ts,
    "source": _source | _json,
})
# Envelopes close to valid ones, where the type and range checks are reached, and anything else.
_typed_image = st.fixed_dictionaries({"id": _typed["id"]}, optional={k: v for k, v in _typed.items() if k != "id"})
_likely = st.fixed_dictionaries(
    {"op": st.sampled_from(["c", "u", "d", "r"]), "before": _typed_image, "after": _typed_image},
    optional={"ts_ms": _ts, "source": _source},
)
_documents = st.one_of(_likely, _likely.map(lambda e: {"payload": e}), _envelope, _json)


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    """A JSON envelope (valid or not), then maybe mutated at the byte level."""
    payload = json.dumps(draw(_documents)).encode()
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        at = draw(st.integers(0, len(payload)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "nest"]))
        if kind == "delete":
            payload = payload[:at] + payload[at + draw(st.integers(1, 4)):]
        elif kind == "insert":
            payload = payload[:at] + draw(st.binary(min_size=1, max_size=4) | st.sampled_from(
                [b"[", b"{", b'"', b"\\", b"1e400", b"NaN", b"-", b"\\ud800", b"99999999999999999999"])) + payload[at:]
        elif kind == "replace" and at < len(payload):
            payload = payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1:]
        elif kind == "truncate":
            payload = payload[:at]
        elif kind == "nest":
            depth = draw(st.sampled_from([50, 2000, 50_000]))
            payload = b'{"op": "c", "after": ' + b"[" * depth + payload + b"]" * depth + b"}"
    return payload


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads())
def test_any_payload_decodes_into_a_batch_or_is_malformed(payload: bytes) -> None:
    dec = decoder()
    try:
        decoded = dec.decode_change(payload, 1000)
    except (Malformed, TruncateEvent):
        return
    if decoded is None:  # a tombstone: only an empty value is one
        assert value_of(payload) == b""
        return
    batch = build(dec, decoded)
    for name in ("f", "d"):  # a float column never holds inf or NaN (1e400, or a double beyond float32)
        value = batch.column(name)[0].as_py()
        assert value is None or math.isfinite(value), (name, value)
