"""Positions of ``backend=mysql``: a binary log file and a byte offset in it, in one long; GTIDs.

**Positions.** The server writes each transaction's events contiguously into its binary log, in commit
order, so a byte address orders every change: ``position = file << 32 | offset``, where ``file`` is the
binary log's number (the ``000042`` of ``binlog.000042``) and ``offset`` a byte offset in it (the event
header's 32-bit ``log_pos``: a file never passes 4 GiB). A record's position is its rows event's offset plus
the record's index in the event: a row image takes at least one byte (its null bitmap), an update's two, so
the index stays below the event's size and positions never collide with the next event's.

Batches end between transactions: at the offset right after a transaction's last event (its ``XID`` or
``COMMIT``), which is where the next transaction starts. The end of one file and offset 4 of the next hold no
record between them, so both address the same gap.

**GTIDs** name transactions independently of files: MariaDB's ``domain-server-sequence`` (``0-1-42``; a
position is a list, one per replication domain: ``0-1-42,1-2-7``) and MySQL's ``source_uuid:interval``
sets (``3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7-9``). Both forms are parsed here; :func:`distance`
counts the transactions between two GTID positions (the lag in transactions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc.errors import PositionError

OFFSET_BITS = 32
MAX_OFFSET = (1 << OFFSET_BITS) - 1
MAX_FILE = (1 << (63 - OFFSET_BITS)) - 1
FIRST_EVENT = 4
"""The offset of a binary log's first event (after its 4-byte magic number)."""

_FILE_NUMBER = re.compile(r"^(?P<base>.+)\.(?P<number>\d+)$")


def pack(file: int, offset: int) -> int:
    if not 0 <= file <= MAX_FILE or not 0 <= offset <= MAX_OFFSET:
        raise PositionError(
            f"binary log position (file {file}, offset {offset}) does not fit a long: backend mysql packs file "
            f"numbers up to {MAX_FILE} and offsets up to {MAX_OFFSET}"
        )
    return file << OFFSET_BITS | offset


def file_of(position: int) -> int:
    return position >> OFFSET_BITS


def offset_of(position: int) -> int:
    return position & MAX_OFFSET


def file_number(name: str) -> int:
    """The number of a binary log file from its name (``binlog.000042`` -> 42)."""
    m = _FILE_NUMBER.match(name)
    if m is None:
        raise PositionError(f"binary log file name {name!r} does not end in a number (name.NNNNNN)")
    return int(m.group("number"))


def describe(position: int, files: dict[int, str] | None = None) -> str:
    """``binlog.000042:1234`` (the file's name when known) for messages."""
    number, offset = file_of(position), offset_of(position)
    name = (files or {}).get(number) or f"file #{number}"
    return f"{name}:{offset}"


def parse_file_position(text: str) -> tuple[str, int] | None:
    """``binlog.000042:1234`` -> (file name, offset); None when ``text`` is not of that form."""
    name, sep, offset = text.rpartition(":")
    if not sep or not offset.isdigit() or _FILE_NUMBER.match(name) is None:
        return None
    return name, int(offset)


# ------------------------------------------------------------------------------------------------- GTIDs
_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True, order=True)
class MariaDBGtid:
    """One MariaDB GTID: ``domain-server-sequence``."""

    domain: int
    server: int
    sequence: int

    def __str__(self) -> str:
        return f"{self.domain}-{self.server}-{self.sequence}"


def parse_mariadb_position(text: str) -> dict[int, MariaDBGtid]:
    """A MariaDB GTID position (``gtid_binlog_pos``, ``gtid_slave_pos``): domain -> its last GTID. An empty
    text is the empty position (nothing executed yet)."""
    out: dict[int, MariaDBGtid] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _MARIADB_GTID.match(part)
        if m is None:
            raise PositionError(f"{part!r} is not a MariaDB GTID (domain-server-sequence, e.g. 0-1-42)")
        gtid = MariaDBGtid(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        if gtid.domain in out:
            raise PositionError(f"MariaDB GTID position {text!r} names domain {gtid.domain} twice")
        out[gtid.domain] = gtid
    return out


def format_mariadb_position(position: dict[int, MariaDBGtid]) -> str:
    return ",".join(str(position[d]) for d in sorted(position))


def mysql_uuid(raw: bytes) -> str:
    """A MySQL source id (16 bytes, as GTID events carry it) in its text form."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_mysql_gtid_set(text: str) -> dict[str, list[tuple[int, int]]]:
    """A MySQL GTID set (``gtid_executed``): source uuid (lower case, with dashes) -> its intervals as sorted,
    merged, inclusive ``(first, last)`` pairs. ``uuid:1-5:7`` is transactions 1 to 5 and 7 of that source."""
    out: dict[str, list[tuple[int, int]]] = {}
    for part in (p.strip() for p in text.replace("\n", "").split(",")):
        if not part:
            continue
        source, *intervals = part.split(":")
        if not _UUID.match(source) or not intervals:
            raise PositionError(f"{part!r} is not a MySQL GTID set member (source_uuid:interval[:interval...])")
        uuid = mysql_uuid(bytes.fromhex(source.replace("-", "")))
        spans = out.setdefault(uuid, [])
        for interval in intervals:
            m = _INTERVAL.match(interval)
            if m is None:
                raise PositionError(f"{interval!r} in {part!r} is not a GTID interval (N or N-M)")
            first, last = int(m.group(1)), int(m.group(2) or m.group(1))
            if first < 1 or last < first:
                raise PositionError(f"GTID interval {interval!r} in {part!r} is empty or starts below 1")
            spans.append((first, last))
    return {uuid: _merge(spans) for uuid, spans in out.items()}


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def format_mysql_gtid_set(gtids: dict[str, list[tuple[int, int]]]) -> str:
    return ",".join(
        uuid + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in gtids[uuid]) for uuid in sorted(gtids)
    )


def add_mysql_gtid(gtids: dict[str, list[tuple[int, int]]], uuid: str, number: int) -> None:
    """Add transaction ``uuid:number`` to a GTID set (in place)."""
    gtids[uuid] = _merge([*gtids.get(uuid, []), (number, number)])


def _count(spans: list[tuple[int, int]]) -> int:
    return sum(b - a + 1 for a, b in spans)


def distance(executed: str, delivered: str) -> int:
    """Transactions in ``executed`` that ``delivered`` does not hold: the lag in transactions. Both are GTID
    positions of the same form: MariaDB's (per domain, the head's sequence minus the delivered one; sequences
    of a domain count its transactions when one server writes it) or MySQL GTID sets (the size of the set
    difference)."""
    if not executed.strip():
        return 0
    if _MARIADB_GTID.match(executed.split(",")[0].strip()):
        head, done = parse_mariadb_position(executed), parse_mariadb_position(delivered)
        return sum(max(0, g.sequence - (done[d].sequence if d in done else 0)) for d, g in head.items())
    head_set, done_set = parse_mysql_gtid_set(executed), parse_mysql_gtid_set(delivered)
    behind = 0
    for uuid, spans in head_set.items():
        covered = 0
        for a, b in spans:
            for c, d in done_set.get(uuid, []):
                lo, hi = max(a, c), min(b, d)
                if lo <= hi:
                    covered += hi - lo + 1
        behind += _count(spans) - covered
    return behind
