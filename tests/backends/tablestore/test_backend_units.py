"""Server-free parts of the tablestore backend: options, typed errors, positions, record conversion,
the protobuf field numbers. (Everything that talks to a server is in test_client.py / test_backend.py.)"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.backends.tablestore import errors as E
from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.connection import RecordPage
from cdc.backends.tablestore.options import TablestoreOptions
from cdc.backends.tablestore.plainbuffer import (
    DELETE_ALL_VERSION,
    DELETE_ONE_VERSION,
    Cell,
    Row,
    SequenceInfo,
    encode_row,
)
from cdc.backends.tablestore.positions import Pos
from cdc.backends.tablestore.records import RecordLayout, skip_past_page
from cdc.errors import (
    DataLossError,
    MalformedRecordError,
    OptionError,
    PositionError,
    TerminalError,
    TransientError,
)
from cdc.model import ChangeSchema
from cdc.options import parse

BASE = {
    "endpoint": "http://127.0.0.1:1",
    "instance.name": "inst",
    "table.name": "t",
    "tunnel.name": "tn",
    "access.key.id": "AKID",
    "access.key.secret": "s3cr3t-value",
}


def opts(**extra: str) -> TablestoreOptions:
    return parse(TablestoreOptions, {**BASE, **extra}, what="backend 'tablestore'")


# ------------------------------------------------------------------ options
def test_options_parse_case_insensitively_and_hide_secrets() -> None:
    o = parse(TablestoreOptions, {k.upper(): v for k, v in BASE.items()}, what="x")
    assert o.credentials() == ("AKID", "s3cr3t-value", None)
    assert "s3cr3t-value" not in repr(o) and "s3cr3t-value" not in str(o.model_dump())


def test_credentials_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {k: v for k, v in BASE.items() if not k.startswith("access")}
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "envid")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "envsecret")
    assert parse(TablestoreOptions, raw, what="x").credentials()[:2] == ("envid", "envsecret")
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    with pytest.raises(OptionError, match="access.key.secret"):
        parse(TablestoreOptions, raw, what="x").credentials()


def test_missing_tunnel_names_both_options() -> None:
    raw = {k: v for k, v in BASE.items() if k != "tunnel.name"}
    with pytest.raises(OptionError, match=r"tunnel\.name.*tunnel\.id"):
        parse(TablestoreOptions, raw, what="x")


def test_bad_tunnel_type_lists_accepted_values() -> None:
    with pytest.raises(OptionError, match="BaseAndStream"):
        opts(**{"tunnel.type": "Incremental"})


def test_bad_catalog_names_the_column_and_accepted_types() -> None:
    with pytest.raises(OptionError, match=r"'price'.*accepted types: string, long"):
        opts(catalog=json.dumps({"columns": {"price": {"type": "money"}}}))
    with pytest.raises(OptionError, match="catalog"):
        opts(catalog="{not json")


def test_secret_never_in_option_errors() -> None:
    with pytest.raises(OptionError) as info:
        opts(**{"access.key.secret": "", "endpoint": "ftp://x"})
    assert "s3cr3t" not in str(info.value)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("code", "status", "cls", "kind"),
    [
        ("OTSTunnelServerUnavailable", 503, E.TunnelServerUnavailableError, TransientError),
        ("OTSResourceGone", 410, E.ResourceGoneError, TransientError),
        ("OTSSequenceNumberNotMatch", 400, E.SequenceNumberMismatchError, TerminalError),
        ("OTSAuthFailed", 403, E.AuthFailedError, TerminalError),
        ("OTSParameterInvalid", 400, E.ParameterInvalidError, TerminalError),
        ("OTSTunnelExpired", 400, E.TunnelExpiredError, TerminalError),
        ("OTSTunnelExist", 409, E.TunnelExistError, TerminalError),
        ("OTSPermissionDenied", 403, E.PermissionDeniedError, TerminalError),
        ("OTSSomethingNew", 500, E.TablestoreTransientError, TransientError),
        ("OTSSomethingNew", 400, E.TablestoreServiceError, TerminalError),
    ],
)
def test_error_codes_map_to_typed_picklable_errors(code: str, status: int, cls: type, kind: type) -> None:
    err = E.error_for(code, "boom", status, "req-1")
    assert type(err) is cls and isinstance(err, kind)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)
    assert (back.code, back.http_status, back.request_id) == (code, status, "req-1")
    assert isinstance(err, E.RETRYABLE) == (kind is TransientError and cls is not E.ResourceGoneError)


def test_trimmed_data_as_the_service_reports_it_is_data_loss_not_retried() -> None:
    """The service answers HTTP 400 OTSTunnelServerUnavailable with an OTSTrimmedDataAccess message."""
    message = "/tunnel/readrecords: OTSTrimmedDataAccess Requested stream data is already trimmed or does not exist."
    err = E.error_for("OTSTunnelServerUnavailable", message, 400, "req-2")
    assert type(err) is E.TrimmedDataError and isinstance(err, DataLossError)
    assert not isinstance(err, E.RETRYABLE)
    assert type(E.error_for("OTSTrimmedDataAccess", "gone", 400)) is E.TrimmedDataError
    assert type(E.error_for("OTSTunnelServerUnavailable", "busy", 503)) is E.TunnelServerUnavailableError


# ------------------------------------------------------------------ protobuf
def test_field_numbers_match_the_java_proto() -> None:
    def num(msg: object, field: str) -> int:
        return msg.DESCRIPTOR.fields_by_name[field].number  # type: ignore[attr-defined]

    assert [num(pb.ReadRecordsRequest, f) for f in ("tunnel_id", "client_id", "channel_id", "token")] == [
        1,
        2,
        3,
        4,
    ]
    assert [num(pb.ReadRecordsResponse, f) for f in ("records", "next_token", "may_more_record")] == [1, 2, 3]
    assert [num(pb.Record, f) for f in ("action_type", "record", "origin_record", "latest_record")] == [
        1,
        2,
        3,
        7,
    ]
    assert [num(pb.Tunnel, f) for f in ("table_name", "tunnel_name", "tunnel_type")] == [1, 3, 4]
    assert num(pb.TunnelInfo, "stream_record_options") == 14
    assert [num(pb.CheckpointRequest, f) for f in ("checkpoint", "sequence_number")] == [4, 5]
    assert [num(pb.ChannelInfo, f) for f in ("channel_rpo", "channel_count", "parent_channel_ids")] == [
        5,
        6,
        100,
    ]
    # a known encoding: field 4 (token) is a length-delimited string "t"
    req = pb.ReadRecordsRequest(tunnel_id="a", client_id="b", channel_id="c", token="t")
    assert req.SerializeToString() == b"\n\x01a\x12\x01b\x1a\x01c\x22\x01t"


# ------------------------------------------------------------------ positions
@given(
    token=st.text(min_size=1, max_size=20),
    skip=st.integers(0, 10_000),
    n=st.integers(0, 10**12),
    last=st.none() | st.lists(st.integers() | st.text(max_size=5) | st.binary(max_size=5), max_size=3),
)
def test_positions_round_trip_through_json(token: str, skip: int, n: int, last: list[object] | None) -> None:
    p = Pos(token, skip, n, None if last is None else tuple(last))
    text = json.dumps(p.to_json())
    assert Pos.parse("c", json.loads(text)) == p


@pytest.mark.parametrize(
    "bad",
    [
        {"not": "a position"},
        5,
        {"token": "", "skip": 0, "n": 0, "last": None},
        {"token": "t", "skip": -1, "n": 0, "last": None},
        {"token": "t", "skip": 0, "n": True, "last": None},
        {"token": "t", "skip": 0, "n": 0, "last": "x"},
    ],
)
def test_bad_positions_are_rejected(bad: object) -> None:
    with pytest.raises(PositionError):
        Pos.parse("c", bad)


def test_a_gap_past_a_shorter_response_moves_along_the_chain() -> None:
    page = RecordPage([pb.Record(action_type=pb.PUT_ROW, record=b"")] * 3, "t2")
    assert skip_past_page("c", {"token": "t1"}, page, "t1", 5) == ("t2", 2)


@pytest.mark.parametrize("next_token", [pb.FINISHED_TOKEN, "t1"], ids=["channel ended", "at the head"])
def test_a_gap_past_the_channels_last_record_is_an_error(next_token: str) -> None:
    page = RecordPage([pb.Record(action_type=pb.PUT_ROW, record=b"")] * 3, next_token)
    position = {"token": "t1", "skip": 5, "n": 9, "last": None}
    with pytest.raises(PositionError) as info:
        skip_past_page("c", position, page, "t1", 5)
    assert str(info.value) == f"channel 'c': position {position!r} lies past the channel's last record"


# ------------------------------------------------------------------ records
def layout(ots: bool = True) -> RecordLayout:
    cols = [("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())]
    if ots:
        cols += [
            ("__ots_record_type__", pa.string()),
            ("__ots_record_timestamp__", pa.int64()),
            ("__ots_column_type_name", pa.string()),
            ("__ots_column_type_score", pa.string()),
        ]
    return RecordLayout(ChangeSchema.of(cols, ["id"], partial=True), ("name", "score"), ots)


def rec(action: int, row: Row) -> object:
    return pb.Record(action_type=action, record=encode_row(row))


def seq(ts: int, i: int = 0) -> SequenceInfo:
    return SequenceInfo(epoch=1, timestamp=ts, row_index=i)


def test_stream_records_become_changes_with_ots_columns() -> None:
    ts = 1_700_000_000_000_000
    records = [
        rec(
            pb.PUT_ROW,
            Row((("id", 1),), (Cell("name", "a", timestamp=5), Cell("score", 1.5)), sequence_info=seq(ts)),
        ),
        rec(
            pb.UPDATE_ROW,
            Row(
                (("id", 1),),
                (
                    Cell("name", cell_type=DELETE_ALL_VERSION),
                    Cell("score", cell_type=DELETE_ONE_VERSION, timestamp=5),
                ),
                sequence_info=seq(ts, 1),
            ),
        ),
        rec(pb.DELETE_ROW, Row((("id", 1),), delete_marker=True, sequence_info=seq(ts + 1))),
    ]
    t = pa.Table.from_batches([layout().to_batch("ch", False, 10, records)]).to_pylist()
    assert [r["_op"] for r in t] == ["insert", "update", "delete"]
    assert [r["_position"] for r in t] == [10, 11, 12]
    assert [r["_seq"] for r in t] == [ts * 1024, ts * 1024 + 1, (ts + 1) * 1024]
    assert t[0]["name"] == "a" and t[0]["score"] == 1.5 and t[0]["__ots_column_type_name"] == "PUT"
    assert t[1]["name"] is None and t[1]["__ots_column_type_name"] == "DELETE_ALL_VERSION"
    assert t[1]["__ots_column_type_score"] == "DELETE_ONE_VERSION"
    assert [r["__ots_record_type__"] for r in t] == ["PUT", "UPDATE", "DELETE"]
    assert [r["_unchanged"] for r in t] == [None, None, None]  # the update mentions every column
    assert t[2]["__ots_record_timestamp__"] == ts + 1 and t[2]["_commit_ts"].timestamp() == (ts + 1) / 1e6


def test_base_records_are_snapshots() -> None:
    records = [
        rec(pb.PUT_ROW, Row((("id", i),), (Cell("name", f"n{i}", timestamp=1000 + i),))) for i in range(3)
    ]
    t = pa.Table.from_batches([layout(ots=False).to_batch("b0", True, 0, records)]).to_pylist()
    assert [r["_op"] for r in t] == ["snapshot"] * 3
    assert [r["_seq"] for r in t] == [0, 1, 2] and [r["id"] for r in t] == [0, 1, 2]
    assert t[2]["_commit_ts"].timestamp() == 1.002


def test_wrong_value_type_fails_naming_the_record_and_column() -> None:
    bad = rec(pb.PUT_ROW, Row((("id", 1),), (Cell("score", "not a number"),), sequence_info=seq(1)))
    with pytest.raises(MalformedRecordError, match=r"channel 'ch', record 7: column 'score'"):
        layout().to_batch("ch", False, 7, [bad])


def test_corrupt_record_is_an_error() -> None:
    good = encode_row(Row((("id", 1),), (Cell("name", "x"),), sequence_info=seq(1)))
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # the row checksum
    with pytest.raises(MalformedRecordError, match="record 0"):
        layout().to_batch("ch", False, 0, [pb.Record(action_type=pb.PUT_ROW, record=bytes(corrupt))])


def test_quarantine_writes_the_record_and_leaves_it_out(tmp_path: Path) -> None:
    good = rec(pb.PUT_ROW, Row((("id", 1),), (Cell("name", "ok"),), sequence_info=seq(1)))
    bad = rec(pb.PUT_ROW, Row((("id", 2),), (Cell("score", "not a number"),), sequence_info=seq(2)))
    corrupt = pb.Record(action_type=pb.PUT_ROW, record=b"\x75\x00\x00\x00garbage")
    lay = RecordLayout(layout().schema, ("name", "score"), True, str(tmp_path / "q"))
    for _ in range(2):  # a replayed batch rewrites the same files
        batch = lay.to_batch("ch/1", False, 5, [good, bad, corrupt])
    assert batch.column("id").to_pylist() == [1] and batch.column("_position").to_pylist() == [5]
    files = sorted((tmp_path / "q" / "ch_1").iterdir())
    assert [f.name for f in files] == [f"{6:020d}.json", f"{7:020d}.json"]
    entry = json.loads(files[0].read_text())
    assert entry["position"] == 6 and "score" in entry["error"] and entry["record_base64"]


def test_quarantine_needs_a_path() -> None:
    with pytest.raises(OptionError, match="quarantine.path"):
        opts(onMalformed="quarantine")
    with pytest.raises(OptionError, match="onMalformed"):
        opts(onMalformed="ignore")


def test_update_row_lists_the_columns_it_leaves_unchanged() -> None:
    """An UPDATE_ROW is partial: unmentioned columns are in _unchanged (their column type null); a
    deleted column is present and null; PUT_ROW replaces the row (absent columns null, not unchanged)."""
    records = [
        rec(pb.UPDATE_ROW, Row((("id", 1),), (Cell("name", "b"),), sequence_info=seq(1))),
        rec(
            pb.UPDATE_ROW,
            Row(
                (("id", 1),),
                (Cell("score", cell_type=DELETE_ONE_VERSION, timestamp=3),),
                sequence_info=seq(2),
            ),
        ),
        rec(pb.UPDATE_ROW, Row((("id", 1),), (Cell("other", "not in the catalog"),), sequence_info=seq(3))),
        rec(pb.PUT_ROW, Row((("id", 1),), (Cell("name", "c"),), sequence_info=seq(4))),
    ]
    for ots in (True, False):
        t = pa.Table.from_batches([layout(ots).to_batch("ch", False, 0, records)]).to_pylist()
        assert [r["_unchanged"] for r in t] == [["score"], ["name"], ["name", "score"], None]
        assert (t[0]["name"], t[0]["score"]) == ("b", None)
        assert (t[1]["name"], t[1]["score"]) == (None, None)
        assert (t[3]["name"], t[3]["score"]) == ("c", None)
        if ots:
            # the column types say the same: null exactly for the columns the record does not mention
            for r in t:
                types = {c: r[f"__ots_column_type_{c}"] for c in ("name", "score")}
                if r["_op"] == "update":
                    assert sorted(c for c, k in types.items() if k is None) == r["_unchanged"]
            assert t[1]["__ots_column_type_score"] == "DELETE_ONE_VERSION"
    assert layout().arrow().names[:6] == ["_op", "_seq", "_commit_ts", "_channel", "_position", "_unchanged"]
