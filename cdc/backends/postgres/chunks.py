"""Reading a table's rows at an exported snapshot: the executor side of both snapshot modes.

A connection imports the snapshot (``SET TRANSACTION SNAPSHOT`` in a ``REPEATABLE READ READ ONLY``
transaction: one chunk's read long) and reads the rows of a condition: a typed table through the ADBC PostgreSQL
driver, which turns ``COPY``'s binary format into Arrow columns in C (no Python per row or value), a table of
the JSON layout through a cursor. The rows become change records
``_op = snapshot`` with the ``_seq`` their snapshot's rule gives.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from cdc.backends.postgres import connection
from cdc.backends.postgres.catalog import NUMERIC, TIMESTAMP, TableInfo, arrow_type
from cdc.backends.postgres.pgoutput import Column, Relation
from cdc.backends.postgres.records import Layout, Record
from cdc.errors import MalformedRecordError
from cdc.model import Op
from cdc.snapshots.rows import meta_column as _column


def relation(table: TableInfo) -> Relation:
    schema, _, name = table.name.partition(".")
    cols = tuple(Column(n, oid, mod, n in table.keys) for n, oid, mod in table.columns)
    return Relation(0, schema, name, cols)


def select_column(column: tuple[str, int, int], typed: bool) -> sql.Composable:
    name, oid, typmod = column
    ident = sql.Identifier(name)
    # NUMERIC as text too: the server's own formatting and Arrow's cast to decimal take half the client CPU of
    # the ADBC driver's binary NUMERIC decoding (0.26 against 0.51 core-s per million rows of a table with one
    # NUMERIC column), and the values are the same text either way.
    if not typed or oid == NUMERIC or pa.types.is_string(arrow_type(oid, typmod)):
        return sql.SQL("{}::text").format(ident)
    if oid == TIMESTAMP:
        return sql.SQL("{} AT TIME ZONE 'UTC'").format(ident)
    return ident


# The earliest day and microsecond PostgreSQL stores (4714-11-24 BC) in Arrow's units since 1970. The ADBC
# driver moves PostgreSQL's binary values (counted from 2000) to 1970 without an overflow check, so 'infinity',
# '-infinity' and values past Arrow's range (a timestamp after 294247 AD) arrive wrapped around, below these.
_FIRST_DAY = -2_440_588
_FIRST_MICROSECOND = _FIRST_DAY * 86_400_000_000


def read_arrow(dsn: str, snapshot: str | None, table: TableInfo, where: sql.Composable, settings: Sequence[tuple[str, str]],
               schema: pa.Schema) -> pa.Table:
    """The rows of ``where`` in a typed table as of the exported ``snapshot`` (None: as of the read's start),
    through the ADBC PostgreSQL driver:
    the server sends ``COPY``'s binary format and the driver builds the Arrow columns in C (no text to format
    or parse, no Python per row or value). ``where`` reads its bounds from the transaction-local ``settings``
    (name, value), bound as parameters: a ``COPY`` takes none, and values never become SQL text."""
    cols = sql.SQL(", ").join(sql.SQL("{} AS {}").format(select_column(c, True), sql.Identifier(c[0]))
                              for c in table.columns)
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(cols, sql.Identifier(*table.name.split(".", 1)), where)
    pairs = [("application_name", "cdc-tunnel"), *settings]
    with _connect(dsn) as conn, conn.cursor() as cur:  # not autocommit: the statements share a transaction
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if snapshot is not None:
            cur.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)).as_string(None))
        calls = ", ".join(f"set_config(${2 * i + 1}, ${2 * i + 2}, true)" for i in range(len(pairs)))
        cur.execute(f"SELECT {calls}", parameters=[v for pair in pairs for v in pair])
        cur.fetchall()
        cur.execute(query.as_string(None))
        data = cur.fetch_arrow_table()
        conn.rollback()
    return pa.table({name: _typed(table, name, data.column(name), schema.field(name).type) for name in data.column_names})


_DATABASES: dict[str, Any] = {}
_DATABASES_LOCK = threading.Lock()


def _connect(dsn: str) -> Any:
    """An ADBC DB-API connection to ``dsn`` (not autocommit). The driver's database object, whose set-up reads the
    server's type catalog (~25 ms, against ~3 ms for a connection from it), is made once per process and shared
    by the connections; it holds no server connection of its own."""
    import adbc_driver_manager
    import adbc_driver_postgresql
    from adbc_driver_manager import dbapi

    shared_type = getattr(dbapi, "_SharedDatabase", None)
    if shared_type is None:  # another driver manager: a database per connection, as its connect() makes them
        import adbc_driver_postgresql.dbapi

        return adbc_driver_postgresql.dbapi.connect(dsn)
    with _DATABASES_LOCK:
        shared = _DATABASES.get(dsn)
        if shared is None:
            shared = _DATABASES[dsn] = shared_type(adbc_driver_postgresql.connect(dsn))
    return dbapi.Connection(shared, adbc_driver_manager.AdbcConnection(shared._db))  # shares it: a reference


def _typed(table: TableInfo, name: str, column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """A column as the driver gave it, in the layout's type; a value the type cannot hold fails naming it."""
    if isinstance(column.type, pa.ExtensionType):  # numeric: text the driver marks as PostgreSQL's
        column = pa.chunked_array([c.storage for c in column.chunks], column.type.storage_type)
    first = _FIRST_DAY if pa.types.is_date32(column.type) else (
        _FIRST_MICROSECOND if pa.types.is_timestamp(column.type) else None)
    if first is not None and column.null_count < len(column):
        low = pc.min(column.cast(pa.int32() if pa.types.is_date32(column.type) else pa.int64())).as_py()
        if low < first:
            raise MalformedRecordError(
                f"column {name!r} of table {table.name} holds 'infinity', '-infinity' or a value past the range "
                f"of {target} (Arrow's, and Spark's): exclude the column or cap its values")
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise MalformedRecordError(f"column {name!r} of table {table.name}: a value does not fit {target} "
                                   f"({exc})") from None


def typed_batch(
    schema: pa.Schema, rows: list[tuple[Any, ...]], channel: str, first: int, seq: int, when: datetime
) -> pa.RecordBatch:
    n = len(rows)
    meta = {
        "_op": pa.array([Op.SNAPSHOT.value] * n, pa.string()),
        "_seq": pa.array([seq] * n, pa.int64()),
        "_commit_ts": pa.array([when] * n, pa.timestamp("us", tz="UTC")),
        "_channel": pa.array([channel] * n, pa.string()),
        "_position": pa.array(range(first, first + n), pa.int64()),
    }
    columns = iter(zip(*rows, strict=True)) if rows else iter(())
    arrays = []
    for f in schema:
        given = _column(f, meta, n)
        arrays.append(given if given is not None else pa.array(next(columns, [None] * 0), type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@contextmanager
def at_snapshot(dsn: str, snapshot: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a read-only transaction that sees exactly the exported ``snapshot``."""
    with connection.connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        try:
            yield conn
        finally:
            if not conn.closed:
                conn.execute("COMMIT")


def reads_arrow(layout: Layout, table: TableInfo) -> bool:
    """Whether the table's rows are read through :func:`read_arrow` (the typed layout) rather than a cursor."""
    return layout.typed


def fetch_rows(
    conn: psycopg.Connection[Any], layout: Layout, table: TableInfo, where: sql.Composable, params: Sequence[Any],
    channel: str, seq: int, when: datetime,
) -> pa.Table:
    """The rows of ``where`` (with bound ``params``) through a cursor, as snapshot records."""
    schema = layout.arrow_schema()
    typed = layout.typed
    cols = sql.SQL(", ").join(select_column(c, typed) for c in table.columns)
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(cols, sql.Identifier(*table.name.split(".", 1)), where)
    rel = relation(table)
    batches: list[pa.RecordBatch] = []
    rows = 0
    with conn.cursor(binary=typed) as cur:
        cur.execute(query, list(params))
        while True:
            got = cur.fetchmany(50_000)
            if not got:
                break
            if typed:
                batches.append(typed_batch(schema, got, channel, rows, seq, when))
            else:
                records = [Record(Op.SNAPSHOT, rows + i, when, rel, tuple(None if v is None else v.encode() for v in row))
                           for i, row in enumerate(got)]
                batches.append(layout.batch(records, channel, seq=seq))
            rows += len(got)
    return pa.Table.from_batches(batches, schema=schema)


def now() -> datetime:
    return datetime.now(UTC)
