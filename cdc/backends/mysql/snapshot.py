"""``startingOffsets=snapshot``: the MariaDB side of the chunked snapshot (:mod:`cdc.snapshots`).

**The visibility rule.** InnoDB's commit order in the binary log is not the order in which transactions
become visible to a new read view: a transaction is written to the binary log, then committed in the engine,
so a read view opened at any moment may miss a transaction the binary log already holds (or, read the other
way round, see one that the position read before it did not include). Neither ``SHOW MASTER STATUS`` read
after ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` nor one read before it is the snapshot's position. A
cut is therefore a ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` whose position is read from the same
transaction's ``Binlog_snapshot_file`` and ``Binlog_snapshot_position`` status: MariaDB takes the read view
and that binary log position together, under the lock that orders commits in the engine as in the binary log,
so the read view holds exactly the transactions before the position. MySQL has no such status (its
``performance_schema.log_status`` is not tied to a read view): the chunked snapshot is refused there, naming
the reason.

**Start.** One consistent snapshot reads each table's largest primary key; its position is where changes
start, so a key above the largest was inserted by a change the query reads. The start is kept under
``snapshot.path`` so that a restarted driver, asked for the initial offset again, gets the same one (while the
server still has the binary log it needs; else a new start is taken).

**Cuts and chunks.** A batch that reads chunks opens a cut ``P`` on the driver (a consistent-snapshot
transaction, held until the next batch is planned): the batch's change range ends exactly at ``P`` and its
chunk bounds are found in it, an index scan of ``snapshot.chunkRows`` keys each. MariaDB cannot hand a read
view to another connection, so the chunks of the batch are read on the driver when Spark asks for the batch's
partitions, and kept in :class:`cdc.snapshots.store.ChunkStore` (write-once files); the tasks yield the kept
rows. A table with an integer key is read by ``connectorx`` (:mod:`.arrowread`) at a consistent snapshot of
its own, whose position the file records as a late read's (below); any other, or when ``connectorx`` cannot
(TLS, an error), in the cut's own transaction. Rows carry ``_seq = P - 1``: a record's position is its rows event's
offset, which lies below the end of its transaction, so every change before ``P`` is below ``P - 1`` and every
change at or after ``P`` above it. A replayed batch whose cut is gone (the driver restarted) reads its missing
chunks at a new consistent snapshot ``Q`` (exact as well), which the file records: the next batch's planning
learns it and holds back those keys' changes up to ``Q`` (:class:`cdc.snapshots.Late`).

**Batch reads.** Since the driver reads every chunk anyway, a batch read (``spark.read``) plans the whole
snapshot when Spark plans it (:meth:`cdc.planner.Planner.chunked_batch`): the batches a streaming query would
run, each cut's chunks read and kept before the next cut opens, in a directory of the read's own under
``snapshot.path/batch-reads`` (never a streaming query's start or files). The tasks read the kept files, and
a file missing there fails the read (no later batch could hold back what a read at a new cut includes).

Every row event carries the whole row (``binlog_row_image=FULL``), so a key change's insert is always whole:
no key is ever re-keyed (:mod:`cdc.snapshots.holdback`), and a batch without a cut plans its changes as usual.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pymysql

from cdc.backend import PlannedRange
from cdc.backends.mysql import arrowread, connection, keys
from cdc.backends.mysql.catalog import TableInfo
from cdc.backends.mysql.errors import ServerSettingError
from cdc.backends.mysql.keys import KeyColumn
from cdc.backends.mysql.options import Endpoint
from cdc.backends.mysql.positions import file_number, file_of, pack
from cdc.backends.mysql.records import JSON_KEY, JSON_ROW, JSON_TABLE, Layout, json_texts
from cdc.backends.mysql.values import from_text
from cdc.channels import ChannelRange, Position
from cdc.errors import DataLossError, OptionError
from cdc.model import Op
from cdc.snapshots.holdback import HoldBack, LayoutKeys
from cdc.snapshots.planning import CHUNK_PREFIX, SnapshotStart
from cdc.snapshots.rows import with_meta
from cdc.snapshots.state import Cut, Key, Late, SnapshotState
from cdc.snapshots.store import ChunkStore, entry_name, load_start, recorded, save_start

if TYPE_CHECKING:
    from cdc.backends.mysql.backend import MySQLBackend

log = logging.getLogger(__name__)

START_FILE = "start.json"
BATCH_READS = "batch-reads"
"""Under ``snapshot.path``: one directory per batch read's snapshot, apart from every streaming query's."""
FETCH_ROWS = 50_000

after_snapshot_start: Callable[[], None] | None = None
"""Tests only: called between ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and reading its position (a commit
made there is in the binary log before ``SHOW MASTER STATUS`` but not in the read view)."""


def cut_at(position: int) -> Cut:
    """The cut of a consistent snapshot at ``position``: its rows' ``_seq`` is below every change at or after it."""
    return Cut(position, position - 1)


def open_snapshot(endpoint: Endpoint) -> tuple[Any, int]:
    """A connection (values unconverted, times in UTC) inside a consistent-snapshot transaction, and the binary
    log position its read view holds exactly (see the module's rule)."""
    conn = connection.connect(endpoint, raw=True)
    try:
        connection.query(conn, "SET SESSION time_zone = '+00:00'")
        connection.query(conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        connection.query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        if after_snapshot_start is not None:
            after_snapshot_start()
        status = {str(k): v for k, v in connection.query(conn, "SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")}
        name, offset = status.get("Binlog_snapshot_file"), status.get("Binlog_snapshot_position")
        if not name or offset is None:
            raise ServerSettingError(
                "startingOffsets=snapshot needs the binary log position of a consistent snapshot "
                "(MariaDB's Binlog_snapshot_file and Binlog_snapshot_position status), which this server does not "
                "report (MySQL): start from 'earliest' or 'latest' after copying the tables", "startingOffsets")
        return conn, pack(file_number(_text(name)), int(_text(offset)))
    except BaseException:
        conn.close()
        raise


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def fetch_rows(conn: Any, info: TableInfo, cond: str, params: Sequence[Any]) -> pa.Table:
    """The rows of ``info`` meeting ``cond`` in the connection's transaction, as its columns' Arrow types
    (PyMySQL: every value decoded in Python)."""
    names = [n for n, _ in info.columns]
    select = ", ".join(keys.quote(n) for n in names)
    raw: list[list[Any]] = [[] for _ in names]
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(f"SELECT {select} FROM {keys.table_name(info)} WHERE {cond}", tuple(params))
        while True:
            got = cur.fetchmany(FETCH_ROWS)
            if not got:
                break
            for j, values in enumerate(zip(*got, strict=True)):
                raw[j].extend(values)
    return pa.table([from_text(t, raw[j], t.arrow()) for j, (_, t) in enumerate(info.columns)], names=names)


def as_records(layout: Layout, info: TableInfo, data: pa.Table, channel: str, seq: int) -> pa.Table:
    """A table's rows (its columns' Arrow types) as snapshot records of the layout."""
    names = [n for n, _ in info.columns]
    schema = layout.arrow_schema()
    when = datetime.now(UTC)
    if not layout.typed:
        n = data.num_rows
        texts = [data.column(name).to_pylist() for name in names]
        key_texts, rows = json_texts(names, texts, info.keys, [Op.INSERT.value] * n)
        data = pa.table({JSON_TABLE: pa.repeat(pa.scalar(info.name, pa.string()), n),
                         JSON_KEY: pa.array(key_texts, pa.string()), JSON_ROW: pa.array(rows, pa.string())})
    return with_meta(schema, data, channel, seq, when)


def read_rows(conn: Any, layout: Layout, info: TableInfo, columns: Sequence[KeyColumn], cond: str,
              params: Sequence[Any], channel: str, seq: int) -> pa.Table:
    """The rows of ``info`` meeting ``cond`` in the connection's transaction, as snapshot records of the layout."""
    return as_records(layout, info, fetch_rows(conn, info, cond, params), channel, seq)


def _plain(endpoint: Endpoint, conn: Any) -> bool:
    """The driver's connection runs without TLS, as a ``connectorx`` one would (it is given no TLS settings)."""
    if endpoint.ssl_mode not in ("disabled", "preferred"):
        return False
    cipher = connection.query(conn, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    return not cipher or not _text(cipher[0][1])


@dataclass
class ChunkedReads:
    """What executors need to read a chunked snapshot's ranges (picklable; connections are opened per read)."""

    endpoint: Endpoint
    layout: Layout
    store_root: str
    key_columns: Mapping[str, tuple[KeyColumn, ...]]
    batch_read: bool = False
    """The chunks belong to a batch read, whose driver read and kept every one before any task ran: a chunk not
    found was removed since, and no later batch could hold back what a read at a new cut would include."""

    def store(self) -> ChunkStore:
        return ChunkStore(self.store_root)

    def table(self, name: str) -> TableInfo:
        return next(t for t in self.layout.tables if t.name == name)

    def read_at(self, conn: Any, cut: Cut, table: str, after: Key | None, upto: Key) -> tuple[pa.Table, Cut]:
        """The rows of ``(after, upto]`` and the cut they were read at: by ``connectorx`` at a consistent snapshot
        of its own when it can read the table exactly (:mod:`.arrowread`), else in ``conn``'s consistent snapshot,
        whose position is ``cut``'s."""
        info, columns = self.table(table), self.key_columns[table]
        if arrowread.usable(columns) and _plain(self.endpoint, conn):
            try:
                data, position = arrowread.read(self.endpoint, info, columns, after, upto)
            except Exception as exc:  # noqa: BLE001 - any failure of the fast path falls back to the exact one
                log.warning("chunk (%s, %s] of %s: connectorx could not read it (%s: %s); reading it with PyMySQL",
                            after, upto, table, type(exc).__name__, str(exc)[:300])
            else:
                at = cut_at(position)
                return as_records(self.layout, info, data, CHUNK_PREFIX + table, at.seq), at
        cond, params = keys.range_condition(columns, after, upto)
        return read_rows(conn, self.layout, info, columns, cond, params, CHUNK_PREFIX + table, cut.seq), cut

    def keep(self, planned: Cut, table: str, after: Key | None, upto: Key, read: tuple[pa.Table, Cut]) -> pa.Table:
        rows, cut = read
        return self.store().put_once(int(planned.pos), entry_name(table, after, upto), rows,
                                     {"cut": json.dumps(cut.to_json())})[0]

    def read_chunk(self, table: str, after: Key | None, upto: Key, window: Mapping[str, Any]) -> pa.Table:
        """The rows the batch's planning kept for ``(after, upto]``; a read that finds none (the driver could not
        keep them) reads at a consistent snapshot of its own, which the file records for the next batch."""
        planned = Cut.from_json(window["cut"], "chunk window")
        kept = self.store().get(int(planned.pos), entry_name(table, after, upto))
        if kept is not None:
            return kept[0]
        if self.batch_read:
            raise DataLossError(
                f"chunk ({after}, {upto}] of {table}: the batch read's snapshot files under {self.store_root} were "
                "removed while the read ran; run the read again", CHUNK_PREFIX + table)
        conn, position = open_snapshot(self.endpoint)
        try:
            cut = cut_at(position)
            log.warning("chunk (%s, %s] of %s was not kept by the driver: reading it at %d", after, upto, table,
                        position)
            return self.keep(planned, table, after, upto, self.read_at(conn, cut, table, after, upto))
        finally:
            conn.close()

    def hold(self, window: Mapping[str, Any], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The change batches without the records of keys not emitted yet (:mod:`cdc.snapshots.holdback`)."""
        conn: Any = None

        def classify(table: str, values: Sequence[tuple[Any, ...]],
                     ranges: Sequence[tuple[Key | None, Key]]) -> tuple[list[Key], list[list[bool]]]:
            nonlocal conn
            columns = self.key_columns[table]
            if conn is None and not keys.python_ordered(columns):
                conn = connection.connect(self.endpoint)
            return keys.classify(conn, columns, values, ranges)

        hold = HoldBack(window.get("hold", {}), LayoutKeys(self.layout), classify)
        try:
            for batch in batches:
                kept = hold.apply(batch)
                if kept.num_rows:
                    yield kept
        finally:
            if conn is not None:
                conn.close()
        if hold.rekeyed:  # whole row images: an insert is never partial, so nothing is re-keyed
            raise RuntimeError(f"keys re-keyed into without a row to read: {sorted(hold.rekeyed)}")
        if hold.held:
            log.info("change range: %d records held back for the snapshot", hold.held)


def query_id(endpoint: Endpoint, tables: Sequence[str]) -> str:
    """A directory name under ``snapshot.path`` for a query's server and tables."""
    return hashlib.sha1(json.dumps([endpoint.host, endpoint.port, sorted(tables)]).encode()).hexdigest()[:16]


def prune_batch_reads(reads: Path, hours: float) -> None:
    """Remove the batch reads' directories under ``reads`` last written more than ``hours`` ago (0: none)."""
    if hours <= 0 or not reads.is_dir():
        return
    horizon = time.time() - hours * 3600
    for entry in reads.iterdir():
        try:
            old = entry.is_dir() and entry.stat().st_mtime < horizon
        except FileNotFoundError:
            continue
        if old:
            log.info("removing batch read snapshot %s (older than snapshot.batchReadRetentionHours=%s)", entry, hours)
            shutil.rmtree(entry, ignore_errors=True)


class MySQLChunkedSnapshot:
    """The driver side (:class:`cdc.snapshots.planning.ChunkedSnapshot`); one per backend instance."""

    def __init__(self, backend: MySQLBackend, batch_read: bool = False) -> None:
        options = backend.options
        if not options.snapshot_path:
            raise OptionError(
                "option 'snapshot.path' is required with startingOffsets=snapshot: a directory the driver and every "
                "executor can write and read, where the rows of the chunks in flight are kept so that a replayed "
                "batch yields the same rows", "snapshot.path")
        if not backend.server.mariadb:
            raise ServerSettingError(
                f"startingOffsets=snapshot needs MariaDB (this server is {backend.server.version}): MySQL does not "
                "report the binary log position of a consistent snapshot; start from 'earliest' or 'latest' after "
                "copying the tables", "startingOffsets")
        from cdc.backends.mysql.reader import CHANGES

        self.channel = CHANGES
        self.backend = backend
        self.endpoint = backend.endpoint
        self.chunk_rows = options.snapshot_chunk_rows
        self.chunks_per_batch = options.snapshot_chunks_per_batch
        self.root = Path(options.snapshot_path) / query_id(self.endpoint, options.table_list)
        self.batch_read = batch_read
        if batch_read:  # a start of its own, never a streaming query's (nor its files)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            reads = Path(options.snapshot_path) / BATCH_READS
            prune_batch_reads(reads, options.snapshot_batch_read_retention_hours)
            self.root = reads / f"{self.root.name}-{stamp}-{uuid.uuid4().hex[:8]}"
        self.store = ChunkStore(self.root / "cuts")
        self.key_columns = {t.name: keys.key_columns(backend.conn, t) for t in backend.layout.tables}
        self._live: tuple[Cut, Any] | None = None

    def reads(self) -> ChunkedReads:
        return ChunkedReads(self.endpoint, self.backend.layout, str(self.store.root), self.key_columns,
                            self.batch_read)

    # ------------------------------------------------------------------ start
    def start(self) -> SnapshotStart:
        path = self.root / START_FILE
        kept = load_start(path)
        if kept is not None and file_of(int(kept.position)) in connection.binary_logs(self.backend.conn):
            log.info("chunked snapshot: resuming the start at %s", kept.position)
            return kept
        shutil.rmtree(self.root, ignore_errors=True)
        conn, position = open_snapshot(self.endpoint)
        try:
            last = {t.name: keys.last_key(conn, t, self.key_columns[t.name]) for t in self.backend.layout.tables}
        finally:
            conn.close()
        begun = SnapshotStart(position, last)
        save_start(path, begun)
        return begun

    # ------------------------------------------------------------------ cuts
    def open_cut(self, wait: bool) -> Cut | None:
        self.close_cut()
        conn, position = open_snapshot(self.endpoint)
        self._live = (cut_at(position), conn)
        return self._live[0]

    def close_cut(self) -> None:
        if self._live is not None:
            self._live[1].close()
            self._live = None

    def prepare(self, ranges: Sequence[ChannelRange]) -> None:
        """Read the batch's chunks that no read kept yet: in the live cut's transaction when it is the batch's,
        else (a replay whose cut is gone) at a new consistent snapshot, which the files record."""
        chunks = [r for r in ranges if r.channel.startswith(CHUNK_PREFIX) and isinstance(r.window, dict)]
        if not chunks:
            return
        planned = Cut.from_json(chunks[0].window["cut"], "window")
        reads = self.reads()
        missing = [(r.channel[len(CHUNK_PREFIX):], None if r.start is None else tuple(r.start), tuple(r.end))
                   for r in chunks]
        missing = [m for m in missing if self.store.meta(int(planned.pos), entry_name(*m)) is None]
        if not missing:
            return
        own = None
        if self._live is not None and self._live[0] == planned:
            cut, conn = self._live
        else:
            conn, position = open_snapshot(self.endpoint)
            own, cut = conn, cut_at(position)
            log.warning("replaying a batch whose cut at %d is gone: %d of its chunks read at a new cut %d",
                        planned.pos, len(missing), position)
        try:
            for table, after, upto in missing:
                reads.keep(planned, table, after, upto, reads.read_at(conn, cut, table, after, upto))
        finally:
            if own is not None:
                own.close()

    # ------------------------------------------------------------------ planning
    def bounds(self, table: str, after: Key | None, last: Key, count: int, cut: Cut) -> list[Key]:
        assert self._live is not None and self._live[0] == cut, "chunk bounds are found at the live cut"
        info = next(t for t in self.backend.layout.tables if t.name == table)
        return keys.next_bounds(self._live[1], info, self.key_columns[table], after, last, self.chunk_rows, count)

    def recorded(self, state: SnapshotState) -> Mapping[str, Sequence[Late]]:
        return recorded(self.store, state, None)

    def plan_uncut(self, start: Position, max_records: int | None, until: Position | None,
                   state: SnapshotState) -> PlannedRange:
        """Changes as usual (never needed: a cut always opens at once)."""
        return self.backend.plan(self.channel, start, max_records, until)
