"""Reading a table's rows at an exported snapshot: the executor side of both snapshot modes.

A connection imports the snapshot (``SET TRANSACTION SNAPSHOT`` in a ``REPEATABLE READ READ ONLY``
transaction: one chunk's read long) and reads the rows of a condition: a typed table without ``bytea`` columns
through ``COPY ... TO STDOUT (FORMAT csv)`` parsed by Arrow's C++ CSV reader (no Python per row or value),
others through a binary cursor whose values psycopg's C loaders decode. The rows become change records
``_op = snapshot`` with the ``_seq`` their snapshot's rule gives.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from cdc.backends.postgres import connection
from cdc.backends.postgres.catalog import BYTEA, TIMESTAMP, TableInfo, arrow_type
from cdc.backends.postgres.pgoutput import Column, Relation
from cdc.backends.postgres.records import Layout, Record
from cdc.model import Op
from cdc.snapshots.rows import meta_column as _column


def relation(table: TableInfo) -> Relation:
    schema, _, name = table.name.partition(".")
    cols = tuple(Column(n, oid, mod, n in table.keys) for n, oid, mod in table.columns)
    return Relation(0, schema, name, cols)


def select_column(column: tuple[str, int, int], typed: bool) -> sql.Composable:
    name, oid, typmod = column
    ident = sql.Identifier(name)
    if not typed or pa.types.is_string(arrow_type(oid, typmod)):
        return sql.SQL("{}::text").format(ident)
    if oid == TIMESTAMP:
        return sql.SQL("{} AT TIME ZONE 'UTC'").format(ident)
    return ident


def copy_csv(conn: Any, table: TableInfo, where: sql.Composable, schema: pa.Schema) -> pa.Table:
    """A chunk of a typed table through ``COPY ... TO STDOUT (FORMAT csv)``, parsed by Arrow's C++ CSV reader
    with the columns' types: no Python per row or value."""
    import pyarrow.csv as pacsv

    types: dict[str, pa.DataType] = {}
    for name, oid, _ in table.columns:
        # Timestamps travel in ISO text, which Arrow parses: with offsets (the session is in UTC) for
        # timestamptz, naive ones cast as UTC below (extract(epoch) would compute a numeric per value).
        types[name] = pa.timestamp("us") if oid == TIMESTAMP else schema.field(name).type
    conn.execute("SET LOCAL timezone = 'UTC'")
    conn.execute("SET LOCAL datestyle = 'ISO, YMD'")
    query = sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT (FORMAT csv)").format(
        sql.SQL(", ").join(sql.Identifier(c[0]) for c in table.columns),
        sql.Identifier(*table.name.split(".", 1)), where)
    names = [c[0] for c in table.columns]
    options = {
        "read_options": pacsv.ReadOptions(column_names=names, block_size=1 << 20),
        # PostgreSQL's CSV writes NULL as an unquoted empty field and an empty string as "": only the former
        # is null (Arrow's default markers would turn the texts 'NULL', 'NaN' or 'N/A' into nulls).
        "convert_options": pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True,
                                                quoted_strings_can_be_null=False, true_values=["t"],
                                                false_values=["f"]),
    }
    # Arrow parses while PostgreSQL still sends: the CSV flows through a pipe into the reader's own threads
    # (which release the GIL), so a chunk costs about max(COPY, parse) rather than their sum (parsing is
    # ~40% of the COPY's time: measured).
    read_end, write_end = os.pipe()

    def parse() -> pa.Table:
        with os.fdopen(read_end, "rb") as stream:  # closing it on a parse error stops the COPY below
            return pacsv.read_csv(pa.PythonFile(stream, mode="r"), **options)

    with ThreadPoolExecutor(max_workers=1) as pool:
        parsed_future = pool.submit(parse)
        sent = 0
        try:
            with os.fdopen(write_end, "wb") as pipe, conn.cursor() as cur, cur.copy(query) as copy:
                for block in copy:
                    pipe.write(block)
                    sent += len(block)
        except BrokenPipeError:
            parsed_future.result()  # the parser's error
            raise
        if not sent:
            parsed_future.cancel()
            return pa.table({n: pa.array([], type=schema.field(n).type) for n in names})
        parsed = parsed_future.result()
    return pa.table({n: parsed.column(n).cast(schema.field(n).type) for n in names})


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


def copies(layout: Layout, table: TableInfo) -> bool:
    """Whether the table's rows are read through ``COPY`` (typed, no ``bytea``) rather than a cursor."""
    return layout.typed and not any(oid == BYTEA for _, oid, _ in table.columns)


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
