"""Primary keys in PostgreSQL's own order: the chunked snapshot's key ranges, split points and comparisons.

Keys travel as PostgreSQL's text form of each key column (:data:`cdc.snapshots.Key`) and are compared by
PostgreSQL, never by Python: a text key under a non-C collation (``en-US``: ``a < B < b``), an enum, a
``citext`` order differently in Python. Every key value is bound as a parameter (``%s::text`` cast to the
column's type) or, where a statement takes no parameters (``COPY``), set as a transaction-local setting that
the statement reads back with ``current_setting`` (still no value in the SQL text). Integer keys, whose order
Python shares, are compared in Python.

A range ``(after, upto]`` is the row comparison ``(k1, k2) > (a1, a2) AND (k1, k2) <= (u1, u2)``, which
PostgreSQL answers from the primary key's index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc.backends.postgres.catalog import BYTEA, INT2, INT4, INT8, TableInfo
from cdc.snapshots.state import Key

_INTEGERS = frozenset({INT2, INT4, INT8})


@dataclass(frozen=True)
class KeyColumn:
    """A primary key column as comparisons need it: its type as SQL (``format_type``) and its collation
    (schema and name), None for the database's default or a type without one."""

    name: str
    type_oid: int
    sql_type: str
    collation: tuple[str, str] | None

    def cast(self, value: sql.Composable) -> sql.Composable:
        """``value`` (text) as this column's type, in its collation."""
        out = sql.SQL("({})::{}").format(value, sql.SQL(self.sql_type))
        if self.collation is not None:
            out = sql.SQL("{} COLLATE {}").format(out, sql.Identifier(*self.collation))
        return out


def key_columns(conn: psycopg.Connection[Any], table: TableInfo) -> tuple[KeyColumn, ...]:
    """The primary key's columns of ``table``. PostgreSQL builds every primary key's index on its columns'
    default btree operator classes and own collations (it refuses any other index for one: "does not have
    default sorting behavior"), so ``ORDER BY`` the key and the row comparisons here walk that index."""
    schema, _, name = table.name.partition(".")
    rows = conn.execute(
        """
        SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod), cn.nspname, co.collname
        FROM pg_index i
        CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS u(attnum, ord)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND co.oid <> 100  -- 100: the database's default
        LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
        WHERE i.indrelid = (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                            WHERE n.nspname = %s AND c.relname = %s) AND i.indisprimary
        ORDER BY u.ord
        """,
        (schema, name),
    ).fetchall()
    return tuple(KeyColumn(str(column), int(oid), str(sql_type), None if coll_name is None else
                           (str(coll_schema), str(coll_name)))
                 for column, oid, sql_type, coll_schema, coll_name in rows)


def python_ordered(columns: Sequence[KeyColumn]) -> bool:
    """Python orders these keys as PostgreSQL does (integer columns only)."""
    return all(c.type_oid in _INTEGERS for c in columns)


def key_text(value: Any, column: KeyColumn) -> str:
    """A key value as a record carries it (typed, or as the JSON layout parsed it) in PostgreSQL's text form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if column.type_oid == BYTEA and isinstance(value, str):
        return value if value.startswith("\\x") else "\\x" + value  # the JSON layout writes bytea as hex
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def row(columns: Sequence[KeyColumn], table_alias: str | None = None) -> sql.Composable:
    idents = [sql.Identifier(table_alias, c.name) if table_alias else sql.Identifier(c.name) for c in columns]
    return sql.SQL("ROW({})").format(sql.SQL(", ").join(idents))


def bound(columns: Sequence[KeyColumn], values: Sequence[sql.Composable]) -> sql.Composable:
    return sql.SQL("ROW({})").format(sql.SQL(", ").join(c.cast(v) for c, v in zip(columns, values, strict=True)))


def placeholders(n: int) -> list[sql.Composable]:
    return [sql.Placeholder()] * n


def settings(prefix: str, n: int) -> list[sql.Composable]:
    """``current_setting('cdc.<prefix>_<i>')`` for each key column: a bound for statements without parameters."""
    return [sql.SQL("current_setting({})").format(sql.Literal(f"cdc.{prefix}_{i}")) for i in range(n)]


def range_condition(
    columns: Sequence[KeyColumn], after: Key | None, upto: Key | None, *, as_settings: bool = False
) -> tuple[sql.Composable, list[str]]:
    """``(key) > (after) AND (key) <= (upto)`` and its parameters (the keys' texts in order); with
    ``as_settings`` the bounds are read from the settings :func:`setting_values` names."""
    parts: list[sql.Composable] = []
    params: list[str] = []
    n = len(columns)
    for op, key, prefix in ((">", after, "after"), ("<=", upto, "upto")):
        if key is None:
            continue
        values = settings(prefix, n) if as_settings else placeholders(n)
        parts.append(sql.SQL("{} {} {}").format(row(columns), sql.SQL(op), bound(columns, values)))
        params += list(key)
    return (sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")), params


def setting_values(after: Key | None, upto: Key | None) -> list[tuple[str, str]]:
    """The (name, value) of each transaction-local setting :func:`range_condition` reads with ``as_settings``."""
    return [(f"cdc.{prefix}_{i}", value) for prefix, key in (("after", after), ("upto", upto))
            for i, value in enumerate(key or ())]


def next_bounds(
    conn: psycopg.Connection[Any], table: TableInfo, columns: Sequence[KeyColumn], after: Key | None, last: Key,
    rows: int, count: int,
) -> list[Key]:
    """Up to ``count`` chunk upper bounds after ``after``, ``rows`` keys apart (each an index scan of ``rows``
    keys, in the transaction's snapshot); the last is ``last`` once fewer than ``rows`` keys remain."""
    out: list[Key] = []
    texts = _texts(columns)
    order = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
    ident = sql.Identifier(*table.name.split(".", 1))
    while len(out) < count:
        cond, params = range_condition(columns, after, last)
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} OFFSET %s LIMIT 1").format(texts, ident, cond, order)
        got = conn.execute(query, [*params, rows - 1]).fetchone()
        upto = last if got is None else tuple(str(v) for v in got)
        out.append(upto)
        if upto == last:
            break
        after = upto
    return out


def _texts(columns: Sequence[KeyColumn]) -> sql.Composable:
    """The key columns' text forms under names of their own (``ORDER BY <column>`` must sort by the column, not
    by an output column of the same name holding its text)."""
    return sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(sql.Identifier(c.name), sql.Identifier(f"key_{i}"))
                              for i, c in enumerate(columns))


def last_key(conn: psycopg.Connection[Any], table: TableInfo, columns: Sequence[KeyColumn]) -> Key | None:
    """The table's largest key in the transaction's snapshot (None: empty)."""
    texts = _texts(columns)
    order = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c.name)) for c in columns)
    got = conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY {} LIMIT 1").format(
        texts, sql.Identifier(*table.name.split(".", 1)), order)).fetchone()
    return None if got is None else tuple(str(v) for v in got)


def classify(
    conn: psycopg.Connection[Any] | None, columns: Sequence[KeyColumn], keys: Sequence[tuple[Any, ...]],
    ranges: Sequence[tuple[Key | None, Key]],
) -> tuple[list[Key], list[list[bool]]]:
    """Each key's text form and whether it lies in each range ``(after, upto]``: in Python for integer keys,
    else in one query (``conn``) that casts the keys to their columns' types and compares them there."""
    texts = [tuple(key_text(v, c) for v, c in zip(key, columns, strict=True)) for key in keys]
    if python_ordered(columns):
        ints = [tuple(int(v) for v in key) for key in keys]
        spans = [(None if a is None else tuple(int(v) for v in a), tuple(int(v) for v in u)) for a, u in ranges]
        return texts, [[(a is None or k > a) and k <= u for a, u in spans] for k in ints]
    assert conn is not None
    n = len(columns)
    names = [sql.Identifier(f"t{i}") for i in range(n)]
    keyed = sql.SQL(", ").join(c.cast(sql.SQL("u.{}").format(nm)) + sql.SQL(" AS {}").format(sql.Identifier(c.name))
                               for c, nm in zip(columns, names, strict=True))
    conds: list[sql.Composable] = []
    params: list[Any] = []
    for after, upto in ranges:
        cond, p = range_condition(columns, after, upto)
        conds.append(cond)
        params += p
    tests = sql.SQL("").join(sql.SQL(", {}").format(c) for c in conds)
    query = sql.SQL(
        "SELECT {texts}{tests} FROM unnest({arrays}) WITH ORDINALITY AS u({names}, ord) "
        "CROSS JOIN LATERAL (SELECT {keyed}) k ORDER BY u.ord"
    ).format(
        texts=sql.SQL(", ").join(sql.SQL("k.{}::text").format(sql.Identifier(c.name)) for c in columns),
        tests=tests,
        arrays=sql.SQL(", ").join([sql.SQL("%s::text[]")] * n),
        names=sql.SQL(", ").join(names),
        keyed=keyed,
    )
    arrays = [[t[i] for t in texts] for i in range(n)]
    got = conn.execute(query, [*params, *arrays]).fetchall()
    return [tuple(str(v) for v in r[:n]) for r in got], [[bool(v) for v in r[n:]] for r in got]
