"""Walking the binary log: events into transactions, for planning (counting) and reading (decoding).

The stream (:class:`~.connection.BinlogStream`) yields raw events; :class:`EventWalker` reads each one's
19-byte header, tracks the file it is in (``ROTATE`` events, the server's own at the start of a dump and
after each file), and groups events into transactions:

* MariaDB: a ``GTID`` event opens one (``domain-server-sequence``); a transactional group ends with ``XID``
  (or a ``COMMIT``/``ROLLBACK`` query for non-transactional tables), a standalone one (DDL) with its one
  statement;
* MySQL: a ``GTID`` (or anonymous GTID) event, then ``BEGIN`` ... ``XID``/``COMMIT``, or one DDL statement.

A transaction's position is the offset of its first event; its end, the offset after its last event, is the
boundary every range starts and ends on. Table map events are matched against the query's tables by name
before anything else is parsed; the ones of the query's tables are parsed by ``mysql-replication`` once per
distinct event (they repeat in every transaction, byte for byte, until the table changes) and their rows
events handed to a callback with the transaction's commit time: the GTID event's time (MariaDB: seconds;
MySQL 8: its microsecond ``immediate_commit_timestamp``).

Refused on sight, naming the setting: rows events written compressed (``log_bin_compress``), partial JSON
updates (``binlog_row_value_options``), compressed transactions (``binlog_transaction_compression``), and a
statement-format change of a query's table (a session with ``binlog_format=STATEMENT``); an XA transaction
that changes a query's table (its prepared changes may still be rolled back) raises
:class:`~.errors.UnsupportedTransactionError`.
"""

from __future__ import annotations

import logging
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from cdc.backends.mysql.errors import ServerSettingError, UnsupportedTransactionError
from cdc.backends.mysql.positions import describe, file_number, file_of, mysql_uuid, pack
from cdc.backends.mysql.records import (
    DELETE_ROWS,
    UPDATE_ROWS,
    WRITE,
    MappedTable,
    map_table,
    parse_table_map,
)
from cdc.errors import CdcError, MalformedRecordError

log = logging.getLogger(__name__)

QUERY, ROTATE, FORMAT_DESCRIPTION, XID, TABLE_MAP = 2, 4, 15, 16, 19
_ROWS = {23: WRITE, 24: UPDATE_ROWS, 25: DELETE_ROWS, 30: WRITE, 31: UPDATE_ROWS, 32: DELETE_ROWS}
_ROWS_V2 = frozenset({30, 31, 32})
MYSQL_GTID, MYSQL_ANONYMOUS_GTID, XA_PREPARE, PARTIAL_UPDATE_ROWS, TRANSACTION_PAYLOAD = 33, 34, 38, 39, 40
MARIADB_GTID = 162
_MARIADB_COMPRESSED_ROWS = frozenset({166, 167, 168, 169, 170, 171})
_ARTIFICIAL = 0x20  # LOG_EVENT_ARTIFICIAL_F: made up by the server for this dump, not in the file
_FL_STANDALONE, _FL_PREPARED_XA = 0x01, 0x40

_HEADER = struct.Struct("<IBIIIH").unpack_from  # timestamp, type, server id, size, end offset, flags
_MARIADB_GTID = struct.Struct("<QIB").unpack_from  # sequence, domain, flags
_DML = re.compile(rb"^\s*(?:/\*.*?\*/\s*)*(insert|update|delete|replace|load\s+data)\b", re.IGNORECASE | re.DOTALL)
_DDL = re.compile(rb"^\s*(?:/\*.*?\*/\s*)*(alter|create|drop|rename|truncate)\b", re.IGNORECASE | re.DOTALL)

RowsCallback = Callable[[int, MappedTable, bytes, int, int, int, int], None]
"""(kind, table, packet, body offset, body end, event position, commit time in Unix microseconds)."""


@dataclass
class Transaction:
    """A transaction as the walk finished it."""

    start: int
    end: int
    gtid: str | None
    rows_events: int
    """Rows events of the query's tables it holds."""
    ddl: list[str] = field(default_factory=list)
    """Statements of it that change a query's table."""


def decode_mysql_gtid(body: bytes) -> tuple[str | None, int | None]:
    """A MySQL ``GTID``/anonymous GTID event's body: the transaction's GTID (``uuid:number``; None when
    anonymous) and its ``immediate_commit_timestamp`` in Unix microseconds (None before MySQL 8.0.1)."""
    sid, gno = body[1:17], int.from_bytes(body[17:25], "little")
    gtid = None if gno == 0 and not any(sid) else f"{mysql_uuid(sid)}:{gno}"
    pos = 25
    if len(body) >= pos + 17:  # logical timestamps: a type byte, last_committed, sequence_number
        pos += 17
    if len(body) >= pos + 7:
        immediate = int.from_bytes(body[pos : pos + 7], "little") & ((1 << 55) - 1)
        return gtid, immediate or None
    return gtid, None


def _query_text(body: bytes) -> bytes:
    db_len, status_len = body[8], int.from_bytes(body[11:13], "little")
    return body[13 + status_len + db_len + 1 :]


@dataclass
class _Tables:
    """The query's tables by name, and the table maps seen so far."""

    keys: dict[tuple[bytes, bytes], tuple[str, ...]]
    checksum: bool
    mariadb: bool
    by_id: dict[int, MappedTable | None] = field(default_factory=dict)
    parsed: dict[bytes, MappedTable] = field(default_factory=dict)

    def table_map(self, data: bytes, body: int, end: int) -> None:
        table_id = int.from_bytes(data[body : body + 6], "little")
        db_len = data[body + 8]
        db = data[body + 9 : body + 9 + db_len]
        name_at = body + 10 + db_len
        name = data[name_at + 1 : name_at + 1 + data[name_at]]
        keys = self.keys.get((db, name))
        if keys is None:
            self.by_id[table_id] = None
            return
        signature = data[body + 6 : end]
        mapped = self.parsed.get(signature)
        if mapped is None:
            mapped = self.parsed[signature] = map_table(parse_table_map(data, self.checksum, self.mariadb), keys)
        self.by_id[table_id] = mapped

    def rows_table(self, data: bytes, body: int) -> MappedTable | None:
        return self.by_id.get(int.from_bytes(data[body : body + 6], "little"))


class EventWalker:
    """Walks a binary log stream from ``start`` (a transaction boundary) to ``bound``: see the module."""

    def __init__(
        self, stream: Iterable[bytes], start: int, tables: dict[tuple[bytes, bytes], tuple[str, ...]],
        checksum: bool, mariadb: bool, log_ddl: bool = False,
    ) -> None:
        self.stream = stream
        self.start = start
        self.tables = _Tables(tables, checksum, mariadb)
        self.checksum = checksum
        self.log_ddl = log_ddl
        self.position = start
        """The boundary after the last transaction walked."""
        self.reached = start
        """The position after the last event walked (of any kind); the bound once an event at or past it came."""
        self.last_gtid: dict[str, str] = {}
        self._names: re.Pattern[bytes] | None = None
        """The last GTID walked per MariaDB domain (``domain`` -> GTID) or MySQL source."""

    def transactions(self, bound: int, on_rows: RowsCallback | None) -> Iterator[Transaction | None]:
        """Yield each transaction as it ends, and None after each rows event of a query's table (a point where a
        reader may hand over a batch); stop before the first event at or past ``bound``, or at the stream's end."""
        file = file_of(self.start)
        crc = self.checksum
        tables = self.tables
        group_start: int | None = None
        gtid: str | None = None
        when = 0
        in_group = standalone = xa = False
        rows_events = 0
        ddl: list[str] = []
        for data in self.stream:
            timestamp, kind, server_id, size, end_offset, flags = _HEADER(data, 1)
            if kind == FORMAT_DESCRIPTION:
                crc = self._checksum(data)
            end = len(data) - 4 if crc else len(data)
            if end_offset == 0 or flags & _ARTIFICIAL:  # made up for this dump: only a rotate matters
                if kind == ROTATE:
                    file = file_number(data[28:end].decode())
                continue
            position = pack(file, end_offset - size)
            if position >= bound:
                self.reached = bound
                return
            self.reached = pack(file, end_offset)
            if crc and zlib.crc32(memoryview(data)[1:end]) != int.from_bytes(data[end : end + 4], "little"):
                raise MalformedRecordError(f"the binary log event at {describe(position)} fails its checksum")
            try:
                if kind == ROTATE:
                    file = file_number(data[28:end].decode())
                elif kind == MARIADB_GTID:
                    sequence, domain, gflags = _MARIADB_GTID(data, 20)
                    group_start, gtid, when = position, f"{domain}-{server_id}-{sequence}", timestamp * 1_000_000
                    standalone, xa, in_group = bool(gflags & _FL_STANDALONE), bool(gflags & _FL_PREPARED_XA), True
                    self.last_gtid[str(domain)] = gtid
                elif kind in (MYSQL_GTID, MYSQL_ANONYMOUS_GTID):
                    gtid, micros = decode_mysql_gtid(data[20:end])
                    group_start, when = position, micros or timestamp * 1_000_000
                    in_group, standalone, xa = True, True, False  # a BEGIN makes it a transaction, else one statement
                    if gtid is not None:
                        self.last_gtid[gtid.split(":")[0]] = gtid
                elif kind == TABLE_MAP:
                    tables.table_map(data, 20, end)
                elif kind in _ROWS:
                    table = tables.rows_table(data, 20)
                    if table is not None:
                        rows_events += 1
                        if on_rows is not None:
                            body = 28 + (int.from_bytes(data[28:30], "little") if kind in _ROWS_V2 else 0)
                            on_rows(_ROWS[kind], table, data, body, end, position, when)
                        yield None
                elif kind in _MARIADB_COMPRESSED_ROWS or kind == PARTIAL_UPDATE_ROWS:
                    table = tables.rows_table(data, 20)
                    if table is not None:
                        raise self._undecodable(table, position, kind)
                elif kind == TRANSACTION_PAYLOAD:
                    raise ServerSettingError(
                        f"the transaction at {describe(position)} is compressed: SET GLOBAL "
                        "binlog_transaction_compression = OFF", "binlog_transaction_compression")
                elif kind == QUERY:
                    text = _query_text(data[20:end])
                    word = text[:10].strip().upper()
                    if word == b"BEGIN" or word.startswith(b"XA START"):
                        if group_start is None:
                            group_start, when = position, timestamp * 1_000_000
                        in_group, standalone, xa = True, False, xa or word.startswith(b"XA START")
                        continue
                    if word.startswith(b"XA END"):
                        continue
                    if word not in (b"COMMIT", b"ROLLBACK") or not in_group or standalone:
                        self._statement(text, position)  # a statement: DDL, or DML logged as a statement
                        ddl.extend(self._ddl(text))
                        if in_group and not standalone:
                            continue  # inside a transaction
                        if group_start is None:
                            group_start, when = position, timestamp * 1_000_000
                    yield self._finish(group_start, pack(file, end_offset), gtid, rows_events, ddl, xa)
                    group_start, gtid, in_group, standalone, xa, rows_events, ddl = None, None, False, False, False, 0, []
                elif kind in (XID, XA_PREPARE):
                    yield self._finish(group_start, pack(file, end_offset), gtid, rows_events, ddl,
                                       xa or kind == XA_PREPARE)
                    group_start, gtid, in_group, standalone, xa, rows_events, ddl = None, None, False, False, False, 0, []
            except CdcError:
                raise
            except (ValueError, IndexError, KeyError, struct.error) as exc:
                raise MalformedRecordError(
                    f"binary log event {kind} at {describe(position)} (transaction {gtid or 'without GTID'}) cannot be "
                    f"decoded: {exc}") from exc

    @staticmethod
    def _undecodable(table: MappedTable, position: int, kind: int) -> ServerSettingError:
        setting, off = (("binlog_row_value_options", "''") if kind == PARTIAL_UPDATE_ROWS
                        else ("log_bin_compress", "OFF"))
        return ServerSettingError(
            f"the changes of {table.name} at {describe(position)} are logged in a form backend mysql cannot decode: "
            f"SET GLOBAL {setting} = {off}", setting)

    def _finish(self, start: int | None, end: int, gtid: str | None, rows_events: int, ddl: list[str],
                xa: bool) -> Transaction:
        if xa and rows_events:
            raise UnsupportedTransactionError(
                f"the XA transaction {gtid or ''} at {describe(end)} changes a table of the query: XA transactions "
                "are not supported (their prepared changes may still be rolled back)")
        for statement in ddl if self.log_ddl else ():
            if statement.lstrip().upper().startswith("TRUNCATE"):
                log.warning("TRUNCATE of a query's table at %s is not a row change and is not delivered: %s",
                            describe(end), statement)
            else:
                log.info("schema change in the binary log before %s: %s", describe(end), statement)
        self.position = end
        return Transaction(start if start is not None else end, end, gtid, rows_events, ddl)

    def _checksum(self, data: bytes) -> bool:
        """Whether the events of the file that this format description event starts carry a CRC32."""
        return data[-5] == 1

    def _names_table(self, text: bytes) -> bool:
        """Whether a statement names one of the query's tables (as a whole word)."""
        if self._names is None:
            self._names = re.compile(rb"\b(?:" + b"|".join(re.escape(t) for _, t in self.tables.keys) + rb")\b")
        return self._names.search(text) is not None

    def _statement(self, text: bytes, position: int) -> None:
        """Refuse a statement-format change of a query's table (a session that set binlog_format=STATEMENT)."""
        if _DML.match(text) and self._names_table(text):
            raise ServerSettingError(
                f"the binary log holds a statement-format change at {describe(position)} "
                f"({text[:120].decode(errors='replace')!r}): a session wrote with binlog_format other than ROW; "
                "SET GLOBAL binlog_format = 'ROW' and reconnect the clients", "binlog_format")

    def _ddl(self, text: bytes) -> list[str]:
        if _DDL.match(text) and self._names_table(text):
            return [text[:500].decode(errors="replace")]
        return []
