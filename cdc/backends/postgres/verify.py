"""``cdc verify`` on PostgreSQL: the source side of :mod:`cdc.verify.compare`.

A read is a ``REPEATABLE READ READ ONLY`` transaction. ``before`` is ``pg_current_wal_insert_lsn()`` read just
before it begins, ``after`` the same function in its first statement (which takes the snapshot): a commit the
snapshot sees wrote its commit record before the snapshot was taken, so below ``after``. Both are packed as
the backend's positions (``lsn << 20``) so they compare with ``_seq`` and with the query's committed position,
the ``confirmed_flush_lsn`` of its replication slot (the slot moves only when Spark commits a batch, after the
sink committed it).

Chunks come from the chunked snapshot's chunker (:func:`cdc.backends.postgres.keys.next_bounds`: index scans
of ``chunk_rows`` keys in the primary key's order). A chunk's checksum is one aggregate over the key range,
``count(*)`` and ``sum`` of the first 8 bytes of ``md5`` of each row's canonical encoding
(:mod:`cdc.verify.canonical`) built by SQL expressions over the columns. Key bounds are bound parameters;
nothing from the data becomes SQL text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.dataset as ds
from psycopg import sql

from cdc.backends.postgres import catalog, connection, keys
from cdc.backends.postgres.catalog import BYTEA, FLOAT4, TIMESTAMP, TIMESTAMPTZ, TableInfo, arrow_type
from cdc.backends.postgres.errors import NoPrimaryKeyError
from cdc.backends.postgres.positions import pack, parse_lsn
from cdc.errors import OptionError
from cdc.verify.canonical import MOD, PREFIXED, SHORT, Kind, kind_of
from cdc.verify.compare import Range, SourceRow, VerifyError, integer_range_filter, ranges_between


def _value(column: str, kind: Kind, type_oid: int) -> sql.Composable:
    """The column's canonical bytes of ``kind`` as a SQL text expression (binary columns: bytea)."""
    c = sql.Identifier(column)
    if kind is Kind.FLOAT64:
        # A real compares as double precision where the layout carried its text form into a double (JSON).
        value = sql.SQL("{}::text::float8").format(c) if type_oid == FLOAT4 else c
        return sql.SQL("(('x' || encode(float8send({}), 'hex'))::bit(64)::bigint)::text").format(value)
    if kind is Kind.FLOAT32:
        return sql.SQL("(('x' || encode(float4send({}), 'hex'))::bit(32)::int)::text").format(c)
    if kind is Kind.DATE:
        return sql.SQL("({} - DATE '1970-01-01')::text").format(c)
    if kind is Kind.TIMESTAMP:
        # date_part's double holds any timestamp of years 1677-2262 to well under a microsecond, so rounding
        # is exact (extract's numeric is too, and several times slower); a timestamp without time zone is read
        # as UTC, as the backend does.
        return sql.SQL("round(date_part('epoch', {}) * 1000000)::bigint::text").format(c)
    if kind is Kind.BINARY:
        return c
    # Text: the value's text form, as the typed layout carries it; the many-table (JSON) layout writes
    # timestamps in ISO 8601 (Python's isoformat of the UTC time) and bytea in hex.
    if type_oid in (TIMESTAMP, TIMESTAMPTZ):
        utc = sql.SQL("({} AT TIME ZONE 'UTC')").format(c) if type_oid == TIMESTAMPTZ else c
        return sql.SQL("to_char({u}, 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN mod(date_part('microseconds', {u})::bigint, "
                       "1000000) <> 0 THEN to_char({u}, '.US') ELSE '' END || '+00:00'").format(u=utc)
    if type_oid == BYTEA:
        return sql.SQL("encode({}, 'hex')").format(c)
    return sql.SQL("{}::text").format(c)


def encoding(columns: Sequence[tuple[str, Kind]], types: Mapping[str, int]) -> sql.Composable:
    """The canonical encoding of ``columns`` (text, or bytea when a column is binary)."""
    binary = any(k is Kind.BINARY for _, k in columns)
    pieces = []
    for name, kind in columns:
        v = _value(name, kind, types[name])
        if kind is Kind.BINARY:
            template = "coalesce(convert_to(octet_length({v})::text || ':', 'UTF8') || {v}, '\\x4e'::bytea)"
        elif kind in PREFIXED:
            template = "coalesce(octet_length({v})::text || ':' || {v}, 'N')"
        else:
            template = "coalesce({v} || ',', 'N')"
        piece = sql.SQL(template).format(v=v)
        if binary and kind is not Kind.BINARY:
            piece = sql.SQL("convert_to({}, 'UTF8')").format(piece)
        pieces.append(piece)
    if not pieces:
        return sql.SQL("''")
    return sql.SQL("({})").format(sql.SQL(" || ").join(pieces))


def _piece(columns: Sequence[tuple[str, Kind]]) -> sql.Composable:
    """A row's piece of a digest (:func:`cdc.verify.canonical.chunk_digests`) from its encoding ``__cdc_e``."""
    if any(k is Kind.BINARY for _, k in columns):
        template = ("CASE WHEN octet_length(__cdc_e) > {short} THEN convert_to('H' || md5(__cdc_e), 'UTF8') "
                    "ELSE '\\x52'::bytea || __cdc_e END")
    else:
        template = "CASE WHEN octet_length(__cdc_e) > {short} THEN 'H' || md5(__cdc_e) ELSE 'R' || __cdc_e END"
    return sql.SQL(template).format(short=sql.Literal(SHORT))


def _joined(columns: Sequence[tuple[str, Kind]], order: sql.Composable) -> sql.Composable:
    """The pieces ``p`` concatenated (bytea when a column is binary)."""
    empty = "''::bytea" if any(k is Kind.BINARY for _, k in columns) else "''"
    return sql.SQL("string_agg(p, {}{})").format(sql.SQL(empty), order)


def _hash(columns: Sequence[tuple[str, Kind]], types: Mapping[str, int]) -> sql.Composable:
    return sql.SQL("('x' || left(md5({}), 16))::bit(64)::bigint").format(encoding(columns, types))


class PostgresRead:
    def __init__(self, source: PostgresVerifySource, conn: psycopg.Connection[Any], before: int, after: int) -> None:
        self.source = source
        self.conn = conn
        self.before = before
        self.after = after

    def ranges(self, chunk_rows: int) -> list[Range]:
        s = self.source
        last = keys.last_key(self.conn, s.info, s.key_columns)
        bounds = [] if last is None else keys.next_bounds(self.conn, s.info, s.key_columns, None, last, chunk_rows,
                                                          1 << 62)
        return ranges_between(bounds, last)

    def split(self, chunk: Range, rows: int, columns: Sequence[tuple[str, Kind]],
              keys_: Sequence[str]) -> list[tuple[Range, int, int]]:
        # One index-ordered pass: rows numbered in key order, grouped by ``rows``, each group's digest as a
        # chunk's (its pieces in key order); each group's last key is its upper bound.
        where, params = self._where(chunk)
        n = len(keys_)
        order = sql.SQL(", ").join(sql.Identifier(k) for k in keys_)
        names = [sql.Identifier(f"key_{i}") for i in range(n)]
        texts = sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(sql.Identifier(k), nm)
                                   for k, nm in zip(keys_, names, strict=True))
        lasts = sql.SQL(", ").join(sql.SQL("(array_agg({} ORDER BY rn DESC))[1]").format(nm) for nm in names)
        query = sql.SQL(
            "SELECT count(*), md5({joined}), {lasts} FROM (SELECT rn, (rn - 1) / %s AS b, p, {names} FROM ("
            "SELECT row_number() OVER (ORDER BY {order}) AS rn, {piece} AS p, {texts} FROM {table}, "
            "LATERAL (SELECT {enc} AS __cdc_e) AS __cdc_x WHERE {where}) n) s GROUP BY b ORDER BY b"
        ).format(joined=_joined(columns, sql.SQL(" ORDER BY rn")), lasts=lasts, order=order, piece=_piece(columns),
                 enc=encoding(columns, self.source.types), texts=texts, table=self.source.ident, where=where,
                 names=sql.SQL(", ").join(names))
        out, after = [], chunk.after
        for row in self.conn.execute(query, [rows, *params]):
            upto = tuple(str(v) for v in row[2:2 + n])
            out.append((Range(after, upto), int(row[0]), int(str(row[1]), 16)))
            after = upto
        return out

    def _where(self, chunk: Range) -> tuple[sql.Composable, list[str]]:
        return keys.range_condition(self.source.key_columns, chunk.after, chunk.upto)

    def checksum(self, chunk: Range, columns: Sequence[tuple[str, Kind]], keys_: Sequence[str]) -> tuple[int, int]:
        # The rows' pieces in key order (an index scan of the range) into one string and one MD5. string_agg
        # takes its input in the subquery's order: the transaction runs no parallel plan, which could reorder it.
        where, params = self._where(chunk)
        query = sql.SQL(
            "SELECT count(*), coalesce(md5({joined}), md5('')) FROM (SELECT {piece} AS p FROM {table}, "
            "LATERAL (SELECT {enc} AS __cdc_e) AS __cdc_x WHERE {where} ORDER BY {order}) AS __cdc_s"
        ).format(joined=_joined(columns, sql.SQL("")), piece=_piece(columns), table=self.source.ident,
                 enc=encoding(columns, self.source.types), where=where,
                 order=sql.SQL(", ").join(sql.Identifier(k) for k in keys_))
        got = self.conn.execute(query, params).fetchone()
        assert got is not None
        return int(got[0]), int(str(got[1]), 16)

    @contextmanager
    def shared(self) -> Iterator[PostgresRead]:
        """Another session at this read's snapshot (``pg_export_snapshot``)."""
        got = self.conn.execute("SELECT pg_export_snapshot()").fetchone()
        assert got is not None
        with connection.connect(self.source.dsn) as other:
            other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                # The snapshot's name is the server's, not data.
                other.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(str(got[0]))))
                _settings(other)
                yield PostgresRead(self.source, other, self.before, self.after)
            finally:
                if not other.closed:
                    other.execute("ROLLBACK")

    def checksums(self, chunks: Sequence[Range], columns: Sequence[tuple[str, Kind]],
                  keys_: Sequence[str]) -> list[tuple[int, int]]:
        # Two sessions at the read's snapshot: each computes every other chunk.
        if len(chunks) < 4:
            return [self.checksum(c, columns, keys_) for c in chunks]
        with self.shared() as helper, ThreadPoolExecutor(max_workers=1) as pool:
            odd = pool.submit(lambda: [helper.checksum(c, columns, keys_) for c in chunks[1::2]])
            even = [self.checksum(c, columns, keys_) for c in chunks[0::2]]
            odds = odd.result()
        out = [x for pair in zip(even, odds, strict=False) for x in pair]
        return out + even[len(odds):]

    def rows(self, chunk: Range, columns: Sequence[tuple[str, Kind]], keys_: Sequence[str]) -> dict[bytes, int]:
        kinds = dict(columns)
        where, params = self._where(chunk)
        query = sql.SQL("SELECT {}, {} FROM {} WHERE {}").format(
            encoding([(k, kinds[k]) for k in keys_], self.source.types), _hash(columns, self.source.types), self.source.ident, where)
        return {_bytes(enc): int(h) % MOD for enc, h in self.conn.execute(query, params)}

    def show(self, chunk: Range, keys_: Sequence[tuple[str, Kind]], wanted: Sequence[bytes]) -> dict[bytes, SourceRow]:
        if not wanted:
            return {}
        binary = any(k is Kind.BINARY for _, k in keys_)
        key_enc = encoding(keys_, self.source.types)
        where, params = self._where(chunk)
        query = sql.SQL("SELECT {}, {}, to_jsonb(__cdc_row) FROM {} AS __cdc_row WHERE {} AND {} = ANY(%s)").format(
            key_enc, sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k, _ in keys_),
            self.source.ident, where, key_enc)
        values = list(wanted) if binary else [w.decode() for w in wanted]
        n = len(keys_)
        return {_bytes(r[0]): SourceRow(list(r[1:1 + n]), dict(r[1 + n]))
                for r in self.conn.execute(query, [*params, values])}


def _bytes(value: Any) -> bytes:
    return bytes(value) if isinstance(value, (bytes, memoryview)) else str(value).encode()


class PostgresVerifySource:
    """A PostgreSQL table as ``cdc verify`` reads it; ``slot``: the query's replication slot, whose confirmed
    position is the pipeline's committed position (None: unknown)."""

    def __init__(self, dsn: str, table: str, slot: str | None = None, exclude: Sequence[str] = ()) -> None:
        self.dsn = dsn
        self.table = table if "." in table else f"public.{table}"
        self.slot = slot
        self.exclude = tuple(exclude)
        self.conn = connection.connect(dsn)
        try:
            self._describe()
        except BaseException:
            self.conn.close()
            raise

    def _describe(self) -> None:
        encoding_ = self.conn.execute("SHOW server_encoding").fetchone()
        if encoding_ is None or str(encoding_[0]).upper() not in ("UTF8", "SQL_ASCII"):
            raise VerifyError(f"database encoding {encoding_!r}: cdc verify compares UTF-8 text (a UTF8 database)")
        try:
            self.info: TableInfo = catalog.describe(self.conn, self.table)
        except NoPrimaryKeyError:
            raise VerifyError(f"table {self.table!r} has no primary key: cdc verify compares rows by key, as the "
                              "pipeline writes them (add one with ALTER TABLE ... ADD PRIMARY KEY)") from None
        except OptionError:
            raise VerifyError(f"table {self.table!r} does not exist in the database (or is not a table)") from None
        names = [c[0] for c in self.info.columns]
        unknown = [c for c in self.exclude if c not in names]
        if unknown:
            raise VerifyError(f"--exclude: table {self.table!r} has no column {', '.join(map(repr, unknown))}")
        keyed = [c for c in self.exclude if c in self.info.keys]
        if keyed:
            raise VerifyError(f"--exclude: {', '.join(map(repr, keyed))} is a key column of {self.table!r}: rows are "
                              "compared by key, a key column cannot be left out")
        self.columns = tuple(c for c in names if c not in self.exclude)
        self.types = {name: oid for name, oid, _ in self.info.columns}
        self.keys = self.info.keys
        self.key_columns = keys.key_columns(self.conn, self.info)
        self.ident = sql.Identifier(*self.table.split(".", 1))
        if self.slot is not None and connection.state(self.conn, self.slot) is None:
            raise VerifyError(f"no replication slot {self.slot!r} in the database (list them with cdc postgres slots)")

    def check_kinds(self, kinds: dict[str, Kind]) -> None:
        # A column compares as the kind of its type as the typed layout writes it, or as text (its text form:
        # how the many-table layout carries every value).
        for name, oid, typmod in self.info.columns:
            if name in self.exclude:
                continue
            kind = kinds[name]
            if kind not in (Kind.TEXT, kind_of(arrow_type(oid, typmod))) and (oid, kind) != (FLOAT4, Kind.FLOAT64):
                raise VerifyError(f"column {name!r} of {self.table!r} cannot be compared with a Delta column of "
                                  f"kind {kind.value}: the Delta table is not this table's (or its type changed)")

    @contextmanager
    def read(self) -> Iterator[PostgresRead]:
        with connection.connect(self.dsn) as conn:
            before = _insert_lsn(conn)
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                after = _insert_lsn(conn)
                _settings(conn)
                yield PostgresRead(self, conn, pack(before), pack(after))
            finally:
                if not conn.closed:
                    conn.execute("ROLLBACK")

    def assign(self, keys_: pa.Table, ranges: Sequence[Range]) -> np.ndarray:
        uppers = [r.upto for r in ranges[:-1]]
        if keys.python_ordered(self.key_columns) and len(self.key_columns) == 1:
            bounds = np.array([int(u[0]) for u in uppers if u is not None], dtype=np.int64)
            values = keys_.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            placed: np.ndarray = np.searchsorted(bounds, values, side="left").astype(np.int64)
            return placed
        # Any other key: PostgreSQL places each key (its text form, cast to the column's type and collation)
        # among the bounds: its chunk is the number of bounds below it.
        n = len(self.key_columns)
        texts = [[keys.key_text(v, c) for v in keys_.column(i).to_pylist()] for i, c in enumerate(self.key_columns)]
        bound_texts = [[u[i] for u in uppers if u is not None] for i in range(n)]
        k_names = [sql.Identifier(f"k{i}") for i in range(n)]
        b_names = [sql.Identifier(f"b{i}") for i in range(n)]

        def typed(alias: str, names: list[sql.Identifier]) -> sql.Composable:
            return sql.SQL("ROW({})").format(sql.SQL(", ").join(
                c.cast(sql.SQL("{}.{}").format(sql.Identifier(alias), nm)) for c, nm in zip(self.key_columns, names, strict=True)))

        arrays = sql.SQL(", ").join([sql.SQL("%s::text[]")] * n)
        query = sql.SQL(
            "SELECT (SELECT count(*) FROM unnest({arrays}) AS b({bn}) WHERE {bt} < {kt}) "
            "FROM unnest({arrays}) WITH ORDINALITY AS k({kn}, ord) ORDER BY k.ord"
        ).format(arrays=arrays, bn=sql.SQL(", ").join(b_names), kn=sql.SQL(", ").join(k_names),
                 bt=typed("b", b_names), kt=typed("k", k_names))
        got = self.conn.execute(query, [*bound_texts, *texts]).fetchall()
        return np.array([int(r[0]) for r in got], dtype=np.int64)

    def order(self, keys_: pa.Table) -> np.ndarray:
        if keys.python_ordered(self.key_columns) and len(self.key_columns) == 1:
            values = keys_.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            ordered: np.ndarray = np.argsort(values, kind="stable")
            return ordered
        # Any other key: PostgreSQL sorts the keys (their text forms cast to the columns' types and collations).
        n = len(self.key_columns)
        texts = [[keys.key_text(v, c) for v in keys_.column(i).to_pylist()] for i, c in enumerate(self.key_columns)]
        names = [sql.Identifier(f"k{i}") for i in range(n)]
        typed = sql.SQL(", ").join(c.cast(sql.SQL("k.{}").format(nm)) for c, nm in zip(self.key_columns, names, strict=True))
        query = sql.SQL("SELECT ord - 1 FROM unnest({}) WITH ORDINALITY AS k({}, ord) ORDER BY {}").format(
            sql.SQL(", ").join([sql.SQL("%s::text[]")] * n), sql.SQL(", ").join(names), typed)
        return np.array([int(r[0]) for r in self.conn.execute(query, texts).fetchall()], dtype=np.int64)

    def range_filter(self, ranges: Sequence[Range]) -> ds.Expression | None:
        # Only a single integer key is ordered by Arrow as PostgreSQL orders it (text sorts by a collation).
        if not (keys.python_ordered(self.key_columns) and len(self.key_columns) == 1) or not ranges:
            return None
        return integer_range_filter(self.keys[0], ranges)

    def pipeline_position(self) -> int | None:
        if self.slot is None:
            return None
        st = connection.state(self.conn, self.slot)
        return None if st is None else pack(st.confirmed_lsn)

    def close(self) -> None:
        self.conn.close()


def _settings(conn: psycopg.Connection[Any]) -> None:
    """The read's settings: text forms in UTC and ISO dates; no parallel plan (string_agg must take its input
    in the order of the key-ordered scan)."""
    conn.execute("SET LOCAL timezone = 'UTC'")
    conn.execute("SET LOCAL datestyle = 'ISO, YMD'")
    conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")


def _insert_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))
