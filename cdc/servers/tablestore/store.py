"""The server's state: tables, rows, stream shards and their change logs, tunnels, channels, clients.

Everything lives in one sqlite database (WAL journal) in the data directory, so a restart, even after
``kill -9``, loses nothing that a response acknowledged. One lock serialises every operation: the
server is a test and demo double, and a single writer keeps the semantics obvious.

Model:

* A table's key space is cut into **shards** (partitions), each an interval ``[lo, hi)`` of
  order-preserving keys (:mod:`.keys`). Exactly the open shards cover the key space. Every write
  appends one record to the change log of the open shard holding its key: ``(shard, seq)`` with
  ``seq`` counting from 1, plus the stream record itself (PlainBuffer with the sequence-info
  extension ``(epoch=1, timestamp=commit micros, row_index=position in the request)``).
* A **split** seals a shard and opens two children covering its interval; a **merge** seals two
  adjacent open shards and opens one child covering both. A sealed shard never gets another record.
* A **tunnel** has channels. Base-data channels (``BaseData`` / ``BaseAndStream``) read a snapshot of
  one shard's rows taken when the tunnel was created (materialised then, so reads are repeatable);
  stream channels read one shard's change log from the position it had when the tunnel was created
  (or from its start for shards opened later). The hand-off is exact: the snapshot and the stream
  start positions are taken under the same lock.
* A channel's **parents**: the channels of the shards it was split/merged from; for the stream
  channels of a ``BaseAndStream`` tunnel's first shards, every base-data channel (the stage switch).
  A channel is ``WAIT`` until every parent's checkpoint is ``"finished"``.
* A **token** names a position in a channel: ``base64(Token{version=1, content=TokenContent{
  iterator="<channel>:<position>"}})``. Reading from a token returns the records after that position;
  the sequence never changes, so re-reading a token returns the same records (or more of them when the
  first read stopped at the head of a live shard).
"""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.backends.tablestore import tunnel_pb as tpb
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
    Special,
    decode_row,
    encode_row,
    with_sequence_info,
)

from .keys import decode_key, encode_key, encode_value

log = logging.getLogger(__name__)

FINISHED = tpb.FINISHED_TOKEN
PK_TYPES = {1: "INTEGER", 2: "STRING", 3: "BINARY", 5: "BOOLEAN"}
ACTION_PUT, ACTION_UPDATE, ACTION_DELETE = 1, 2, 3
EPOCH = 1
MAX_BYTES_PER_READ = 4 * 1024 * 1024


class OTSError(Exception):
    """A service error: ``code`` is the Tablestore error code, ``status`` the HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


def param_invalid(message: str) -> OTSError:
    return OTSError("OTSParameterInvalid", message, 400)


def not_exist(message: str) -> OTSError:
    return OTSError("OTSObjectNotExist", message, 404)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tables(
    name TEXT PRIMARY KEY, pk TEXT NOT NULL, defined TEXT NOT NULL, options TEXT NOT NULL,
    stream TEXT NOT NULL, created_ms INTEGER NOT NULL, auto_incr INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS rows(tbl TEXT NOT NULL, k BLOB NOT NULL, row BLOB NOT NULL,
    PRIMARY KEY(tbl, k)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shards(
    shard_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, lo BLOB NOT NULL, hi BLOB, parents TEXT NOT NULL,
    sealed INTEGER NOT NULL, created_ms INTEGER NOT NULL, ord INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log(shard_id TEXT NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL,
    action INTEGER NOT NULL, record BLOB NOT NULL, PRIMARY KEY(shard_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tunnels(
    tunnel_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    stage TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS channels(
    tunnel_id TEXT NOT NULL, channel_id TEXT NOT NULL, kind TEXT NOT NULL, shard_id TEXT NOT NULL,
    parents TEXT NOT NULL, start_pos INTEGER NOT NULL, checkpoint TEXT NOT NULL, seqno INTEGER NOT NULL,
    owner TEXT, version INTEGER NOT NULL, ord INTEGER NOT NULL, PRIMARY KEY(tunnel_id, channel_id));
CREATE TABLE IF NOT EXISTS base(tunnel_id TEXT NOT NULL, channel_id TEXT NOT NULL, idx INTEGER NOT NULL,
    record BLOB NOT NULL, PRIMARY KEY(tunnel_id, channel_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trims(shard_id TEXT PRIMARY KEY, upto INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS expired_tunnels(tunnel_id TEXT PRIMARY KEY, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients(client_id TEXT PRIMARY KEY, tunnel_id TEXT NOT NULL,
    timeout_s INTEGER NOT NULL, last_seen REAL NOT NULL, tag TEXT);
"""


@dataclass
class TableInfo:
    name: str
    pk: list[tuple[str, str]]  # (name, INTEGER|STRING|BINARY|BOOLEAN)
    auto_increment: set[str]
    defined: list[tuple[str, int]]
    options: dict[str, Any]
    stream: dict[str, Any]
    created_ms: int


@dataclass
class ShardInfo:
    shard_id: str
    table: str
    lo: bytes
    hi: bytes | None
    parents: list[str]
    sealed: bool
    ord: int

    def holds(self, key: bytes) -> bool:
        return self.lo <= key and (self.hi is None or key < self.hi)


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


@dataclass
class ReadResult:
    records: list[tuple[int, bytes]]
    next_token: str
    more: bool


@dataclass
class Faults:
    """Injected failures (not persisted). ``path_prefix`` limits a fault to some calls."""

    kind: str = ""
    remaining: int = 0  # -1: until cleared
    seconds: float = 0.0
    path_prefix: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, path: str) -> tuple[str, float] | None:
        with self.lock:
            if not self.kind or self.remaining == 0 or not path.startswith(self.path_prefix):
                return None
            if self.remaining > 0:
                self.remaining -= 1
            return self.kind, self.seconds


def _now_ms() -> int:
    return int(time.time() * 1000)


def make_token(channel_id: str, position: int) -> str:
    content = tpb.TokenContent(iterator=f"{channel_id}:{position}").SerializeToString()
    return base64.b64encode(tpb.Token(version=1, content=content).SerializeToString()).decode("ascii")


def parse_token(token: str, channel_id: str) -> int:
    """The position a token names; OTSParameterInvalid if it is malformed or of another channel."""
    try:
        outer = tpb.Token.FromString(base64.b64decode(token.encode("ascii"), validate=True))
        iterator = tpb.TokenContent.FromString(outer.content).iterator
        owner, _, position = iterator.rpartition(":")
        value = int(position)
    except Exception as exc:  # noqa: BLE001 - base64, protobuf and int errors all mean "bad token"
        raise param_invalid(f"token {token[:40]!r} is malformed") from exc
    if owner != channel_id or value < 0:
        raise param_invalid(f"token {token[:40]!r} does not belong to channel {channel_id}")
    return value


class Store:
    """All state, behind one lock. Methods raise :class:`OTSError` for service errors."""

    def __init__(self, data_dir: Path, instance: str, max_records_per_read: int = 1000) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.instance = instance
        self.max_records_per_read = max_records_per_read
        self.lock = threading.RLock()
        self.db = sqlite3.connect(
            data_dir / "tablestore.sqlite", check_same_thread=False, isolation_level=None
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._tables: dict[str, TableInfo] = {}
        self._open_shards: dict[str, list[ShardInfo]] = {}
        self._last_seq: dict[str, int] = {}
        self._last_ts = 0
        self._load()

    def close(self) -> None:
        with self.lock:
            self.db.close()

    # ------------------------------------------------------------------ plumbing
    def _load(self) -> None:
        for name, pk, defined, options, stream, created in self.db.execute(
            "SELECT name, pk, defined, options, stream, created_ms FROM tables"
        ):
            pk_list = json.loads(pk)
            self._tables[name] = TableInfo(
                name,
                [(n, t) for n, t, _ in pk_list],
                {n for n, _, auto in pk_list if auto},
                [tuple(d) for d in json.loads(defined)],
                json.loads(options),
                json.loads(stream),
                created,
            )
        for shard_id, last in self.db.execute("SELECT shard_id, MAX(seq) FROM log GROUP BY shard_id"):
            self._last_seq[shard_id] = last
        row = self.db.execute("SELECT MAX(ts) FROM log").fetchone()
        self._last_ts = row[0] or 0

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                self._open_shards.clear()
                self._last_seq = {
                    r[0]: r[1]
                    for r in self.db.execute("SELECT shard_id, MAX(seq) FROM log GROUP BY shard_id")
                }
                raise
            else:
                self.db.execute("COMMIT")

    def _next_ts(self) -> int:
        ts = max(int(time.time() * 1_000_000), self._last_ts + 1)
        self._last_ts = ts
        return ts

    def table(self, name: str) -> TableInfo:
        info = self._tables.get(name)
        if info is None:
            raise not_exist(f"Requested table {name!r} does not exist.")
        return info

    def _shards_of(self, table: str) -> list[ShardInfo]:
        cached = self._open_shards.get(table)
        if cached is None:
            cached = [
                self._shard(r)
                for r in self.db.execute(
                    "SELECT shard_id, tbl, lo, hi, parents, sealed, ord FROM shards WHERE tbl=? AND sealed=0 ORDER BY lo",
                    (table,),
                )
            ]
            self._open_shards[table] = cached
        return cached

    @staticmethod
    def _shard(r: Sequence[Any]) -> ShardInfo:
        return ShardInfo(
            r[0], r[1], bytes(r[2]), None if r[3] is None else bytes(r[3]), json.loads(r[4]), bool(r[5]), r[6]
        )

    def _shard_for(self, table: str, key: bytes) -> ShardInfo:
        for shard in self._shards_of(table):
            if shard.holds(key):
                return shard
        raise OTSError("OTSInternalServerError", f"no open shard holds a key of table {table}", 500)

    def _get_shard(self, shard_id: str) -> ShardInfo:
        r = self.db.execute(
            "SELECT shard_id, tbl, lo, hi, parents, sealed, ord FROM shards WHERE shard_id=?", (shard_id,)
        ).fetchone()
        if r is None:
            raise param_invalid(f"shard {shard_id!r} does not exist")
        return self._shard(r)

    def _new_shard(
        self, db: sqlite3.Connection, table: str, lo: bytes, hi: bytes | None, parents: list[str]
    ) -> str:
        shard_id = uuid.uuid4().hex
        order = db.execute("SELECT COALESCE(MAX(ord), 0) + 1 FROM shards").fetchone()[0]
        db.execute(
            "INSERT INTO shards VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
            (shard_id, table, lo, hi, json.dumps(parents), _now_ms(), order),
        )
        self._last_seq[shard_id] = 0
        return shard_id

    # ------------------------------------------------------------------ tables
    def create_table(
        self,
        name: str,
        pk: list[tuple[str, str, bool]],
        defined: list[tuple[str, int]],
        options: dict[str, Any],
        stream: dict[str, Any],
    ) -> None:
        if not name:
            raise param_invalid("table name is empty")
        if not pk:
            raise param_invalid("The number of primary key columns must be in range: [1, 4].")
        if len(pk) > 4:
            raise param_invalid("The number of primary key columns must be in range: [1, 4].")
        if len({n for n, _, _ in pk}) != len(pk):
            raise param_invalid("duplicated primary key name")
        with self._txn() as db:
            if name in self._tables:
                raise OTSError("OTSObjectAlreadyExist", f"Requested table already exists: {name}.", 409)
            stream = {**stream, "stream_id": uuid.uuid4().hex, "last_enable_time": _now_ms() * 1000}
            created = _now_ms()
            db.execute(
                "INSERT INTO tables(name, pk, defined, options, stream, created_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (name, json.dumps(pk), json.dumps(defined), json.dumps(options), json.dumps(stream), created),
            )
            self._new_shard(db, name, b"", None, [])
            self._open_shards.pop(name, None)
            self._tables[name] = TableInfo(
                name,
                [(n, t) for n, t, _ in pk],
                {n for n, _, a in pk if a},
                defined,
                options,
                stream,
                created,
            )

    def list_tables(self) -> list[str]:
        with self.lock:
            return sorted(self._tables)

    def delete_table(self, name: str) -> None:
        with self._txn() as db:
            self.table(name)
            shard_ids = [r[0] for r in db.execute("SELECT shard_id FROM shards WHERE tbl=?", (name,))]
            tunnel_ids = [r[0] for r in db.execute("SELECT tunnel_id FROM tunnels WHERE tbl=?", (name,))]
            for tunnel_id in tunnel_ids:
                self._drop_tunnel(db, tunnel_id)
            db.execute("DELETE FROM rows WHERE tbl=?", (name,))
            for shard_id in shard_ids:
                db.execute("DELETE FROM log WHERE shard_id=?", (shard_id,))
                self._last_seq.pop(shard_id, None)
            db.execute("DELETE FROM shards WHERE tbl=?", (name,))
            db.execute("DELETE FROM tables WHERE name=?", (name,))
            self._tables.pop(name, None)
            self._open_shards.pop(name, None)

    # ------------------------------------------------------------------ rows
    def check_pk(
        self,
        info: TableInfo,
        pk: Sequence[tuple[str, PrimaryKeyValue]],
        *,
        bound: bool = False,
        allow_auto: bool = False,
    ) -> None:
        """Names, order and types must match the schema (range bounds may use INF_MIN/INF_MAX)."""
        names = [n for n, _ in pk]
        expected = [n for n, _ in info.pk]
        if names != expected:
            raise param_invalid(
                f"Validate PK name fail. Input: {','.join(names)}, Meta: {','.join(expected)}."
            )
        for (name, value), (_, ptype) in zip(pk, info.pk, strict=True):
            if isinstance(value, Special):
                if value is AUTO_INCREMENT and allow_auto and name in info.auto_increment:
                    continue
                if value is not AUTO_INCREMENT and bound:
                    continue
                raise param_invalid(f"Primary key column {name!r} cannot be {value.name} here.")
            ok = {
                "INTEGER": isinstance(value, int) and not isinstance(value, bool),
                "STRING": isinstance(value, str),
                "BINARY": isinstance(value, bytes),
                "BOOLEAN": isinstance(value, bool),
            }[ptype]
            if not ok:
                raise param_invalid(
                    f"Validate PK type fail. Column {name!r} is {ptype}, got {type(value).__name__}."
                )

    def _get(self, table: str, key: bytes) -> Row | None:
        r = self.db.execute("SELECT row FROM rows WHERE tbl=? AND k=?", (table, key)).fetchone()
        return None if r is None else decode_row(r[0])

    def get_row(self, table: str, pk: Sequence[tuple[str, PrimaryKeyValue]]) -> Row | None:
        with self.lock:
            info = self.table(table)
            self.check_pk(info, pk)
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
        with self.lock:
            info = self.table(table)
            self.check_pk(info, start, bound=True)
            self.check_pk(info, end, bound=True)
            lo, hi = encode_key(start), encode_key(end)
            if forward:
                sql = "SELECT k, row FROM rows WHERE tbl=? AND k>=? AND k<? ORDER BY k LIMIT ?"
                cur = self.db.execute(sql, (table, lo, hi, limit + 1))
            else:
                sql = "SELECT k, row FROM rows WHERE tbl=? AND k<=? AND k>? ORDER BY k DESC LIMIT ?"
                cur = self.db.execute(sql, (table, lo, hi, limit + 1))
            found = cur.fetchall()
        rows = [decode_row(r[1]) for r in found[:limit]]
        next_key = bytes(found[limit][1]) if len(found) > limit else None
        return rows, next_key

    def write(self, table: str, ops: Sequence[WriteOp]) -> list[WriteResult]:
        """Apply row changes in order, each on its own (a failed condition fails that row only)."""
        results: list[WriteResult] = []
        with self._txn() as db:
            info = self.table(table)
            ts_us = self._next_ts()
            ts_ms = ts_us // 1000
            log_rows: list[tuple[str, int, int, int, bytes]] = []
            auto_next: int | None = None
            for index, op in enumerate(ops):
                try:
                    pk = op.row.primary_key
                    self.check_pk(info, pk, allow_auto=op.kind == ACTION_PUT)
                    if any(v is AUTO_INCREMENT for _, v in pk):
                        if auto_next is None:
                            auto_next = db.execute(
                                "SELECT auto_incr FROM tables WHERE name=?", (table,)
                            ).fetchone()[0]
                        auto_next = (auto_next or 0) + 1
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
                    shard = self._shard_for(table, key)
                    seq = self._last_seq.get(shard.shard_id, 0) + 1
                    self._last_seq[shard.shard_id] = seq
                    stream_record = with_sequence_info(record, SequenceInfo(EPOCH, ts_us, index))
                    log_rows.append((shard.shard_id, seq, ts_us, op.kind, stream_record))
                    results.append(WriteResult(True, pk))
                except OTSError as err:
                    results.append(WriteResult(False, error=err))
                except PlainBufferError as err:
                    results.append(WriteResult(False, error=param_invalid(str(err))))
            if auto_next is not None:
                db.execute("UPDATE tables SET auto_incr=? WHERE name=?", (auto_next, table))
            db.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?)", log_rows)
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

    # ------------------------------------------------------------------ shards (admin)
    def shards(self, table: str) -> list[dict[str, Any]]:
        with self.lock:
            info = self.table(table)
            names = [n for n, _ in info.pk]
            out = []
            for r in self.db.execute(
                "SELECT shard_id, tbl, lo, hi, parents, sealed, ord FROM shards WHERE tbl=? ORDER BY ord",
                (table,),
            ):
                s = self._shard(r)
                out.append(
                    {
                        "shard_id": s.shard_id,
                        "parents": s.parents,
                        "sealed": s.sealed,
                        "lo": _readable(decode_key(s.lo, names)) if s.lo else None,
                        "hi": None if s.hi is None else _readable(decode_key(s.hi, names)),
                        "records": self._last_seq.get(s.shard_id, 0),
                    }
                )
            return out

    def split(
        self, table: str, shard_id: str | None = None, split_key: Sequence[Any] | None = None
    ) -> dict[str, Any]:
        """Seal one open shard and open two children. Default split point: the shard's median row."""
        with self._txn() as db:
            info = self.table(table)
            open_shards = self._shards_of(table)
            if shard_id is None:
                shard = max(open_shards, key=lambda s: (self._count_rows(table, s), -s.ord))
            else:
                matches = [s for s in open_shards if s.shard_id == shard_id]
                if not matches:
                    raise param_invalid(f"shard {shard_id!r} is not an open shard of table {table}")
                shard = matches[0]
            if split_key is not None:
                if not 1 <= len(split_key) <= len(info.pk):
                    raise param_invalid(
                        f"split_key needs 1..{len(info.pk)} values (the leading primary-key columns)"
                    )
                point = b"".join(encode_value(_from_json(v)) for v in split_key)
            else:
                point = self._median(table, shard)
            if point <= shard.lo or (shard.hi is not None and point >= shard.hi):
                raise param_invalid("split point must lie strictly inside the shard")
            db.execute("UPDATE shards SET sealed=1 WHERE shard_id=?", (shard.shard_id,))
            left = self._new_shard(db, table, shard.lo, point, [shard.shard_id])
            right = self._new_shard(db, table, point, shard.hi, [shard.shard_id])
            self._open_shards.pop(table, None)
            for tunnel_id in self._stream_tunnels(db, table):
                self._add_child_channels(db, tunnel_id, [shard.shard_id], [left, right])
        log.info("split shard %s of table %s into %s, %s", shard.shard_id, table, left, right)
        return {"parent": shard.shard_id, "children": [left, right]}

    def merge(self, table: str, shard_ids: Sequence[str] | None = None) -> dict[str, Any]:
        """Seal two adjacent open shards and open one child covering both."""
        with self._txn() as db:
            self.table(table)
            open_shards = self._shards_of(table)  # sorted by lo
            if shard_ids is None:
                if len(open_shards) < 2:
                    raise param_invalid(f"table {table} has a single open shard: nothing to merge")
                pair = open_shards[0], open_shards[1]
            else:
                if len(shard_ids) != 2:
                    raise param_invalid("merge needs exactly two shard ids")
                by_id = {s.shard_id: s for s in open_shards}
                if any(s not in by_id for s in shard_ids):
                    raise param_invalid(f"merge: {list(shard_ids)} are not both open shards of table {table}")
                a, b = sorted((by_id[s] for s in shard_ids), key=lambda s: s.lo)
                pair = a, b
            a, b = pair
            if a.hi != b.lo:
                raise param_invalid(f"shards {a.shard_id} and {b.shard_id} are not adjacent")
            for s in pair:
                db.execute("UPDATE shards SET sealed=1 WHERE shard_id=?", (s.shard_id,))
            child = self._new_shard(db, table, a.lo, b.hi, [a.shard_id, b.shard_id])
            self._open_shards.pop(table, None)
            for tunnel_id in self._stream_tunnels(db, table):
                self._add_child_channels(db, tunnel_id, [a.shard_id, b.shard_id], [child])
        log.info("merged shards %s, %s of table %s into %s", a.shard_id, b.shard_id, table, child)
        return {"parents": [a.shard_id, b.shard_id], "child": child}

    def trim(self, table: str, before_ms: int) -> dict[str, int]:
        """Drop change-log records committed before ``before_ms`` (what stream expiration does).

        Reading a stream channel from a position inside the dropped part then fails the way the service
        fails it: HTTP 400, code ``OTSTunnelServerUnavailable``, message ``OTSTrimmedDataAccess Requested
        stream data is already trimmed or does not exist.``; the channel's ``start_token`` moves to the
        first record still held. A BaseAndStream tunnel still in its base-data stage whose stream channels
        lose records they have not delivered expires (``OTSTunnelExpired``, as when the service's
        incremental logs outlive the 7-day retention before the full data was consumed). Returns, per
        shard, the last dropped position.
        """
        cutoff = before_ms * 1000
        out: dict[str, int] = {}
        with self._txn() as db:
            self.table(table)
            for (shard_id,) in db.execute("SELECT shard_id FROM shards WHERE tbl=?", (table,)).fetchall():
                row = db.execute(
                    "SELECT MAX(seq) FROM log WHERE shard_id=? AND ts<?", (shard_id, cutoff)
                ).fetchone()
                if row[0] is None:
                    continue
                db.execute("DELETE FROM log WHERE shard_id=? AND seq<=?", (shard_id, row[0]))
                db.execute(
                    "INSERT INTO trims VALUES (?, ?) ON CONFLICT(shard_id) DO UPDATE SET upto=MAX(upto, excluded.upto)",
                    (shard_id, row[0]),
                )
                out[shard_id] = int(row[0])
                for (tunnel_id,) in db.execute(
                    "SELECT c.tunnel_id FROM channels c JOIN tunnels t ON t.tunnel_id=c.tunnel_id "
                    "WHERE c.shard_id=? AND c.kind='Stream' AND c.start_pos<? AND t.type='BaseAndStream' "
                    "AND t.stage='ProcessBaseData'",
                    (shard_id, row[0]),
                ).fetchall():
                    db.execute(
                        "INSERT OR IGNORE INTO expired_tunnels VALUES (?, ?)",
                        (
                            tunnel_id,
                            f"the incremental log of shard {shard_id} expired before the tunnel finished its "
                            "base data",
                        ),
                    )
                    log.info(
                        "tunnel %s expired: its stream log was trimmed during its base-data stage", tunnel_id
                    )
        log.info("trimmed the change log of table %s before %d ms: %s", table, before_ms, out)
        return out

    def _count_rows(self, table: str, shard: ShardInfo) -> int:
        if shard.hi is None:
            r = self.db.execute(
                "SELECT COUNT(*) FROM rows WHERE tbl=? AND k>=?", (table, shard.lo)
            ).fetchone()
        else:
            r = self.db.execute(
                "SELECT COUNT(*) FROM rows WHERE tbl=? AND k>=? AND k<?", (table, shard.lo, shard.hi)
            ).fetchone()
        return int(r[0])

    def _median(self, table: str, shard: ShardInfo) -> bytes:
        count = self._count_rows(table, shard)
        if count < 2:
            raise param_invalid(f"shard {shard.shard_id} holds {count} row(s); give split_key to split it")
        hi_clause, args = ("AND k<?", (shard.hi,)) if shard.hi is not None else ("", ())
        r = self.db.execute(
            f"SELECT k FROM rows WHERE tbl=? AND k>=? {hi_clause} ORDER BY k LIMIT 1 OFFSET ?",
            (table, shard.lo, *args, count // 2),
        ).fetchone()
        return bytes(r[0])

    def _stream_tunnels(self, db: sqlite3.Connection, table: str) -> list[str]:
        return [
            r[0]
            for r in db.execute(
                "SELECT tunnel_id FROM tunnels WHERE tbl=? AND type IN ('Stream', 'BaseAndStream')", (table,)
            )
        ]

    def _add_child_channels(
        self, db: sqlite3.Connection, tunnel_id: str, parents: list[str], children: list[str]
    ) -> None:
        present = {
            r[0]
            for r in db.execute(
                "SELECT channel_id FROM channels WHERE tunnel_id=? AND kind='Stream'", (tunnel_id,)
            )
        }
        tunnel_parents = [p for p in parents if p in present]
        if not tunnel_parents:
            return  # the tunnel never had the parent (created after it was sealed)
        for child in children:
            self._insert_channel(db, tunnel_id, child, "Stream", child, tunnel_parents, 0)

    # ------------------------------------------------------------------ tunnels
    def _insert_channel(
        self,
        db: sqlite3.Connection,
        tunnel_id: str,
        channel_id: str,
        kind: str,
        shard_id: str,
        parents: list[str],
        start: int,
    ) -> None:
        order = db.execute(
            "SELECT COALESCE(MAX(ord), 0) + 1 FROM channels WHERE tunnel_id=?", (tunnel_id,)
        ).fetchone()[0]
        db.execute(
            "INSERT INTO channels VALUES (?, ?, ?, ?, ?, ?, ?, 0, NULL, 0, ?)",
            (
                tunnel_id,
                channel_id,
                kind,
                shard_id,
                json.dumps(parents),
                start,
                make_token(channel_id, start),
                order,
            ),
        )

    def create_tunnel(self, table: str, name: str, tunnel_type: str) -> str:
        if tunnel_type not in ("BaseData", "Stream", "BaseAndStream"):
            raise param_invalid(f"tunnel type {tunnel_type!r}: expected BaseData, Stream or BaseAndStream")
        if not name:
            raise param_invalid("tunnel name is empty")
        with self._txn() as db:
            self.table(table)
            if db.execute("SELECT 1 FROM tunnels WHERE tbl=? AND name=?", (table, name)).fetchone():
                raise OTSError("OTSTunnelExist", f"tunnel {name!r} already exists on table {table}", 409)
            tunnel_id = str(uuid.uuid4())
            stage = "ProcessStream" if tunnel_type == "Stream" else "ProcessBaseData"
            db.execute(
                "INSERT INTO tunnels VALUES (?, ?, ?, ?, ?, ?)",
                (tunnel_id, table, name, tunnel_type, stage, _now_ms()),
            )
            base_ids: list[str] = []
            shards = self._shards_of(table)
            if tunnel_type in ("BaseData", "BaseAndStream"):
                for shard in shards:
                    channel_id = f"{shard.shard_id}-base"
                    base_ids.append(channel_id)
                    hi_clause, args = ("AND k<?", (shard.hi,)) if shard.hi is not None else ("", ())
                    db.execute(
                        "INSERT INTO base SELECT ?, ?, ROW_NUMBER() OVER (ORDER BY k), row FROM rows "
                        f"WHERE tbl=? AND k>=? {hi_clause}",
                        (tunnel_id, channel_id, table, shard.lo, *args),
                    )
                    self._insert_channel(db, tunnel_id, channel_id, "BaseData", shard.shard_id, [], 0)
            if tunnel_type in ("Stream", "BaseAndStream"):
                for shard in shards:
                    self._insert_channel(
                        db,
                        tunnel_id,
                        shard.shard_id,
                        "Stream",
                        shard.shard_id,
                        base_ids,
                        self._last_seq.get(shard.shard_id, 0),
                    )
        log.info("created %s tunnel %s (%s) on table %s", tunnel_type, name, tunnel_id, table)
        return tunnel_id

    def _tunnel(self, tunnel_id: str) -> tuple[str, str, str, str, str, int]:
        r = self.db.execute(
            "SELECT tunnel_id, tbl, name, type, stage, created_ms FROM tunnels WHERE tunnel_id=?",
            (tunnel_id,),
        ).fetchone()
        if r is None:
            raise param_invalid(f"tunnel {tunnel_id!r} does not exist")
        return r  # type: ignore[no-any-return]

    def find_tunnel(self, table: str, name: str, tunnel_id: str | None) -> str:
        with self.lock:
            if tunnel_id:
                self._tunnel(tunnel_id)
                return tunnel_id
            r = self.db.execute(
                "SELECT tunnel_id FROM tunnels WHERE tbl=? AND name=?", (table, name)
            ).fetchone()
            if r is None:
                raise param_invalid(f"tunnel {name!r} does not exist on table {table!r}")
            return str(r[0])

    def delete_tunnel(self, tunnel_id: str) -> None:
        with self._txn() as db:
            self._tunnel(tunnel_id)
            self._drop_tunnel(db, tunnel_id)

    def _drop_tunnel(self, db: sqlite3.Connection, tunnel_id: str) -> None:
        for sql in (
            "DELETE FROM base WHERE tunnel_id=?",
            "DELETE FROM channels WHERE tunnel_id=?",
            "DELETE FROM clients WHERE tunnel_id=?",
            "DELETE FROM tunnels WHERE tunnel_id=?",
            "DELETE FROM expired_tunnels WHERE tunnel_id=?",
        ):
            db.execute(sql, (tunnel_id,))

    def tunnel_info(self, tunnel_id: str) -> dict[str, Any]:
        with self.lock:
            tid, table, name, ttype, stage, created = self._tunnel(tunnel_id)
            return {
                "tunnel_id": tid,
                "table": table,
                "name": name,
                "type": ttype,
                "stage": stage,
                "created_ms": created,
                "stream_id": self._tables[table].stream.get("stream_id", ""),
                "expired": self._expiry(tid) is not None,
            }

    def _expiry(self, tunnel_id: str) -> str | None:
        r = self.db.execute("SELECT reason FROM expired_tunnels WHERE tunnel_id=?", (tunnel_id,)).fetchone()
        return None if r is None else str(r[0])

    def _not_expired(self, tunnel_id: str) -> None:
        reason = self._expiry(tunnel_id)
        if reason is not None:
            raise OTSError("OTSTunnelExpired", f"tunnel {tunnel_id} has expired: {reason}", 400)

    def list_tunnels(self, table: str | None) -> list[dict[str, Any]]:
        with self.lock:
            if table:
                self.table(table)
                ids = [
                    r[0]
                    for r in self.db.execute(
                        "SELECT tunnel_id FROM tunnels WHERE tbl=? ORDER BY created_ms", (table,)
                    )
                ]
            else:
                ids = [r[0] for r in self.db.execute("SELECT tunnel_id FROM tunnels ORDER BY created_ms")]
            return [self.tunnel_info(t) for t in ids]

    _CHANNEL_COLUMNS = "channel_id, kind, shard_id, parents, start_pos, checkpoint, seqno, owner, version"

    @staticmethod
    def _channel_dict(r: Sequence[Any]) -> dict[str, Any]:
        return {
            "channel_id": r[0],
            "kind": r[1],
            "shard_id": r[2],
            "parents": json.loads(r[3]),
            "start_pos": r[4],
            "checkpoint": r[5],
            "seqno": r[6],
            "owner": r[7],
            "version": r[8],
        }

    def _set_status(self, c: dict[str, Any], finished: set[str]) -> None:
        c["sealed"] = c["kind"] == "BaseData" or self._is_sealed(c["shard_id"])
        c["held_from"] = c["start_pos"]  # the first position still readable (records after it are held)
        if c["kind"] != "BaseData":
            trimmed = self.db.execute("SELECT upto FROM trims WHERE shard_id=?", (c["shard_id"],)).fetchone()
            if trimmed is not None:
                c["held_from"] = max(c["start_pos"], int(trimmed[0]))
        if c["checkpoint"] == FINISHED:
            c["status"] = "TERMINATED"
        elif any(p not in finished for p in c["parents"]):
            c["status"] = "WAIT"
        elif c["owner"] and self._client_alive(c["owner"]):
            c["status"] = "OPEN"
        else:
            c["status"] = "CLOSE"

    def _channels(self, tunnel_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            f"SELECT {self._CHANNEL_COLUMNS} FROM channels WHERE tunnel_id=? ORDER BY ord", (tunnel_id,)
        ).fetchall()
        chans = [self._channel_dict(r) for r in rows]
        finished = {c["channel_id"] for c in chans if c["checkpoint"] == FINISHED}
        for c in chans:
            self._set_status(c, finished)
        return chans

    def _channel(self, tunnel_id: str, channel_id: str) -> dict[str, Any]:
        """One channel with its status (without describing the whole tunnel: reads stay O(1))."""
        r = self.db.execute(
            f"SELECT {self._CHANNEL_COLUMNS} FROM channels WHERE tunnel_id=? AND channel_id=?",
            (tunnel_id, channel_id),
        ).fetchone()
        if r is None:
            raise param_invalid(f"channel {channel_id!r} does not exist in tunnel {tunnel_id}")
        c = self._channel_dict(r)
        finished: set[str] = set()
        if c["parents"]:
            marks = ",".join("?" * len(c["parents"]))
            finished = {
                row[0]
                for row in self.db.execute(
                    f"SELECT channel_id FROM channels WHERE tunnel_id=? AND checkpoint=? AND channel_id IN ({marks})",
                    (tunnel_id, FINISHED, *c["parents"]),
                )
            }
        self._set_status(c, finished)
        return c

    def _is_sealed(self, shard_id: str) -> bool:
        r = self.db.execute("SELECT sealed FROM shards WHERE shard_id=?", (shard_id,)).fetchone()
        return bool(r and r[0])

    def describe_tunnel(self, tunnel_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        with self.lock:
            self._expire_clients()
            return self.tunnel_info(tunnel_id), self._channels(tunnel_id)

    # ------------------------------------------------------------------ clients
    def _client_alive(self, client_id: str) -> bool:
        r = self.db.execute(
            "SELECT timeout_s, last_seen FROM clients WHERE client_id=?", (client_id,)
        ).fetchone()
        return r is not None and time.time() - r[1] <= r[0]

    def _expire_clients(self) -> None:
        now = time.time()
        dead = [
            r[0]
            for r in self.db.execute("SELECT client_id, timeout_s, last_seen FROM clients")
            if now - r[2] > r[1]
        ]
        if dead:
            with self._txn() as db:
                for client_id in dead:
                    db.execute("UPDATE channels SET owner=NULL WHERE owner=?", (client_id,))
                    db.execute("DELETE FROM clients WHERE client_id=?", (client_id,))
                    log.info("tunnel client %s expired", client_id)

    def expire_client(self, client_id: str) -> None:
        """Admin: make a client expire now (as if it missed its heartbeats)."""
        with self._txn() as db:
            db.execute("UPDATE clients SET last_seen=0 WHERE client_id=?", (client_id,))

    def _live_client(self, tunnel_id: str, client_id: str) -> None:
        self._tunnel(tunnel_id)
        self._not_expired(tunnel_id)
        self._expire_clients()
        r = self.db.execute("SELECT tunnel_id FROM clients WHERE client_id=?", (client_id,)).fetchone()
        if r is None or r[0] != tunnel_id:
            raise OTSError(
                "OTSResourceGone", f"tunnel client {client_id!r} does not exist or has expired", 410
            )
        self.db.execute("UPDATE clients SET last_seen=? WHERE client_id=?", (time.time(), client_id))

    def connect(self, tunnel_id: str, timeout_s: int, tag: str | None) -> str:
        with self._txn() as db:
            self._tunnel(tunnel_id)
            self._not_expired(tunnel_id)
            # like the service: the client tag (the Java worker's default: the hostname), then a random string
            client_id = f"{tag}{uuid.uuid4().hex[:16]}" if tag else f"{tunnel_id}-{uuid.uuid4().hex[:16]}"
            db.execute(
                "INSERT INTO clients VALUES (?, ?, ?, ?, ?)",
                (client_id, tunnel_id, timeout_s if timeout_s > 0 else 300, time.time(), tag),
            )
            return client_id

    def heartbeat(
        self, tunnel_id: str, client_id: str, reported: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int, int]]:
        """Release the channels the client reports CLOSE/TERMINATED; hand it every free channel.

        Returns ``(channel_id, version, status)`` for the channels the client holds; channels whose
        checkpoint is ``"finished"`` are returned once as TERMINATED and released.
        """
        with self.lock:
            self._live_client(tunnel_id, client_id)
            with self._txn() as db:
                released = set()
                for channel_id, _version, status in reported:
                    if status in (tpb.CLOSE, tpb.TERMINATED):
                        released.add(channel_id)
                        db.execute(
                            "UPDATE channels SET owner=NULL WHERE tunnel_id=? AND channel_id=? AND owner=?",
                            (tunnel_id, channel_id, client_id),
                        )
                out: list[tuple[str, int, int]] = []
                for c in self._channels(tunnel_id):
                    if c["status"] == "TERMINATED":
                        if c["owner"] == client_id:
                            db.execute(
                                "UPDATE channels SET owner=NULL WHERE tunnel_id=? AND channel_id=?",
                                (tunnel_id, c["channel_id"]),
                            )
                            out.append((c["channel_id"], c["version"], tpb.TERMINATED))
                    elif c["channel_id"] in released:
                        continue  # given back in this very heartbeat: left for other clients
                    elif c["status"] == "CLOSE" or (c["status"] == "OPEN" and c["owner"] == client_id):
                        version = c["version"] + (0 if c["owner"] == client_id else 1)
                        db.execute(
                            "UPDATE channels SET owner=?, version=? WHERE tunnel_id=? AND channel_id=?",
                            (client_id, version, tunnel_id, c["channel_id"]),
                        )
                        out.append((c["channel_id"], version, tpb.OPEN))
                return out

    def shutdown(self, tunnel_id: str, client_id: str) -> None:
        with self.lock:
            self._live_client(tunnel_id, client_id)
            with self._txn() as db:
                db.execute("UPDATE channels SET owner=NULL WHERE owner=?", (client_id,))
                db.execute("DELETE FROM clients WHERE client_id=?", (client_id,))

    def get_checkpoint(self, tunnel_id: str, client_id: str, channel_id: str) -> tuple[str, int]:
        with self.lock:
            self._live_client(tunnel_id, client_id)
            c = self._channel(tunnel_id, channel_id)
            return c["checkpoint"], c["seqno"]

    def checkpoint(self, tunnel_id: str, client_id: str, channel_id: str, token: str, seqno: int) -> None:
        with self.lock:
            self._live_client(tunnel_id, client_id)
            with self._txn() as db:
                c = self._channel(tunnel_id, channel_id)
                if c["owner"] and c["owner"] != client_id and self._client_alive(c["owner"]):
                    raise OTSError(
                        "OTSPermissionDenied",
                        f"channel {channel_id} is owned by another client ({c['owner']})",
                        403,
                    )
                if c["status"] == "WAIT":
                    raise OTSError(
                        "OTSPermissionDenied",
                        f"channel {channel_id} is in WAIT: its parents are not finished",
                        403,
                    )
                if seqno != c["seqno"] + 1:
                    raise OTSError(
                        "OTSSequenceNumberNotMatch",
                        f"sequence number {seqno} does not follow {c['seqno']} (expected {c['seqno'] + 1})",
                        400,
                    )
                if token == FINISHED:
                    if not c["sealed"]:
                        raise param_invalid(
                            f"channel {channel_id} is still open: it cannot be checkpointed as finished"
                        )
                else:
                    parse_token(token, channel_id)
                db.execute(
                    "UPDATE channels SET checkpoint=?, seqno=?, owner=? WHERE tunnel_id=? AND channel_id=?",
                    (token, seqno, client_id, tunnel_id, channel_id),
                )
                if token == FINISHED:
                    self._maybe_advance_stage(db, tunnel_id)

    def _maybe_advance_stage(self, db: sqlite3.Connection, tunnel_id: str) -> None:
        _, _, _, ttype, stage, _ = self._tunnel(tunnel_id)
        if ttype != "BaseAndStream" or stage != "ProcessBaseData":
            return
        pending = db.execute(
            "SELECT COUNT(*) FROM channels WHERE tunnel_id=? AND kind='BaseData' AND checkpoint<>?",
            (tunnel_id, FINISHED),
        ).fetchone()[0]
        if pending == 0:
            db.execute("UPDATE tunnels SET stage='ProcessStream' WHERE tunnel_id=?", (tunnel_id,))

    def read_records(self, tunnel_id: str, client_id: str, channel_id: str, token: str) -> ReadResult:
        with self.lock:
            self._live_client(tunnel_id, client_id)
            c = self._channel(tunnel_id, channel_id)
            if c["status"] == "WAIT":
                raise OTSError(
                    "OTSPermissionDenied",
                    f"channel {channel_id} is in WAIT: its parents are not finished",
                    403,
                )
            if token == FINISHED:
                return ReadResult([], FINISHED, False)
            position = parse_token(token, channel_id)
            limit = self.max_records_per_read
            if c["kind"] == "BaseData":
                rows = self.db.execute(
                    "SELECT idx, ?, record FROM base WHERE tunnel_id=? AND channel_id=? AND idx>? ORDER BY idx LIMIT ?",
                    (ACTION_PUT, tunnel_id, channel_id, position, limit + 1),
                ).fetchall()
                end = self.db.execute(
                    "SELECT COALESCE(MAX(idx), 0) FROM base WHERE tunnel_id=? AND channel_id=?",
                    (tunnel_id, channel_id),
                ).fetchone()[0]
            else:
                trimmed = self.db.execute(
                    "SELECT upto FROM trims WHERE shard_id=?", (c["shard_id"],)
                ).fetchone()
                if trimmed is not None and position < trimmed[0]:
                    # What the service answers (its error-code reference, "HTTP 400 errors: stream"): the
                    # code is OTSTunnelServerUnavailable, the message starts with OTSTrimmedDataAccess.
                    raise OTSError(
                        "OTSTunnelServerUnavailable",
                        "OTSTrimmedDataAccess Requested stream data is already trimmed or does not exist. "
                        f"(channel {channel_id}: records up to position {trimmed[0]} have expired; the token "
                        f"points at position {position})",
                        400,
                    )
                rows = self.db.execute(
                    "SELECT seq, action, record FROM log WHERE shard_id=? AND seq>? ORDER BY seq LIMIT ?",
                    (c["shard_id"], position, limit + 1),
                ).fetchall()
                end = self._last_seq.get(c["shard_id"], 0)
            if position < c["start_pos"] or position > end:
                raise param_invalid(f"token position {position} is outside channel {channel_id}")
            more = len(rows) > limit
            rows = rows[:limit]
            size = 0
            for i, r in enumerate(rows):  # like the service, a response also stops at a size limit
                size += len(r[2])
                if size > MAX_BYTES_PER_READ and i > 0:
                    rows, more = rows[:i], True
                    break
            last = rows[-1][0] if rows else position
            if c["sealed"] and last == end:
                next_token = FINISHED
            else:
                next_token = make_token(channel_id, last) if rows else token
            return ReadResult([(r[1], bytes(r[2])) for r in rows], next_token, more)


def _columns(row: Row | None) -> dict[str, Any] | None:
    return None if row is None else {c.name: c.value for c in row.cells}


def _check_columns(cells: Sequence[Cell], pk: Sequence[tuple[str, PrimaryKeyValue]]) -> None:
    pk_names = {n for n, _ in pk}
    for cell in cells:
        if cell.name in pk_names:
            raise param_invalid(f"attribute column {cell.name!r} has the name of a primary-key column")
        if not cell.name:
            raise param_invalid("attribute column name is empty")


def _readable(pk: Sequence[tuple[str, PrimaryKeyValue]]) -> list[Any]:
    return [_to_json(v) for _, v in pk]


def _to_json(value: PrimaryKeyValue) -> Any:
    if isinstance(value, Special):
        return value.name
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    return value


def _from_json(value: Any) -> PrimaryKeyValue:
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    if isinstance(value, bool | int | str):
        return value
    raise param_invalid(f"split_key value {value!r}: expected an integer, a string or {{'b64': ...}}")
