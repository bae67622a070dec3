"""``backend=mysql``: MySQL and MariaDB binary logs as a change log, no Kafka or Debezium.

Design
======
**Channels.** The server writes one binary log, every transaction whole and in commit order, so the backend
has one change channel, ``changes``.

**Positions** are longs, ``binary log file number << 32 | byte offset`` (:mod:`.positions`); a record's is its
rows event's offset plus its index in the event, and is its ``_seq`` and ``_position``, so ``_seq`` orders
every key's changes. Batch ends fall between transactions only (the offset after a transaction's ``XID`` or
``COMMIT``): a transaction is never split across batches, and one larger than the budget
(``maxRecordsPerTrigger``) is taken whole (the budget is soft). A position given by the user must be such a
boundary, a ``file:offset`` of one, or a MariaDB GTID position (``0-1-42``: the boundary after it).

**Repeatable reads until commit.** Planning and reading ask the server for its binary log like a replica
(``COM_BINLOG_DUMP``, non-blocking) and consume nothing: a range reads the same changes as long as the server
keeps its files. Planning never passes the position ``SHOW MASTER STATUS`` reports, which lies between
transactions. Without a record budget planning counts rows events (a lower bound: an event holds at least one
row) and decodes nothing; with one it decodes the rows to count them exactly. A file a needed position lies in
that the server no longer has (expired: ``binlog_expire_logs_seconds``, ``expire_logs_days``; or purged) is
:class:`~cdc.errors.DataLossError`, which ``failOnDataLoss`` governs. Nothing is acknowledged to the server:
it does not know the query, which holds no server resource.

**Settings.** The server must write ``binlog_format=ROW``, ``binlog_row_image=FULL`` and
``binlog_row_metadata=FULL``; the user needs ``REPLICATION SLAVE`` and ``BINLOG MONITOR`` (MariaDB) or
``REPLICATION CLIENT`` (MySQL). Otherwise opening the backend fails naming the setting or privilege and its
fix (:func:`.connection.check_server`, :func:`.connection.check_privileges`).

**Tables.** Each table must have a primary key (else :class:`~.errors.NoPrimaryKeyError` naming it). One
table: typed columns; several: ``_table``, ``_key``, ``_row`` JSON columns (:mod:`.records`).

**Lag.** ``binlogBytesBehind`` (the binary log between the query's position and the server's) and, on
MariaDB, ``gtidBehind`` (transactions: the server's ``gtid_binlog_pos`` against the query's position).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cdc.backend import Backend, ChannelHead, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.backends.mysql import connection
from cdc.backends.mysql.binlog import EventWalker
from cdc.backends.mysql.catalog import describe as describe_table
from cdc.backends.mysql.options import MySQLOptions
from cdc.backends.mysql.positions import (
    MAX_OFFSET,
    OFFSET_BITS,
    describe,
    distance,
    file_number,
    file_of,
    format_mariadb_position,
    offset_of,
    pack,
    parse_file_position,
    parse_mariadb_position,
    parse_mysql_gtid_set,
)
from cdc.backends.mysql.reader import CHANGES, MySQLRangeReader, table_keys
from cdc.backends.mysql.records import Layout, MappedTable, Rows, decode_rows
from cdc.backends.mysql.snapshot import MySQLChunkedSnapshot
from cdc.errors import PositionError

log = logging.getLogger(__name__)

SKIP_BYTES = 4 << 20
"""Planning moves past transactions of other tables without records of its own once they span this many bytes
(a quiet table on a busy server would otherwise be walked from the same position at every trigger; an empty
batch then moves the query on)."""

_BOUNDARY_EVENTS = frozenset({"Gtid", "Anonymous_Gtid", "Gtid_list", "Binlog_checkpoint", "Format_desc", "Rotate",
                              "Stop", "Start_encryption", "Previous_gtids"})


class MySQLBackend(Backend):
    name = "mysql"
    options_model = MySQLOptions
    options: MySQLOptions

    def __init__(self, options: MySQLOptions) -> None:
        super().__init__(options)
        self.endpoint = options.endpoint
        self._conn: Any = None
        conn = self.conn
        self.server = connection.check_server(conn)
        connection.check_privileges(self.endpoint, conn, self.server)
        self.layout = Layout(tuple(describe_table(conn, t) for t in options.table_list))
        self._keys = table_keys(self.layout)
        self._gtid_at: dict[int, str] = {}
        self._chunked: MySQLChunkedSnapshot | None = None

    @property
    def conn(self) -> Any:
        if self._conn is None or not self._conn.open:
            self._conn = connection.connect(self.endpoint)
        return self._conn

    def schema(self) -> Any:
        return self.layout.arrow_schema()

    def list_channels(self) -> Sequence[ChannelInfo]:
        return [ChannelInfo(CHANGES)]

    def _check_channel(self, channel: str) -> None:
        if channel != CHANGES:
            raise PositionError(f"backend mysql has no channel {channel!r}; channels: {CHANGES}")

    def earliest(self, channel: str) -> Position:
        self._check_channel(channel)
        return connection.earliest(self.conn)

    def latest(self, channel: str) -> Position:
        self._check_channel(channel)
        return connection.head(self.conn)

    # ---------------------------------------------------------------------------------------------- positions
    def parse_position(self, channel: str, value: Any) -> Position:
        """A position: a long (a boundary between transactions), ``file:offset`` of one, or a MariaDB GTID
        position (``domain-server-sequence[,...]``: the boundary after those transactions)."""
        self._check_channel(channel)
        if isinstance(value, str):
            text = value.strip()
            file_pos = parse_file_position(text)
            if file_pos is not None:
                return self._boundary(pack(file_number(file_pos[0]), file_pos[1]))
            if text and text[0].isdigit() and "-" in text and ":" not in text:
                return self._after_gtid(text)
            if ":" in text:
                parse_mysql_gtid_set(text)  # named as a GTID set when it is one
                raise PositionError(
                    f"channel {channel!r}: positions by MySQL GTID set ({text!r}) are not supported; give the binary "
                    "log position (file:offset) of the transaction boundary")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or offset_of(value) > MAX_OFFSET:
            raise PositionError(
                f"channel {channel!r}: a mysql position is a long (binary log file << {OFFSET_BITS} | offset), "
                f"'file:offset' or a MariaDB GTID position, got {value!r}")
        return self._boundary(value)

    def _boundary(self, position: int) -> int:
        """``position`` when a transaction starts there (or the binary log ends there), else PositionError."""
        conn = self.conn
        files = connection.binary_logs(conn)
        name = connection.file_name(files, position)
        offset = offset_of(position)
        if offset == 4 or offset == files[file_of(position)][1]:
            return position
        try:
            rows = connection.query(conn, f"SHOW BINLOG EVENTS IN %s FROM {offset} LIMIT 1", (name,))
        except Exception as exc:  # noqa: BLE001 - the server's refusal of an offset that is no event's start
            raise PositionError(f"{name}:{offset} is not the start of a binary log event: {exc}") from None
        kind, info = (str(rows[0][2]), str(rows[0][5])) if rows else ("", "")
        if rows and kind not in _BOUNDARY_EVENTS and not (kind == "Query" and info.upper().startswith("BEGIN")):
            raise PositionError(
                f"{name}:{offset} is inside a transaction (a {kind} event): start at a transaction's first event "
                "or at the end of one (a batch end from `cdc offsets`, or SHOW BINLOG EVENTS' Gtid events)")
        return position

    def _after_gtid(self, text: str) -> int:
        if not self.server.mariadb:
            raise PositionError(f"{text!r} is a MariaDB GTID position, and this server is MySQL")
        parse_mariadb_position(text)
        position = connection.gtid_start(self.endpoint, text, self.server.checksum)
        self._gtid_at[position] = format_mariadb_position(parse_mariadb_position(text))
        return position

    # ---------------------------------------------------------------------------------------------- planning
    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        self._check_channel(channel)
        begin = int(start)
        conn = self.conn
        files = connection.binary_logs(conn)
        name = connection.file_name(files, begin)
        head = connection.head(conn)
        bound = head if until is None else min(head, int(until))
        if bound <= begin or max_records == 0:
            return PlannedRange(begin, 0, False)
        counted: list[int] = [0]

        def count(kind: int, table: MappedTable, data: bytes, body: int, body_end: int, position: int,
                  when: int) -> None:
            rows = Rows.of(table)
            decode_rows(rows, kind, data, body, body_end, position, when)
            counted[0] += len(rows)

        end, taken = begin, 0
        seen: dict[str, str] = {}  # the last GTID per domain up to end
        budget_hit = False
        with connection.BinlogStream(self.endpoint) as stream:
            walker = EventWalker(stream.start(name, offset_of(begin)), begin, self._keys, self.server.checksum, self.server.mariadb)
            for txn in walker.transactions(bound, count if max_records is not None else None):
                if txn is None:
                    continue
                n = counted[0] if max_records is not None else txn.rows_events
                counted[0] = 0
                if n == 0:
                    continue
                if max_records is not None and taken > 0 and taken + n > max_records:
                    budget_hit = True
                    break
                taken += n
                end, seen = txn.end, dict(walker.last_gtid)
                if max_records is not None and taken >= max_records:
                    budget_hit = True
                    break
            if not budget_hit:
                walked = walker.position
                if until is not None and bound == int(until):
                    end = int(until)
                elif walked > end and (taken or connection.bytes_between(files, end, walked) >= SKIP_BYTES):
                    end = walked
                if end == walked or end == int(until or -1):
                    seen = dict(walker.last_gtid)
        self._remember_gtid(begin, end, seen)
        return PlannedRange(end, taken, False)

    def _remember_gtid(self, begin: int, end: int, seen: dict[str, str]) -> None:
        """The GTID position at ``end``, from the one at ``begin`` and the GTIDs walked (for ``gtidBehind``)."""
        before = self._gtid_at.get(begin)
        if not self.server.mariadb or before is None or end == begin:
            return
        state = {str(g.domain): str(g) for g in parse_mariadb_position(before).values()}
        state.update(seen)
        self._gtid_at[end] = ",".join(state[d] for d in sorted(state, key=int))
        while len(self._gtid_at) > 64:  # the positions of the last batches are enough
            del self._gtid_at[next(iter(self._gtid_at))]

    # -------------------------------------------------------------------------------------------------- lag
    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        """The server's binary log position is the head; how far behind is in bytes (``binlogBytesBehind``) and,
        on MariaDB, in transactions (``gtidBehind``): counting the records would decode the binary log twice."""
        conn = self.conn
        files = connection.binary_logs(conn)
        head = connection.head(conn)
        out: dict[str, ChannelHead] = {}
        for cid, pos in positions.items():
            position = int(pos)
            measures = {"binlogBytesBehind": float(connection.bytes_between(files, position, head))}
            behind = self._gtid_behind(files, position) if self.server.mariadb else None
            if behind is not None:
                measures["gtidBehind"] = float(behind)
            out[cid] = ChannelHead(head, 0 if position >= head else None, measures=measures)
        return out

    def _gtid_behind(self, files: dict[int, tuple[str, int]], position: int) -> int | None:
        state = self._gtid_at.get(position)
        if state is None:
            if file_of(position) not in files:
                return None
            state = connection.binlog_gtid_pos(self.conn, files[file_of(position)][0], offset_of(position))
            self._gtid_at[position] = state
        return distance(connection.gtid_binlog_pos(self.conn, True), state)

    def chunked_snapshot(self) -> MySQLChunkedSnapshot:
        if self._chunked is None:
            self._chunked = MySQLChunkedSnapshot(self)
        return self._chunked

    def chunked_batch_snapshot(self) -> MySQLChunkedSnapshot:
        """A batch read's chunked snapshot: the driver reads every chunk in its cut's transaction anyway, so a batch
        read plans the whole snapshot at once (:meth:`cdc.planner.Planner.chunked_batch`), in a directory of its own
        under ``snapshot.path``."""
        if self._chunked is not None:
            self._chunked.close_cut()
        self._chunked = MySQLChunkedSnapshot(self, batch_read=True)
        return self._chunked

    def reader(self) -> RangeReader:
        chunked = None if self._chunked is None else self._chunked.reads()
        return MySQLRangeReader(self.endpoint, self.layout, self.server, chunked=chunked)

    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        if CHANGES in positions and self._chunked is not None:  # chunk reads of batches before it are not read again
            self._chunked.store.cleanup(int(positions[CHANGES]))

    def close(self) -> None:
        if self._chunked is not None:
            self._chunked.close_cut()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __repr__(self) -> str:
        return f"MySQLBackend({self.endpoint!r}, tables={self.options.tables!r})"


__all__ = ["MySQLBackend", "describe"]
