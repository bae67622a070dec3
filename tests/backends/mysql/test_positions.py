"""Positions and GTIDs of backend=mysql, and the decoding of binary values, without a server.

MySQL's own server is not packaged for this machine (MariaDB is, and the other tests run against it), so MySQL's
GTID events are tested from recorded ones: the bodies below are GTID events that MySQL 5.7 and 8.0.19 servers
wrote, as go-mysql's tests recorded them (github.com/go-mysql-org/go-mysql, replication/event_test.go), with the
GTIDs, commit timestamps and logical clocks those servers logged for them."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.backends.mysql.binlog import MYSQL_GTID, QUERY, XID, EventWalker, decode_mysql_gtid
from cdc.backends.mysql.positions import (
    MAX_FILE,
    MAX_OFFSET,
    add_mysql_gtid,
    distance,
    file_of,
    format_mysql_gtid_set,
    offset_of,
    pack,
    parse_file_position,
    parse_mariadb_position,
    parse_mysql_gtid_set,
)
from cdc.backends.mysql.values import time_text, unscaled_decimal
from cdc.errors import PositionError

# (body, GTID, immediate_commit_timestamp in Unix microseconds, last_committed, sequence_number)
RECORDED_MYSQL_GTID_EVENTS = [
    (  # a MySQL 8.0.19 replica of a 5.7 source: the original commit time is 0
        b"\x00Z\xa7*\x7fD\xa8\x11\xea\x94\x7f\x02B\xac\x19\x00\x02\x02\x01\x00\x00\x00\x00\x00\x00\x02v\x00\x00"
        b"\x00\x00\x00\x00\x00w\x00\x00\x00\x00\x00\x00\x00\xc1G\x81\x16x\xa0\x85\x00\x00\x00\x00\x00\x00\x00\xfc"
        b"\xc5\x03\x938\x01\x80\x00\x00\x00\x00",
        "5aa72a7f-44a8-11ea-947f-0242ac190002:258", 1583812517644225, 118, 119,
    ),
    (  # MySQL 5.7: no commit timestamps in the event
        b"\x00Z\xa7*\x7fD\xa8\x11\xea\x94\x7f\x02B\xac\x19\x00\x02\x03\x01\x00\x00\x00\x00\x00\x00\x025\x00\x00"
        b"\x00\x00\x00\x00\x006\x00\x00\x00\x00\x00\x00\x00",
        "5aa72a7f-44a8-11ea-947f-0242ac190002:259", None, 53, 54,
    ),
    (  # MySQL 8.0.19
        b"\x00\\\xcc\x103D\xa8\x11\xea\xbdY\x02B\xac\x19\x00\x03w\x00\x00\x00\x00\x00\x00\x00\x02x\x00\x00\x00\x00"
        b"\x00\x00\x00y\x00\x00\x00\x00\x00\x00\x00j0\xb1>x\xa0\x05\xfc\xc3\x03\x938\x01\x00",
        "5ccc1033-44a8-11ea-bd59-0242ac190003:119", 1583813191872618, 120, 121,
    ),
]


@pytest.mark.parametrize(("body", "gtid", "committed", "last_committed", "sequence"), RECORDED_MYSQL_GTID_EVENTS)
def test_recorded_mysql_gtid_events_decode(body: bytes, gtid: str, committed: int | None, last_committed: int,
                                           sequence: int) -> None:
    assert decode_mysql_gtid(body) == (gtid, committed)
    assert struct.unpack_from("<qq", body, 26) == (last_committed, sequence)  # the layout read around them


def _event(kind: int, body: bytes, end_offset: int, timestamp: int = 1_700_000_000) -> bytes:
    size = 19 + len(body) + 4
    header = struct.pack("<IBIIIH", timestamp, kind, 1, size, end_offset, 0)
    return b"\x00" + header + body + struct.pack("<I", zlib.crc32(header + body))


def test_a_mysql_transaction_from_recorded_gtid_events_gets_its_gtid_and_commit_time() -> None:
    # A MySQL transaction as a replica receives it: the recorded GTID event, BEGIN, COMMIT (XID), in file 7.
    gtid_body, gtid, committed = RECORDED_MYSQL_GTID_EVENTS[0][:3]
    begin = struct.pack("<IIBHH", 42, 0, 0, 0, 0) + b"\x00BEGIN"
    events, offset = [], 4
    for kind, body in ((MYSQL_GTID, gtid_body), (QUERY, begin), (XID, struct.pack("<Q", 9))):
        offset += 19 + len(body) + 4
        events.append(_event(kind, body, offset))
    walker = EventWalker(events, pack(7, 4), {}, checksum=True, mariadb=False)
    txns = [t for t in walker.transactions(pack(8, 0), None) if t is not None]
    assert [(t.gtid, t.start, t.end) for t in txns] == [(gtid, pack(7, 4), pack(7, offset))]
    assert walker.last_gtid == {"5aa72a7f-44a8-11ea-947f-0242ac190002": gtid}
    assert committed is not None


def test_a_corrupt_event_fails_its_checksum() -> None:
    event = bytearray(_event(XID, struct.pack("<Q", 9), 4 + 31))
    event[-6] ^= 1
    walker = EventWalker([bytes(event)], pack(1, 4), {}, checksum=True, mariadb=True)
    with pytest.raises(Exception, match="fails its checksum"):
        list(walker.transactions(pack(2, 0), None))


@given(st.integers(0, MAX_FILE), st.integers(0, MAX_OFFSET))
def test_positions_pack_and_order_by_file_then_offset(file: int, offset: int) -> None:
    p = pack(file, offset)
    assert (file_of(p), offset_of(p)) == (file, offset) and 0 <= p < 2**63
    if offset < MAX_OFFSET:
        assert pack(file, offset + 1) > p
    if file < MAX_FILE:
        assert pack(file + 1, 0) > p


def test_positions_out_of_range_are_refused() -> None:
    with pytest.raises(PositionError, match="does not fit a long"):
        pack(MAX_FILE + 1, 4)
    assert parse_file_position("binlog.000042:1234") == ("binlog.000042", 1234)
    assert parse_file_position("0-1-42") is None and parse_file_position("binlog:x") is None


def test_mariadb_gtid_positions() -> None:
    pos = parse_mariadb_position("0-1-42, 1-2-7")
    assert [str(g) for g in pos.values()] == ["0-1-42", "1-2-7"]
    assert parse_mariadb_position("") == {}
    for bad in ("0-1", "a-b-c", "0-1-2,0-1-3"):
        with pytest.raises(PositionError):
            parse_mariadb_position(bad)
    assert distance("0-1-50,1-2-9", "0-1-42") == 8 + 9
    assert distance("0-1-50", "0-1-50") == 0


def test_mysql_gtid_sets() -> None:
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    gtids = parse_mysql_gtid_set(f"{uuid.upper()}:1-5:7-9, {uuid}:6,\n4c9e3dfc9d2511e98d2e0242ac1cfd7e:3")
    assert gtids[uuid] == [(1, 9)] and gtids["4c9e3dfc-9d25-11e9-8d2e-0242ac1cfd7e"] == [(3, 3)]
    add_mysql_gtid(gtids, uuid, 11)
    assert format_mysql_gtid_set(gtids) == f"{uuid}:1-9:11,4c9e3dfc-9d25-11e9-8d2e-0242ac1cfd7e:3"
    assert distance(f"{uuid}:1-100", f"{uuid}:1-40:50") == 59
    for bad in ("xyz:1-2", f"{uuid}", f"{uuid}:5-2", f"{uuid}:0"):
        with pytest.raises(PositionError):
            parse_mysql_gtid_set(bad)


def test_decimals_from_mysqls_documented_binary_form() -> None:
    # The example of MySQL's decimal storage: 1234567890.1234 as DECIMAL(14,4), and its negation.
    assert unscaled_decimal(bytes.fromhex("810DFB38D204D2"), 14, 4) == 12345678901234
    assert unscaled_decimal(bytes.fromhex("7EF204C72DFB2D"), 14, 4) == -12345678901234


@pytest.mark.parametrize(
    ("raw", "fsp", "text"),
    [
        (bytes.fromhex("800000"), 0, "00:00:00"),
        (bytes.fromhex("B46EFB"), 0, "838:59:59"),  # the largest TIME
        (bytes.fromhex("4B9105"), 0, "-838:59:59"),
        (bytes.fromhex("80114732"), 1, "01:05:07.5"),
        (bytes.fromhex("7FEEB8CE"), 1, "-01:05:07.5"),  # a negative time with a fraction: (whole - 1, 1.0 - frac)
        (bytes.fromhex("801147000001"), 6, "01:05:07.000001"),
    ],
)
def test_time_values_in_mysqls_text_form(raw: bytes, fsp: int, text: str) -> None:
    assert time_text(raw, fsp) == text
