"""Connecting to the server: queries (PyMySQL), the checks of its settings and the user's privileges, the list of
binary logs, and the binary log itself as a replica receives it (:class:`BinlogStream`).

A read asks the server for its binary log from a file and offset with ``COM_BINLOG_DUMP`` in non-blocking mode,
as a replica does, and stops at the range's end: the server keeps its binary logs until they expire
(``binlog_expire_logs_seconds``, ``expire_logs_days``) or are purged, so reading a range again reads the same
events, and nothing is consumed. A file that a needed position lies in but the server no longer has is
:class:`~cdc.errors.DataLossError`.

Each stream registers under a server id of its own, drawn at random from ``[2**31, 2**32)``: the server ends
an older dump that uses the same id (it takes it for a reconnecting replica), and several tasks and the
driver read at once. Give your real replicas ids below ``2**31``.
"""

from __future__ import annotations

import logging
import random
import ssl
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysql.constants import COMMAND

from cdc.backends.mysql.errors import MissingPrivilegeError, ServerSettingError
from cdc.backends.mysql.options import Endpoint
from cdc.backends.mysql.positions import FIRST_EVENT, describe, file_number, file_of, offset_of, pack
from cdc.errors import BackendUnavailableError, DataLossError, PositionError

log = logging.getLogger(__name__)

_ACCESS_DENIED = frozenset({1044, 1045, 1142, 1227})  # access denied to a database, a user, a table, an action
_CANNOT_CONNECT = frozenset({2003, 2005, 2006, 2013})
_BINLOG_ERROR = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG
_NON_BLOCK = 0x01
_SERVER_IDS = (1 << 31, (1 << 32) - 1)


class _Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """PyMySQL's connection with one TLS context per set of TLS settings in the process: building one loads the
    system's CA certificates, which took 30-180 ms, and a read or a plan opens a connection."""

    _contexts: dict[str, Any] = {}

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        key = repr(sorted(sslp.items())) if isinstance(sslp, dict) else None
        if key is None:
            return super()._create_ssl_ctx(sslp)
        if key not in self._contexts:
            self._contexts[key] = super()._create_ssl_ctx(sslp)
        return self._contexts[key]


_ENCODERS_ONLY = {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)}
"""PyMySQL's converters without its decoders: parameters are escaped as usual, values come back as the server
sends them (text columns as ``str``, every other column as ``bytes``)."""


def connect(endpoint: Endpoint, raw: bool = False) -> Any:
    """A PyMySQL connection (autocommit, utf8mb4); ``raw``: values unconverted. An unreachable server is
    :class:`BackendUnavailableError`."""
    try:
        return _Connection(**endpoint.connect_args(), **({"conv": _ENCODERS_ONLY} if raw else {}))
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else 0
        if code in _ACCESS_DENIED:
            raise MissingPrivilegeError(f"the server refused {endpoint.user!r}: {exc.args[1]}", "login") from None
        raise BackendUnavailableError(f"cannot connect to the server {endpoint!r} (ssl.mode={endpoint.ssl_mode}): "
                                      f"{exc}") from exc
    except (ssl.SSLError, OSError) as exc:
        raise BackendUnavailableError(f"cannot connect to the server {endpoint!r} (ssl.mode={endpoint.ssl_mode}): "
                                      f"{exc}") from exc


def query(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params or None)  # without parameters the text is sent as it is ('%' in LIKE patterns)
        return list(cur.fetchall())


@dataclass(frozen=True)
class ServerInfo:
    """What the backend needs to know of the server."""

    version: str
    mariadb: bool
    checksum: bool
    """Events end with a CRC32 (``binlog_checksum=CRC32``)."""


_REQUIRED = {
    "binlog_format": ("ROW", "SET GLOBAL binlog_format = 'ROW' and binlog_format=ROW in the server's configuration "
                      "(sessions keep the format they started with: reconnect them)"),
    "binlog_row_image": ("FULL", "SET GLOBAL binlog_row_image = 'FULL' and binlog_row_image=FULL in the server's "
                         "configuration (every column of every changed row must be logged)"),
    "binlog_row_metadata": ("FULL", "SET GLOBAL binlog_row_metadata = 'FULL' and binlog_row_metadata=FULL in the "
                            "server's configuration (the binary log then names the columns of every table it logs)"),
}
_REFUSED = {
    "log_bin_compress": ("ON", "SET GLOBAL log_bin_compress = OFF: compressed row events cannot be decoded"),
    "binlog_transaction_compression": ("ON", "SET GLOBAL binlog_transaction_compression = OFF: compressed "
                                       "transactions cannot be decoded"),
    "binlog_row_value_options": ("PARTIAL_JSON", "SET GLOBAL binlog_row_value_options = '': partial JSON updates do "
                                 "not log whole values"),
}


def check_server(conn: Any) -> ServerInfo:
    """The server's binary log settings, refused with :class:`ServerSettingError` naming the setting and its fix
    when the backend cannot read changes from them."""
    names = ("log_bin", "version", "binlog_checksum", *_REQUIRED, *_REFUSED)
    values = {str(k).lower(): str(v) for k, v in query(
        conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names)}
    if values.get("log_bin", "OFF").upper() != "ON":
        raise ServerSettingError(
            "the server does not write a binary log (log_bin is OFF): start it with log_bin (log-bin=mysql-bin and "
            "server_id=1 in the [mysqld] section of its configuration)", "log_bin")
    version = values.get("version", "")
    for name, (wanted, fix) in _REQUIRED.items():
        value = values.get(name)
        if value is None:
            raise ServerSettingError(
                f"the server ({version}) has no {name}: backend mysql needs MySQL 8.0.14+ or MariaDB 10.5+, which "
                f"write column names into the binary log ({name}=FULL)", name)
        if value.upper() != wanted:
            raise ServerSettingError(f"{name} is {value}, backend mysql needs {wanted}: {fix}", name)
    for name, (refused, fix) in _REFUSED.items():
        value = values.get(name, "")
        if value.upper() == refused:
            raise ServerSettingError(f"{name} is {value}: {fix}", name)
    return ServerInfo(version, "mariadb" in version.lower(), values.get("binlog_checksum", "NONE").upper() != "NONE")


def _denied(exc: pymysql.err.MySQLError) -> bool:
    return bool(exc.args) and exc.args[0] in _ACCESS_DENIED


def check_privileges(endpoint: Endpoint, conn: Any, info: ServerInfo) -> None:
    """Refuse a user without the privileges to read the binary log's state and the binary log itself, naming the
    missing privilege and the GRANT that gives it."""
    monitor = "BINLOG MONITOR" if info.mariadb else "REPLICATION CLIENT"
    try:
        head(conn)
    except pymysql.err.MySQLError as exc:
        if not _denied(exc):
            raise
        raise MissingPrivilegeError(
            f"user {endpoint.user!r} may not read the binary log's position ({exc.args[1]}): GRANT {monitor} ON *.* "
            f"TO the user", monitor) from None
    name, offset = head_file(conn)
    with BinlogStream(endpoint) as stream:  # from the head: the server sends nothing but its format description
        for _ in stream.start(name, offset):
            pass


def binary_logs(conn: Any) -> dict[int, tuple[str, int]]:
    """The binary logs the server holds: file number -> (name, size in bytes)."""
    return {file_number(str(r[0])): (str(r[0]), int(r[1])) for r in query(conn, "SHOW BINARY LOGS")}


def head_file(conn: Any) -> tuple[str, int]:
    try:
        rows = query(conn, "SHOW MASTER STATUS")
    except pymysql.err.ProgrammingError as exc:  # MySQL 8.4 names it SHOW BINARY LOG STATUS only
        if not exc.args or exc.args[0] != 1064:
            raise
        rows = query(conn, "SHOW BINARY LOG STATUS")
    if not rows:
        raise ServerSettingError("the server reports no binary log (SHOW MASTER STATUS is empty): enable log_bin",
                                 "log_bin")
    return str(rows[0][0]), int(rows[0][1])


def head(conn: Any) -> int:
    """The position after the last event the server has written (a transaction boundary)."""
    name, offset = head_file(conn)
    return pack(file_number(name), offset)


def earliest(conn: Any) -> int:
    """The start of the oldest binary log the server still holds."""
    files = binary_logs(conn)
    return pack(min(files), FIRST_EVENT)


def file_name(files: dict[int, tuple[str, int]], position: int) -> str:
    """The name of the file a needed position lies in; :class:`DataLossError` when the server no longer has it."""
    number = file_of(position)
    if number not in files:
        oldest = files[min(files)][0] if files else "none"
        raise DataLossError(
            f"binary log file #{number} (position {describe(position)}) is no longer on the server (purged or "
            f"expired; the oldest it holds is {oldest}): the changes in it are gone", "changes")
    return files[number][0]


def bytes_between(files: dict[int, tuple[str, int]], start: int, end: int) -> int:
    """Binary log bytes from ``start`` to ``end`` (the lag in bytes), over the files the server holds."""
    if end <= start:
        return 0
    first, last = file_of(start), file_of(end)
    if first == last:
        return offset_of(end) - offset_of(start)
    total = max(0, files.get(first, ("", offset_of(start)))[1] - offset_of(start))
    total += sum(size for n, (_, size) in files.items() if first < n < last)
    return total + offset_of(end)


def gtid_binlog_pos(conn: Any, mariadb: bool) -> str:
    """The server's GTID position: MariaDB's ``gtid_binlog_pos``, MySQL's ``gtid_executed``."""
    rows = query(conn, "SELECT @@GLOBAL.gtid_binlog_pos" if mariadb else "SELECT @@GLOBAL.gtid_executed")
    return str(rows[0][0] or "")


def binlog_gtid_pos(conn: Any, name: str, offset: int) -> str:
    """MariaDB's GTID position at a binary log position (``BINLOG_GTID_POS``; it reads the file up to it)."""
    rows = query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (name, offset))
    return str(rows[0][0] or "") if rows else ""


def gtid_start(endpoint: Endpoint, gtid_position: str, checksum: bool) -> int:
    """The boundary right after the transactions of a MariaDB GTID position: where the server starts a replica
    that says it has executed them (``@slave_connect_state``). The first transaction it sends starts there; when
    it sends none, the end of what it sent is that boundary."""
    conn = connect(endpoint)
    try:
        with conn.cursor() as cur:
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            cur.execute("SET @mariadb_slave_capability = 4")
            cur.execute("SET @slave_connect_state = %s", (gtid_position,))
            cur.execute("SET @slave_gtid_strict_mode = 0")
        conn._execute_command(COMMAND.COM_BINLOG_DUMP,
                              struct.pack("<IHI", 4, _NON_BLOCK, random.randint(*_SERVER_IDS)) + b"")
        file, reached = 0, 0
        while True:
            try:
                data = conn._read_packet().get_all_data()
            except pymysql.err.OperationalError as exc:
                code, text = (exc.args + (0, ""))[:2]
                if code == _BINLOG_ERROR and "purged" in str(text).lower():
                    raise DataLossError(f"GTID position {gtid_position!r}: {text}", "changes") from None
                raise PositionError(f"GTID position {gtid_position!r}: {text}") from None
            if data[0] == 0xFE and len(data) < 9:
                return reached
            _, kind, _, size, end_offset, flags = struct.unpack_from("<IBIIIH", data, 1)
            if kind == 4:  # ROTATE: the file the next events are in
                file = file_number(data[28 : len(data) - 4 if checksum else len(data)].decode())
            if end_offset == 0 or flags & 0x20:
                continue
            if kind == 162:  # a transaction's GTID event: it starts here
                return pack(file, end_offset - size)
            reached = pack(file, end_offset)
    finally:
        conn.close()


class BinlogStream:
    """The binary log as the server sends it to a replica (``COM_BINLOG_DUMP``, non-blocking), on a connection of
    its own: queries first (:attr:`conn`), then :meth:`start` from ``name:offset``; iterating yields each event's
    packet (a ``0x00`` byte, the 19-byte header, the body, the checksum) until the end of what the server has
    written. Use it as a context manager: closing ends the dump."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.conn = connect(endpoint)
        self.name = ""
        self.offset = 0

    def start(self, name: str, offset: int) -> BinlogStream:
        self.name, self.offset = name, offset
        with self.conn.cursor() as cur:
            # The events carry checksums when the server writes them; a replica that says it knows them gets
            # them as written, else the server refuses it. Capability 4: the server sends GTID events as they are.
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            cur.execute("SET @mariadb_slave_capability = 4")
        server_id = random.randint(*_SERVER_IDS)
        self.conn._execute_command(
            COMMAND.COM_BINLOG_DUMP, struct.pack("<IHI", offset, _NON_BLOCK, server_id) + name.encode())
        return self

    def __iter__(self) -> Iterator[bytes]:
        read = self.conn._read_packet
        while True:
            try:
                data: bytes = read().get_all_data()
            except pymysql.err.OperationalError as exc:
                raise self._error(exc) from exc
            if data[0] == 0xFE and len(data) < 9:  # EOF: the end of what the server has written
                return
            yield data

    def _error(self, exc: pymysql.err.OperationalError) -> Exception:
        code, text = (exc.args + (0, ""))[:2]
        if code in _ACCESS_DENIED:
            return MissingPrivilegeError(
                f"the user may not read the binary log ({text}): GRANT REPLICATION SLAVE ON *.* TO the user",
                "REPLICATION SLAVE")
        if code == _BINLOG_ERROR:
            lowered = str(text).lower()
            if "could not find first log file" in lowered or "purged" in lowered:
                return DataLossError(f"the server no longer has binary log {self.name!r}: {text}", "changes")
            return PositionError(f"the server cannot send its binary log from {self.name}:{self.offset}: {text}")
        if code in _CANNOT_CONNECT:
            return BackendUnavailableError(f"the connection to the server was lost while reading its binary log: {text}")
        return BackendUnavailableError(f"reading the binary log failed: {exc}")

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            log.debug("closing a binary log stream failed", exc_info=True)

    def __enter__(self) -> BinlogStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
