"""Primary keys in the server's own order: the chunked snapshot's key ranges, split points and comparisons.

Keys travel as text, one string per key column (:data:`cdc.snapshots.Key`): the server's text form of the
value, hexadecimal for binary columns. They are compared by the server, never by Python, except integer keys,
whose order Python shares: a text key under a case- and accent-insensitive collation
(``utf8mb4_general_ci``: ``a = A < b``) orders differently in Python. Every key value is bound as a parameter
and converted to its column's type and collation in SQL (``CONVERT(%s USING utf8mb4) COLLATE ...``,
``CAST(%s AS DECIMAL(10,2))``, ``UNHEX(%s)``); no value becomes SQL text.

A range ``(after, upto]`` over key columns ``k1, k2`` is written as the disjunction
``k1 > a1 OR (k1 = a1 AND k2 > a2)`` (and its ``<=`` counterpart), which the server answers from the primary
key's index (MariaDB does not plan a range scan for a row comparison ``(k1, k2) > (a1, a2)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from cdc.backends.mysql import connection
from cdc.backends.mysql.catalog import BINARY, DATE, DATETIME, DECIMAL, INT, TEXT, TIMESTAMP, YEAR, TableInfo
from cdc.errors import OptionError
from cdc.snapshots.state import Key

_SUPPORTED = frozenset({INT, YEAR, DECIMAL, DATE, DATETIME, TIMESTAMP, TEXT, BINARY})


def quote(name: str) -> str:
    """An identifier in backquotes (a name, never a value: names come from the catalog and the options)."""
    return "`" + name.replace("`", "``") + "`"


def table_name(table: TableInfo) -> str:
    return f"{quote(table.database)}.{quote(table.table)}"


@dataclass(frozen=True)
class KeyColumn:
    """A primary key column as comparisons need it."""

    name: str
    kind: str
    unsigned: bool = False
    size: int = 0
    scale: int = 0
    charset: str | None = None
    collation: str | None = None

    def cast(self) -> str:
        """A placeholder holding this column's text form, as the column's type (and collation)."""
        if self.kind in (INT, YEAR):
            return f"CAST(%s AS {'UNSIGNED' if self.unsigned else 'SIGNED'})"
        if self.kind == DECIMAL:
            return f"CAST(%s AS DECIMAL({self.size},{self.scale}))"
        if self.kind == DATE:
            return "CAST(%s AS DATE)"
        if self.kind in (DATETIME, TIMESTAMP):
            return "CAST(%s AS DATETIME(6))"
        if self.kind == BINARY:
            return "UNHEX(%s)"
        return f"CONVERT(%s USING {self.charset}) COLLATE {self.collation}"

    def text(self, value: Any) -> str:
        """A key value as a record carries it (typed, or as the JSON layout wrote it) in its text form."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).hex()
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S.%f")
        if isinstance(value, str) and self.kind in (DATETIME, TIMESTAMP):
            return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S.%f")  # the JSON layout's ISO text
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, Decimal):
            return str(value)
        return str(value)

    def from_server(self, value: Any) -> str:
        """A key value as a query without converters returns it (bytes or text) in its text form."""
        if self.kind == BINARY:
            return bytes(value).hex()
        return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def key_columns(conn: Any, table: TableInfo) -> tuple[KeyColumn, ...]:
    """The primary key's columns of ``table``; a key column of a type whose order the server's comparisons do not
    share with its index (``ENUM``, ``SET``, ``BIT``, floating point, ``TIME``, ``JSON``) is refused by name."""
    types = dict(table.columns)
    rows = {str(r[0]): (r[1], r[2]) for r in connection.query(
        conn, "SELECT COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (table.database, table.table))}
    out = []
    for name in table.keys:
        t = types[name]
        if t.kind not in _SUPPORTED:
            raise OptionError(
                f"startingOffsets=snapshot: table {table.name!r} has primary key column {name!r} of type "
                f"{t.describe()}, which a chunked snapshot cannot range over; start from 'earliest' or 'latest', "
                "or key the table on integer, decimal, date and time, text or binary columns", "startingOffsets")
        charset, collation = rows.get(name, (None, None))
        out.append(KeyColumn(name, t.kind, t.unsigned, t.size, t.scale,
                             None if charset is None else str(charset), None if collation is None else str(collation)))
    return tuple(out)


def python_ordered(columns: Sequence[KeyColumn]) -> bool:
    return all(c.kind in (INT, YEAR) for c in columns)


def _compare(columns: Sequence[KeyColumn], op: str, key: Key) -> tuple[str, list[str]]:
    """``(k1, ..., kn) <op> (key)`` as a disjunction the index answers, and its parameters; ``op`` is ``>`` or
    ``<=``."""
    strict = op.rstrip("=")
    parts: list[str] = []
    params: list[str] = []
    n = len(columns)
    for i in range(n):
        eqs = [f"{quote(c.name)} = {c.cast()}" for c in columns[:i]]
        last = columns[i]
        cmp = op if i == n - 1 else strict
        parts.append("(" + " AND ".join([*eqs, f"{quote(last.name)} {cmp} {last.cast()}"]) + ")")
        params += [*key[:i], key[i]]
    return "(" + " OR ".join(parts) + ")", params


def range_condition(columns: Sequence[KeyColumn], after: Key | None, upto: Key | None) -> tuple[str, list[str]]:
    """``key > after AND key <= upto`` in the server's order, and its parameters."""
    parts: list[str] = []
    params: list[str] = []
    for op, key in ((">", after), ("<=", upto)):
        if key is not None:
            cond, p = _compare(columns, op, key)
            parts.append(cond)
            params += p
    return (" AND ".join(parts) if parts else "TRUE"), params


def _order(columns: Sequence[KeyColumn], desc: bool = False) -> str:
    return ", ".join(quote(c.name) + (" DESC" if desc else "") for c in columns)


def _select_keys(columns: Sequence[KeyColumn]) -> str:
    return ", ".join(quote(c.name) for c in columns)


def _key_of(columns: Sequence[KeyColumn], row: Sequence[Any]) -> Key:
    return tuple(c.from_server(v) for c, v in zip(columns, row, strict=True))


def next_bounds(conn: Any, table: TableInfo, columns: Sequence[KeyColumn], after: Key | None, last: Key, rows: int,
                count: int) -> list[Key]:
    """Up to ``count`` chunk upper bounds after ``after``, ``rows`` keys apart (an index scan each, in the
    connection's transaction); the last is ``last`` once fewer than ``rows`` keys remain. ``conn`` returns
    values unconverted (:func:`raw_cursor`)."""
    out: list[Key] = []
    while len(out) < count:
        cond, params = range_condition(columns, after, last)
        got = connection.query(
            conn, f"SELECT {_select_keys(columns)} FROM {table_name(table)} WHERE {cond} ORDER BY {_order(columns)} "
            f"LIMIT 1 OFFSET {int(rows) - 1}", tuple(params))
        upto = last if not got else _key_of(columns, got[0])
        out.append(upto)
        if upto == last:
            break
        after = upto
    return out


def last_key(conn: Any, table: TableInfo, columns: Sequence[KeyColumn]) -> Key | None:
    """The table's largest key in the connection's transaction (None: empty)."""
    got = connection.query(conn, f"SELECT {_select_keys(columns)} FROM {table_name(table)} ORDER BY "
                                 f"{_order(columns, desc=True)} LIMIT 1")
    return None if not got else _key_of(columns, got[0])


_CLASSIFY_KEYS = 200
"""Keys per classifying query."""


def classify(conn: Any, columns: Sequence[KeyColumn], keys: Sequence[tuple[Any, ...]],
             ranges: Sequence[tuple[Key | None, Key]]) -> tuple[list[Key], list[list[bool]]]:
    """Each key's text form and whether it lies in each range ``(after, upto]``: in Python for integer keys, else
    by the server (``conn``), one query per few hundred keys."""
    texts = [tuple(c.text(v) for v, c in zip(key, columns, strict=True)) for key in keys]
    if python_ordered(columns):
        ints = [tuple(int(v) for v in key) for key in texts]
        spans = [(None if a is None else tuple(int(v) for v in a), tuple(int(v) for v in u)) for a, u in ranges]
        return texts, [[(a is None or k > a) and k <= u for a, u in spans] for k in ints]
    flags: list[list[bool]] = []
    if not ranges:
        return texts, [[] for _ in texts]
    conds = [range_condition(columns, after, upto) for after, upto in ranges]
    tests = ", ".join(f"({cond})" for cond, _ in conds)
    test_params = [p for _, params in conds for p in params]
    held = ", ".join(f"{c.cast()} AS {quote(c.name)}" for c in columns)
    for lo in range(0, len(texts), _CLASSIFY_KEYS):
        group = texts[lo : lo + _CLASSIFY_KEYS]
        # One row per key: the ranges' tests over a one-row derived table holding the key as its columns' types.
        selects = [f"SELECT {i} AS ord, {tests} FROM (SELECT {held}) AS k" for i in range(len(group))]
        params = [p for key in group for p in (*test_params, *key)]
        got = connection.query(conn, " UNION ALL ".join(selects) + " ORDER BY ord", tuple(params))
        flags += [[bool(v) for v in row[1:]] for row in got]
    return texts, flags
