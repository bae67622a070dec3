"""Rows: reads (GetRow, GetRange) and writes (put, update, delete), each write logged to its shard."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc.backends.tablestore.plainbuffer import (
    AUTO_INCREMENT,
    DELETE_ALL_VERSION,
    DELETE_ONE_VERSION,
    INCREMENT,
    Cell,
    PlainBufferError,
    PrimaryKeyValue,
    Row,
    SequenceInfo,
    decode_row,
    encode_row,
    with_sequence_info,
)

from .database import Database
from .errors import OTSError, param_invalid
from .keys import encode_key
from .limits import check_write
from .tables import Tables, check_pk

if TYPE_CHECKING:
    from .shards import Shards

ACTION_PUT, ACTION_UPDATE, ACTION_DELETE = 1, 2, 3
EPOCH = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rows(tbl TEXT NOT NULL, k BLOB NOT NULL, row BLOB NOT NULL,
    PRIMARY KEY(tbl, k)) WITHOUT ROWID;
"""


@dataclass
class WriteOp:
    """One row change of a write request, decoded and validated."""

    kind: int  # ACTION_PUT / ACTION_UPDATE / ACTION_DELETE
    row: Row
    expect: int  # 0 IGNORE, 1 EXPECT_EXIST, 2 EXPECT_NOT_EXIST
    column_condition: Callable[[dict[str, Any] | None], bool] | None = None
    return_pk: bool = False


@dataclass
class WriteResult:
    ok: bool
    primary_key: tuple[tuple[str, PrimaryKeyValue], ...] = ()
    error: OTSError | None = None


class Rows:
    """Stored rows, keyed by order-preserving primary keys (:mod:`.keys`); one version per cell."""

    def __init__(self, db: Database, tables: Tables, shards: Shards) -> None:
        self.db = db
        self.tables = tables
        self.shards = shards
        db.create(_SCHEMA)

    def drop_table(self, db: sqlite3.Connection, table: str) -> None:
        db.execute("DELETE FROM rows WHERE tbl=?", (table,))

    def count(self, table: str, lo: bytes, hi: bytes | None) -> int:
        """Rows of ``table`` with keys in ``[lo, hi)`` (``hi`` None: no upper bound)."""
        if hi is None:
            r = self.db.execute("SELECT COUNT(*) FROM rows WHERE tbl=? AND k>=?", (table, lo)).fetchone()
        else:
            r = self.db.execute(
                "SELECT COUNT(*) FROM rows WHERE tbl=? AND k>=? AND k<?", (table, lo, hi)
            ).fetchone()
        return int(r[0])

    def key_at(self, table: str, lo: bytes, hi: bytes | None, offset: int) -> bytes:
        """The key of the ``offset``-th row (from 0) in ``[lo, hi)``."""
        hi_clause, args = ("AND k<?", (hi,)) if hi is not None else ("", ())
        r = self.db.execute(
            f"SELECT k FROM rows WHERE tbl=? AND k>=? {hi_clause} ORDER BY k LIMIT 1 OFFSET ?",
            (table, lo, *args, offset),
        ).fetchone()
        return bytes(r[0])

    def split_points(self, table: str, split_bytes: int) -> list[Row]:
        """Keys that cut the table into consecutive ranges of about ``split_bytes`` (stored row sizes).

        Each point is the first key of a range after the first; a range ends at the row that makes it
        reach ``split_bytes``, so a table smaller than that has no point (one range).
        """
        with self.db.lock:
            self.tables.get(table)
            cursor = self.db.execute("SELECT row, length(row) FROM rows WHERE tbl=? ORDER BY k", (table,))
            points: list[Row] = []
            size, cut = 0, False
            for row, length in cursor:
                if cut:
                    points.append(Row(decode_row(row).primary_key))
                    size, cut = 0, False
                size += int(length)
                cut = size >= split_bytes
        return points

    def _get(self, table: str, key: bytes) -> Row | None:
        r = self.db.execute("SELECT row FROM rows WHERE tbl=? AND k=?", (table, key)).fetchone()
        return None if r is None else decode_row(r[0])

    def get_row(self, table: str, pk: Sequence[tuple[str, PrimaryKeyValue]]) -> Row | None:
        with self.db.lock:
            check_pk(self.tables.get(table), pk)
            return self._get(table, encode_key(pk))

    def get_range(
        self,
        table: str,
        start: Sequence[tuple[str, PrimaryKeyValue]],
        end: Sequence[tuple[str, PrimaryKeyValue]],
        forward: bool,
        limit: int,
    ) -> tuple[list[Row], bytes | None]:
        """Rows in ``[start, end)`` (``(end, start]`` walked backwards), at most ``limit``; and the next key."""
        with self.db.lock:
            info = self.tables.get(table)
            check_pk(info, start, bound=True)
            check_pk(info, end, bound=True)
            lo, hi = encode_key(start), encode_key(end)
            if forward:
                sql = "SELECT k, row FROM rows WHERE tbl=? AND k>=? AND k<? ORDER BY k LIMIT ?"
            else:
                sql = "SELECT k, row FROM rows WHERE tbl=? AND k<=? AND k>? ORDER BY k DESC LIMIT ?"
            found = self.db.execute(sql, (table, lo, hi, limit + 1)).fetchall()
        rows = [decode_row(r[1]) for r in found[:limit]]
        next_key = bytes(found[limit][1]) if len(found) > limit else None
        return rows, next_key

    def write(self, table: str, ops: Sequence[WriteOp]) -> list[WriteResult]:
        """Apply row changes in order, each on its own (a failed condition fails that row only)."""
        results: list[WriteResult] = []
        with self.db.txn() as db:
            info = self.tables.get(table)
            ts_us = self.shards.next_ts()
            ts_ms = ts_us // 1000
            log_rows: list[tuple[str, int, int, int, bytes]] = []
            auto_next: int | None = None
            for index, op in enumerate(ops):
                try:
                    pk = op.row.primary_key
                    check_pk(info, pk, allow_auto=op.kind == ACTION_PUT)
                    check_write(pk, op.row.cells)
                    if any(v is AUTO_INCREMENT for _, v in pk):
                        if auto_next is None:
                            auto_next = self.tables.auto_increment(db, table)
                        auto_next += 1
                        pk = tuple((n, auto_next if v is AUTO_INCREMENT else v) for n, v in pk)
                    key = encode_key(pk)
                    existing = (
                        self._get(table, key)
                        if (op.expect or op.kind == ACTION_UPDATE or op.column_condition)
                        else None
                    )
                    if op.expect == 1 and existing is None or op.expect == 2 and existing is not None:
                        raise OTSError("OTSConditionCheckFail", "Condition check failed.", 403)
                    if op.column_condition is not None and not op.column_condition(_columns(existing)):
                        raise OTSError("OTSConditionCheckFail", "Condition check failed.", 403)
                    record = self._apply(db, table, op, pk, key, existing, ts_ms)
                    shard_id = self.shards.shard_for(table, key).shard_id
                    stream_record = with_sequence_info(record, SequenceInfo(EPOCH, ts_us, index))
                    log_rows.append((shard_id, self.shards.next_seq(shard_id), ts_us, op.kind, stream_record))
                    results.append(WriteResult(True, pk))
                except OTSError as err:
                    results.append(WriteResult(False, error=err))
                except PlainBufferError as err:
                    results.append(WriteResult(False, error=param_invalid(str(err))))
            if auto_next is not None:
                self.tables.set_auto_increment(db, table, auto_next)
            self.shards.append(db, log_rows)
        return results

    def _apply(
        self,
        db: sqlite3.Connection,
        table: str,
        op: WriteOp,
        pk: tuple[tuple[str, PrimaryKeyValue], ...],
        key: bytes,
        existing: Row | None,
        ts_ms: int,
    ) -> bytes:
        """Change the stored row; return the stream record's row, encoded (without sequence info)."""
        if op.kind == ACTION_DELETE:
            db.execute("DELETE FROM rows WHERE tbl=? AND k=?", (table, key))
            return encode_row(Row(pk, (), True))
        if op.kind == ACTION_PUT:
            cells = []
            for cell in op.row.cells:
                if cell.cell_type is not None or cell.value is None:
                    raise param_invalid(f"PutRow cell {cell.name!r} must carry a value and no cell type")
                cells.append(
                    Cell(cell.name, cell.value, None, ts_ms if cell.timestamp is None else cell.timestamp)
                )
            _check_columns(cells, pk)
            encoded = encode_row(Row(pk, tuple(cells)))
            db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?, ?)", (table, key, encoded))
            return encoded
        current = {c.name: c for c in (existing.cells if existing else ())}
        logged: list[Cell] = []
        for cell in op.row.cells:
            if cell.cell_type is None:
                if cell.value is None:
                    raise param_invalid(f"UpdateRow put cell {cell.name!r} has no value")
                new = Cell(cell.name, cell.value, None, ts_ms if cell.timestamp is None else cell.timestamp)
                current[cell.name] = new
                logged.append(new)
            elif cell.cell_type == DELETE_ALL_VERSION:
                current.pop(cell.name, None)
                logged.append(Cell(cell.name, None, DELETE_ALL_VERSION, None))
            elif cell.cell_type == DELETE_ONE_VERSION:
                if cell.timestamp is None:
                    raise param_invalid(f"UpdateRow DELETE of {cell.name!r} needs a timestamp")
                old = current.get(cell.name)
                if old is not None and old.timestamp == cell.timestamp:
                    current.pop(cell.name)
                logged.append(Cell(cell.name, None, DELETE_ONE_VERSION, cell.timestamp))
            elif cell.cell_type == INCREMENT:
                old = current.get(cell.name)
                base = 0 if old is None else old.value
                if (
                    not isinstance(cell.value, int)
                    or isinstance(cell.value, bool)
                    or not isinstance(base, int)
                ):
                    raise param_invalid(f"INCREMENT of {cell.name!r} needs integers")
                new = Cell(cell.name, base + cell.value, None, ts_ms)
                current[cell.name] = new
                logged.append(new)
            else:
                raise param_invalid(f"unknown cell type {cell.cell_type} on {cell.name!r}")
        _check_columns(logged, pk)
        stored = Row(pk, tuple(current.values()))
        db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?, ?)", (table, key, encode_row(stored)))
        return encode_row(Row(pk, tuple(logged)))


def _columns(row: Row | None) -> dict[str, Any] | None:
    return None if row is None else {c.name: c.value for c in row.cells}


def _check_columns(cells: Sequence[Cell], pk: Sequence[tuple[str, PrimaryKeyValue]]) -> None:
    pk_names = {n for n, _ in pk}
    for cell in cells:
        if cell.name in pk_names:
            raise param_invalid(f"attribute column {cell.name!r} has the name of a primary-key column")
