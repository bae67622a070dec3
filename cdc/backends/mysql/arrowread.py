"""A chunk read by ``connectorx`` (Rust: the server's binary protocol straight into Arrow), at a consistent
snapshot of its own.

``connectorx`` opens its own connection, so it cannot read in the driver's cut: it starts ``START TRANSACTION
WITH CONSISTENT SNAPSHOT`` on that connection and the query returns the snapshot's ``Binlog_snapshot_file``
and ``Binlog_snapshot_position`` (MariaDB's session status, read in the same transaction) beside the rows, so
the chunk is exact at a cut of its own, which the chunk's file records (:mod:`.snapshot`: the next batch holds
back the chunk's changes up to it). The position comes from a one-row derived table the table is left-joined
to, so an empty chunk still returns it (a primary key column is never null: a row with a null key is that row
alone).

``connectorx`` takes no parameters, so the key bounds would be SQL text: only integer keys are read here, each
bound rendered by Python's ``int()`` (digits and a sign, nothing else); other keys stay on PyMySQL. Columns
whose Arrow form from ``connectorx`` is not exact are rewritten in SQL: ``DECIMAL`` and ``TIME`` as their text
(``CAST(... AS CHAR)``: rust_decimal holds 28 digits, chrono no negative or 838-hour times), zero and
impossible dates as null (chrono has no zero date), ``BIT(1)`` as ``<> 0``; every column is then cast in Arrow
to its :meth:`~.catalog.ColumnType.arrow` type, which is exact for each (checked by the every-type tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote as url_quote

import pyarrow as pa
import pyarrow.compute as pc

from cdc.backends.mysql.catalog import BIT, DATE, DATETIME, DECIMAL, TIME, TIMESTAMP, ColumnType, TableInfo
from cdc.backends.mysql.keys import KeyColumn, python_ordered, quote, range_condition, table_name
from cdc.backends.mysql.options import Endpoint
from cdc.backends.mysql.positions import file_number, pack
from cdc.snapshots.state import Key

PRE_QUERIES = ("SET SESSION time_zone = '+00:00'", "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
               "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
_STATUS = "(SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = '{}')"


def available() -> bool:
    try:
        import connectorx  # noqa: F401
    except ImportError:
        return False
    return True


def usable(columns: Sequence[KeyColumn]) -> bool:
    """Whether a table keyed on ``columns`` can be read here: integer keys only (their bounds become SQL text)."""
    return python_ordered(columns) and available()


def _valid_date(c: str) -> str:
    return f"YEAR({c}) >= 1 AND MONTH({c}) >= 1 AND DAYOFMONTH({c}) BETWEEN 1 AND DAYOFMONTH(LAST_DAY({c}))"


def expression(name: str, t: ColumnType) -> str:
    """The column as the query selects it (see the module's rewrites)."""
    c = "t." + quote(name)
    if t.kind in (DECIMAL, TIME):
        return f"CAST({c} AS CHAR)"
    if t.kind in (DATE, DATETIME, TIMESTAMP):
        return f"IF({_valid_date(c)}, {c}, NULL)"
    if t.kind == BIT and t.size == 1:
        return f"({c} <> 0)"
    return c


def _literal_condition(columns: Sequence[KeyColumn], after: Key | None, upto: Key) -> str:
    """``range_condition`` with each integer bound as a literal rendered by ``int()``."""
    cond, params = range_condition(columns, after, upto)
    pieces = cond.split("%s")
    if len(pieces) != len(params) + 1:  # a key column's name holding "%s"
        raise ValueError("key column names hold '%s'")
    out = [pieces[0]]
    for value, piece in zip(params, pieces[1:], strict=True):
        out += [str(int(value)), piece]
    return "".join(out)


def _url(endpoint: Endpoint) -> str:
    args = endpoint.connect_args()
    user, password = url_quote(str(args["user"]), safe=""), url_quote(str(args["password"] or ""), safe="")
    login = f"{user}:{password}" if password else user
    return f"mysql://{login}@{endpoint.host}:{endpoint.port}/{url_quote(endpoint.database or '', safe='')}"


def _column(raw: pa.ChunkedArray, t: ColumnType) -> pa.ChunkedArray:
    target = t.arrow()
    if t.kind == BIT and t.size == 1:
        return pc.not_equal(raw.cast(pa.int64()), 0)
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(raw.type):
        return raw.cast(pa.timestamp("us")).cast(target)  # wall clock (UTC session) read as UTC
    if pa.types.is_large_binary(raw.type) and pa.types.is_string(target):
        raw = raw.cast(pa.large_string())  # checks the UTF-8
    return raw.cast(target)


def read(endpoint: Endpoint, info: TableInfo, columns: Sequence[KeyColumn], after: Key | None,
         upto: Key) -> tuple[pa.Table, int]:
    """The rows of ``(after, upto]`` (``info``'s columns, their Arrow types) at a consistent snapshot of their
    own, and its binary log position."""
    import connectorx

    cond = _literal_condition(columns, after, upto)
    exprs = [f"{expression(n, t)} AS c{j}" for j, (n, t) in enumerate(info.columns)]
    sql = (f"SELECT s.f, s.p, {', '.join(exprs)} FROM (SELECT {_STATUS.format('BINLOG_SNAPSHOT_FILE')} AS f, "
           f"{_STATUS.format('BINLOG_SNAPSHOT_POSITION')} AS p) AS s LEFT JOIN {table_name(info)} AS t ON {cond}")
    url = _url(endpoint)
    try:
        got = connectorx.read_sql(url, sql, return_type="arrow", pre_execution_query=list(PRE_QUERIES))
    except Exception as e:  # its message may quote the connection string, password included: never passed on
        password = str(endpoint.connect_args().get("password") or "")
        text = str(e).replace(url, "mysql://***")
        raise RuntimeError(text.replace(password, "***") if password else text) from None
    if got.num_rows == 0 or got.column(0)[0].as_py() in (None, ""):
        raise RuntimeError("the server did not report the consistent snapshot's binary log position")
    name, offset = got.column(0)[0].as_py(), got.column(1)[0].as_py()
    position = pack(file_number(str(name)), int(offset))
    key_at = 2 + [n for n, _ in info.columns].index(info.keys[0])
    rows = got.filter(pc.is_valid(got.column(key_at)))
    arrays = [_column(rows.column(2 + j), t) for j, (_, t) in enumerate(info.columns)]
    return pa.table(arrays, names=[n for n, _ in info.columns]), position
