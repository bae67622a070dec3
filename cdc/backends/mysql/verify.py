"""``cdc verify`` on MariaDB: the source side of :mod:`cdc.verify.compare` (:class:`~cdc.verify.compare.VerifySource`).

**The consistent point.** A read is a ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`` whose binary
log position ``P`` is the same transaction's ``Binlog_snapshot_file`` and ``Binlog_snapshot_position``
(:func:`cdc.backends.mysql.snapshot.open_snapshot`, the chunked snapshot's cut): MariaDB takes the read view
and that position together, so the read sees exactly the transactions that end at or before ``P``. Both of
the read's positions are ``P``: a change the read misses lies in a transaction after ``P``, so its ``_seq``
(its rows event's offset) is above ``P`` (``before``); every change it sees ends at or before ``P``, so the
pipeline has written them all once its committed position (a batch's end, a transaction boundary) is at or
past ``P`` (``after``). The committed position is read from the query's Spark checkpoint (``checkpoint``: the
last committed batch's end position of channel ``changes``), which Spark writes only after the sink committed
the batch. MySQL reports no such position for a read view, so it is refused, naming the reason.

**The canonical encoding** (:mod:`cdc.verify.canonical`) is built by SQL expressions over the columns, per
MariaDB type and the kind of the Delta column the typed layout writes it as (:mod:`.catalog`): integers and
decimals as their digits (``CAST(... AS CHAR)``; ``YEAR`` as its number), ``FLOAT`` and ``DOUBLE`` as their
IEEE 754 bits, computed exactly from the value (its binary exponent from ``LOG2``, corrected by comparison
with powers of two, which are exact; the significand scaled by a power of two, also exact), ``DATE`` as
``DATEDIFF`` from 1970-01-01, ``DATETIME`` and ``TIMESTAMP`` as ``TIMESTAMPDIFF(MICROSECOND)`` from the epoch
in the session's UTC, ``BIT(1)`` as ``true``/``false``, ``BIT(n)`` as its big-endian bytes, text, ``ENUM``,
``SET``, ``JSON`` and ``TIME`` as the UTF-8 bytes of their text, binary strings as their bytes. Zero and
invalid dates are null, as the backend makes them. Types the backend carries as bytes that MariaDB shows in
another form (spatial types, ``UUID``, ``INET4``, ``INET6``) are refused naming the column (leave them out
with ``exclude``). A chunk's digest is one ``MD5`` over ``GROUP_CONCAT`` of its rows' pieces ordered by the
key (the server's order, collations included).

**Sessions.** MariaDB cannot hand a read view to another connection, so :meth:`MySQLRead.shared` is the same
session, its queries taken in turn. Delta keys are sorted and placed into chunks in Python by sort keys that
order as the server does: numbers, dates and times by value, binary keys by their bytes, text keys by their
collation's ``WEIGHT_STRING``, which the server computes for a few thousand distinct texts per query (a
``JSON_TABLE`` over one JSON parameter). Key values are bound parameters; nothing from the data becomes SQL
text.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from cdc.backends.mysql import connection, keys
from cdc.backends.mysql.catalog import (
    BINARY,
    BIT,
    DATE,
    DATETIME,
    DECIMAL,
    DOUBLE,
    ENUM,
    FLOAT,
    INT,
    JSON,
    SET,
    TEXT,
    TIMESTAMP,
    YEAR,
    ColumnType,
    TableInfo,
)
from cdc.backends.mysql.catalog import describe as describe_table
from cdc.backends.mysql.errors import NoPrimaryKeyError, ServerSettingError
from cdc.backends.mysql.keys import KeyColumn, quote
from cdc.backends.mysql.options import parse_dsn
from cdc.backends.mysql.snapshot import open_snapshot
from cdc.errors import OptionError
from cdc.verify.canonical import PREFIXED, SHORT, Kind, kind_of
from cdc.verify.compare import Range, SourceRow, VerifyError, integer_range_filter, ranges_between

CHANNEL = "changes"
_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "char", "varchar",
                           "tinytext", "text", "mediumtext", "longtext"})
"""The data types whose bytes MariaDB shows as the backend carries them (a text type of the binary charset)."""
_KEY_KINDS = frozenset({INT, YEAR, DECIMAL, DATE, DATETIME, TIMESTAMP, TEXT, BINARY})
_WEIGHTS_PER_QUERY = 5_000


def _float_bits(c: str, mantissa: int, bias: int, width: int) -> str:
    """The IEEE 754 bits of the double value ``c`` (a ``FLOAT`` widens to it exactly) as a signed integer of
    ``width`` bits with ``mantissa`` bits of significand and exponent bias ``bias`` (MariaDB stores no NaN,
    infinity or negative zero)."""
    a = f"ABS({c})"
    rough = f"LEAST(FLOOR(LOG2({a})), {bias})"  # may be one off: corrected below by exact comparisons
    e = f"({rough} + ({a} / 2 >= POW(2, {rough})) - ({a} < POW(2, {rough})))"
    normal = f"((CAST({e} AS SIGNED) + {bias}) * {1 << mantissa} + CAST(({a} / POW(2, {e}) - 1) * {1 << mantissa} AS UNSIGNED))"
    subnormal = f"CAST({a} * POW(2, {bias - 1}) * {1 << mantissa} AS UNSIGNED)"
    unsigned = f"IF({a} < POW(2, {1 - bias}), {subnormal}, {normal})"
    sign = 1 << (width - 1)
    return f"CAST(IF({c} < 0, CAST({unsigned} AS SIGNED) - {sign - 1} - 1, {unsigned}) AS CHAR)"


def _value(column: str, t: ColumnType, kind: Kind) -> str:
    """The column's canonical bytes of ``kind`` as a SQL expression (null for a null)."""
    c = quote(column)
    if kind is Kind.INTEGER:
        return f"CAST({c} + 0 AS CHAR)" if t.kind == YEAR else f"CAST({c} AS CHAR)"
    if kind is Kind.DECIMAL:
        return f"CAST({c} AS CHAR)"
    if kind is Kind.FLOAT64:
        return _float_bits(c, 52, 1023, 64)
    if kind is Kind.FLOAT32:
        return _float_bits(c, 23, 127, 32)
    if kind is Kind.BOOLEAN:
        return f"CASE WHEN {c} IS NULL THEN NULL WHEN {c} <> 0 THEN 'true' ELSE 'false' END"
    if kind is Kind.DATE:
        return f"CAST(DATEDIFF({c}, '1970-01-01') AS CHAR)"
    if kind is Kind.TIMESTAMP:
        return f"CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {c}) AS CHAR)"
    if kind is Kind.BINARY:
        return f"CAST({c} AS BINARY)"  # BIT(n): its big-endian bytes, as the binary log holds them
    if t.kind in (TEXT, ENUM, SET, JSON):
        return f"CAST(CONVERT({c} USING utf8mb4) AS BINARY)"
    return f"CAST(CAST({c} AS CHAR) AS BINARY)"  # TIME, DECIMAL beyond 38 digits


def _kind(t: ColumnType) -> Kind:
    """The kind of the Delta column the typed layout writes a column of type ``t`` as."""
    kind = kind_of(t.arrow())
    assert kind is not None, t
    return kind


def encoding(columns: Sequence[tuple[str, Kind]], types: dict[str, ColumnType]) -> str:
    """The canonical encoding of ``columns`` (a binary string)."""
    pieces = []
    for name, kind in columns:
        v = _value(name, types[name], kind)
        if kind in PREFIXED:
            pieces.append(f"COALESCE(CONCAT(LENGTH({v}), ':', {v}), 'N')")
        else:
            pieces.append(f"COALESCE(CONCAT({v}, ','), 'N')")
    return "CAST(CONCAT(" + ", ".join(pieces) + ") AS BINARY)" if pieces else "CAST('' AS BINARY)"


_PIECE = f"IF(LENGTH(__cdc_e) > {SHORT}, CONCAT('H', MD5(__cdc_e)), CONCAT('R', __cdc_e))"
"""A row's piece of a digest (:func:`cdc.verify.canonical.chunk_digests`) from its encoding ``__cdc_e``."""


def _key_text(c: KeyColumn) -> str:
    """A key column's text form (as :func:`cdc.backends.mysql.keys.next_bounds` returns it), in hex."""
    if c.kind == BINARY:
        return f"HEX(HEX({quote(c.name)}))"
    if c.kind == TEXT:
        return f"HEX(CONVERT({quote(c.name)} USING utf8mb4))"
    return f"HEX(CAST({quote(c.name)} AS CHAR))"


def _typed(c: KeyColumn, expr: str) -> str:
    """``expr`` (a key column's text form) as the column's type and collation."""
    return c.cast().replace("%s", expr)


class MySQLRead:
    """One consistent-snapshot transaction; its queries are taken in turn (:meth:`shared` is this session)."""

    def __init__(self, source: MySQLVerifySource, conn: Any, position: int) -> None:
        self.source = source
        self.conn = conn
        self.before = position
        self.after = position
        self.lock = threading.Lock()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            return connection.query(self.conn, sql, tuple(params))

    def _where(self, chunk: Range) -> tuple[str, list[str]]:
        return keys.range_condition(self.source.key_columns, chunk.after, chunk.upto)

    def _from(self, columns: Sequence[tuple[str, Kind]], extra: str, chunk: Range) -> tuple[str, list[str]]:
        where, params = self._where(chunk)
        enc = encoding(columns, self.source.types)
        return f"(SELECT {enc} AS __cdc_e{extra} FROM {self.source.ident} WHERE {where}) AS __cdc_s", params

    def ranges(self, chunk_rows: int) -> list[Range]:
        s = self.source
        with self.lock:
            last = keys.last_key(self.conn, s.info, s.key_columns)
            bounds = [] if last is None else keys.next_bounds(self.conn, s.info, s.key_columns, None, last,
                                                              chunk_rows, 1 << 62)
        return ranges_between(bounds, last)

    def checksum(self, chunk: Range, columns: Sequence[tuple[str, Kind]], keys_: Sequence[str]) -> tuple[int, int]:
        order = ", ".join(quote(k) for k in keys_)
        rows, params = self._from(columns, ", " + order, chunk)
        got = self._query(f"SELECT COUNT(*), COALESCE(MD5(GROUP_CONCAT({_PIECE} ORDER BY {order} SEPARATOR '')), "
                          f"MD5('')) FROM {rows}", params)
        return int(got[0][0]), int(_text(got[0][1]), 16)

    def checksums(self, chunks: Sequence[Range], columns: Sequence[tuple[str, Kind]],
                  keys_: Sequence[str]) -> list[tuple[int, int]]:
        return [self.checksum(c, columns, keys_) for c in chunks]

    @contextmanager
    def shared(self) -> Iterator[MySQLRead]:
        yield self  # one session per read view: its queries are serialised by the lock

    def split(self, chunk: Range, rows: int, columns: Sequence[tuple[str, Kind]],
              keys_: Sequence[str]) -> list[tuple[Range, int, int]]:
        # One pass: rows numbered in key order, grouped by ``rows``, each group's digest as a chunk's; each
        # group's last key (its keys' texts, in hex, joined in key order) is its upper bound.
        order = ", ".join(quote(k) for k in keys_)
        kc = self.source.key_columns
        texts = "".join(f", {_key_text(c)} AS __cdc_k{i}" for i, c in enumerate(kc))
        rows_sql, params = self._from(columns, f", ROW_NUMBER() OVER (ORDER BY {order}) AS __cdc_rn{texts}", chunk)
        lasts = ", ".join(f"SUBSTRING_INDEX(GROUP_CONCAT(__cdc_k{i} ORDER BY __cdc_rn SEPARATOR ','), ',', -1)"
                          for i in range(len(kc)))
        got = self._query(
            f"SELECT COUNT(*), MD5(GROUP_CONCAT({_PIECE} ORDER BY __cdc_rn SEPARATOR '')), {lasts} FROM {rows_sql} "
            f"GROUP BY (__cdc_rn - 1) DIV %s ORDER BY (__cdc_rn - 1) DIV %s", [*params, rows, rows])
        out, after = [], chunk.after
        for row in got:
            upto = tuple(bytes.fromhex(_text(v)).decode() for v in row[2:])
            out.append((Range(after, upto), int(row[0]), int(_text(row[1]), 16)))
            after = upto
        return out

    def rows(self, chunk: Range, columns: Sequence[tuple[str, Kind]], keys_: Sequence[str]) -> dict[bytes, int]:
        kinds = dict(columns)
        key_enc = encoding([(k, kinds[k]) for k in keys_], self.source.types)
        rows_sql, params = self._from(columns, f", {key_enc} AS __cdc_key", chunk)
        got = self._query(f"SELECT __cdc_key, LEFT(MD5(__cdc_e), 16) FROM {rows_sql}", params)
        return {_bytes(k): int(_text(h), 16) for k, h in got}

    def show(self, chunk: Range, keys_: Sequence[tuple[str, Kind]], wanted: Sequence[bytes]) -> dict[bytes, SourceRow]:
        if not wanted:
            return {}
        s = self.source
        where, params = self._where(chunk)
        key_enc = encoding(keys_, s.types)
        names = ", ".join(quote(c) for c in s.columns)
        marks = ", ".join(["%s"] * len(wanted))
        got = self._query(f"SELECT {key_enc}, {names} FROM {s.ident} WHERE {where} AND {key_enc} IN ({marks})",
                          [*params, *wanted])
        out = {}
        for r in got:
            row = {c: _shown(s.types[c], v) for c, v in zip(s.columns, r[1:], strict=True)}
            key = [c.from_server(r[1 + s.columns.index(c.name)]) for c in s.key_columns]
            out[_bytes(r[0])] = SourceRow(key, row)
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _bytes(value: Any) -> bytes:
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else str(value).encode()


def _shown(t: ColumnType, value: Any) -> Any:
    """A value as the text protocol returns it, for a report (JSON): numbers as numbers, bytes in hex."""
    if value is None:
        return None
    if t.kind == BIT and t.size == 1:
        return any(bytes(value))
    if t.kind in (BINARY, BIT):
        return bytes(value).hex()
    text = _text(value)
    if t.kind in (INT, YEAR):
        return int(text)
    if t.kind in (FLOAT, DOUBLE):
        return float(text)
    return text


class MySQLVerifySource:
    """A MariaDB table as ``cdc verify`` reads it. ``dsn``: ``mysql://user@host[:port][/database]`` (the password
    from ``MYSQL_PWD``); ``table``: ``database.table`` (or ``table`` in the DSN's database); ``checkpoint``: the
    query's Spark checkpoint, whose last committed batch is the pipeline's committed position (None: unknown);
    ``source_index``: which source of that query reads this table."""

    def __init__(self, dsn: str, table: str, checkpoint: str | None = None, exclude: Sequence[str] = (),
                 source_index: int = 0) -> None:
        try:
            self.endpoint = parse_dsn(dsn)
        except ValueError as e:
            raise VerifyError(f"--dsn: {e}") from None
        if "." not in table:
            if not self.endpoint.database:
                raise VerifyError(f"table {table!r}: name it database.table, or give the database in the DSN")
            table = f"{self.endpoint.database}.{table}"
        self.table = table
        self.checkpoint = checkpoint
        self.source_index = source_index
        self.exclude = tuple(exclude)
        self.lock = threading.Lock()
        self.conn = connection.connect(self.endpoint)
        try:
            connection.query(self.conn, "SET SESSION time_zone = '+00:00'")  # key texts in UTC, as a read's
            self._describe()
        except BaseException:
            self.conn.close()
            raise

    def _describe(self) -> None:
        version = str(connection.query(self.conn, "SELECT VERSION()")[0][0])
        if "mariadb" not in version.lower():
            raise VerifyError(
                f"cdc verify --backend mysql needs MariaDB (this server is {version}): it compares at the binary log "
                "position of a consistent snapshot (Binlog_snapshot_position), which MySQL does not report")
        try:
            self.info: TableInfo = describe_table(self.conn, self.table)
        except NoPrimaryKeyError:
            raise VerifyError(f"table {self.table!r} has no primary key: cdc verify compares rows by key, as the "
                              "pipeline writes them (add one with ALTER TABLE ... ADD PRIMARY KEY (...))") from None
        except OptionError:
            raise VerifyError(f"table {self.table!r} does not exist in the database (or is not a table, or the user "
                              "may not SELECT it)") from None
        names = [c for c, _ in self.info.columns]
        unknown = [c for c in self.exclude if c not in names]
        if unknown:
            raise VerifyError(f"--exclude: table {self.table!r} has no column {', '.join(map(repr, unknown))}")
        keyed = [c for c in self.exclude if c in self.info.keys]
        if keyed:
            raise VerifyError(f"--exclude: {', '.join(map(repr, keyed))} is a key column of {self.table!r}: rows are "
                              "compared by key, a key column cannot be left out")
        data_types = {str(r[0]): str(r[1]).lower() for r in connection.query(
            self.conn, "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
            "TABLE_NAME = %s", (self.info.database, self.info.table))}
        for name, t in self.info.columns:
            if name not in self.exclude and t.kind == BINARY and data_types.get(name) not in _BINARY_TYPES:
                raise VerifyError(
                    f"column {name!r} of {self.table!r} has type {data_types.get(name)}, which cdc verify cannot hash "
                    "in SQL as the backend carries it (its bytes): leave it out with --exclude")
        for name in self.info.keys:
            t = dict(self.info.columns)[name]
            if t.kind not in _KEY_KINDS:
                raise VerifyError(f"table {self.table!r} has primary key column {name!r} of type {t.describe()}, "
                                  "which cdc verify cannot range over (integer, decimal, date and time, text or binary "
                                  "keys)")
        self.columns = tuple(c for c in names if c not in self.exclude)
        self.types = dict(self.info.columns)
        self.keys = self.info.keys
        self.key_columns = keys.key_columns(self.conn, self.info)
        self.ident = keys.table_name(self.info)
        # A single integer key whose Delta column is an integer (not BIGINT UNSIGNED, a decimal): ordered in memory.
        self.integer_key = keys.python_ordered(self.key_columns) and len(self.keys) == 1 and pa.types.is_integer(
            self.types[self.keys[0]].arrow())
        if self.checkpoint is not None:
            self._checkpoint_position()  # a checkpoint that cannot answer is named now

    def check_kinds(self, kinds: dict[str, Kind]) -> None:
        for name, t in self.info.columns:
            if name in self.exclude:
                continue
            if kinds[name] is not _kind(t):
                raise VerifyError(f"column {name!r} of {self.table!r} ({t.describe()}) cannot be compared with a Delta "
                                  f"column of kind {kinds[name].value}: the Delta table is not this table's (or its "
                                  "type changed; cdc verify compares the single-table typed layout)")

    @contextmanager
    def read(self) -> Iterator[MySQLRead]:
        try:
            conn, position = open_snapshot(self.endpoint)
        except ServerSettingError as e:
            raise VerifyError(f"cannot take a consistent snapshot of {self.table!r}: {e}") from None
        try:
            # Long enough for any chunk's pieces (GROUP_CONCAT would silently cut them at 1 MiB).
            connection.query(conn, "SET SESSION group_concat_max_len = 4294967295")
            yield MySQLRead(self, conn, position)
        finally:
            conn.close()

    def _sort_keys(self, texts: Sequence[Sequence[str]]) -> list[tuple[Any, ...]]:
        """Keys (their columns' text forms) as tuples Python orders as the server orders the keys: numbers, dates
        and times as their values, binary strings as their bytes, text as its collation's sort key (the server's
        ``WEIGHT_STRING``)."""
        columns: list[list[Any]] = []
        for i, c in enumerate(self.key_columns):
            values = [t[i] for t in texts]
            if c.kind == TEXT:
                columns.append(self._weights(c, values))
            elif c.kind in (INT, YEAR):
                columns.append([int(v) for v in values])
            elif c.kind == DECIMAL:
                columns.append([Decimal(v) for v in values])
            elif c.kind in (DATE, DATETIME, TIMESTAMP):  # dates as midnight: one column is of one kind
                columns.append([datetime.fromisoformat(v).replace(tzinfo=None) for v in values])
            else:
                columns.append([bytes.fromhex(v) for v in values])
        return list(zip(*columns, strict=True))

    def _weights(self, c: KeyColumn, values: Sequence[str]) -> list[bytes]:
        """Each text's sort key under ``c``'s collation, from the server, a few thousand distinct texts a query."""
        distinct = sorted(set(values))
        found: dict[str, bytes] = {}
        for lo in range(0, len(distinct), _WEIGHTS_PER_QUERY):
            part = distinct[lo:lo + _WEIGHTS_PER_QUERY]
            got = self._query(f"SELECT j.ord, WEIGHT_STRING({_typed(c, 'j.v')}) FROM JSON_TABLE(%s, '$[*]' COLUMNS("
                              "ord FOR ORDINALITY, v LONGTEXT PATH '$')) AS j", [json.dumps(part)])
            found.update((part[int(o) - 1], bytes(w)) for o, w in got)
        return [found[v] for v in values]

    def _texts(self, keys_: pa.Table) -> list[tuple[str, ...]]:
        columns = [[c.text(v) for v in keys_.column(i).to_pylist()] for i, c in enumerate(self.key_columns)]
        return list(zip(*columns, strict=True))

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.lock:
            return connection.query(self.conn, sql, tuple(params))

    def assign(self, keys_: pa.Table, ranges: Sequence[Range]) -> np.ndarray:
        uppers = [r.upto for r in ranges[:-1] if r.upto is not None]
        if self.integer_key:
            bounds = np.array([int(u[0]) for u in uppers], dtype=np.int64)
            values = keys_.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            placed: np.ndarray = np.searchsorted(bounds, values, side="left").astype(np.int64)
            return placed
        # Any other key: its chunk is the number of bounds below it, in the server's order.
        sorted_bounds = self._sort_keys(uppers)
        return np.array([bisect.bisect_left(sorted_bounds, k) for k in self._sort_keys(self._texts(keys_))],
                        dtype=np.int64)

    def order(self, keys_: pa.Table) -> np.ndarray:
        if self.integer_key:
            values = keys_.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            ordered: np.ndarray = np.argsort(values, kind="stable")
            return ordered
        sort_keys = self._sort_keys(self._texts(keys_))
        return np.array(sorted(range(len(sort_keys)), key=sort_keys.__getitem__), dtype=np.int64)

    def range_filter(self, ranges: Sequence[Range]) -> ds.Expression | None:
        if not self.integer_key or not ranges:
            return None
        return integer_range_filter(self.keys[0], ranges)

    def _checkpoint_position(self) -> int:
        from cdc.checkpoint import CheckpointError, last_committed

        assert self.checkpoint is not None
        try:
            offset = last_committed(self.checkpoint).source(self.source_index)
        except CheckpointError as e:
            raise VerifyError(f"--checkpoint: {e}") from None
        entry = offset.channels.get(CHANNEL)
        if entry is None:
            raise VerifyError(f"--checkpoint {self.checkpoint!r}: source #{self.source_index} has no channel "
                              f"{CHANNEL!r} (channels: {', '.join(offset.channels)}): it is not a backend=mysql query")
        return int(entry.pos)

    def pipeline_position(self) -> int | None:
        return None if self.checkpoint is None else self._checkpoint_position()

    def close(self) -> None:
        self.conn.close()
