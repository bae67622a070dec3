"""``startingOffsets=snapshot`` with ``snapshot.mode=chunked`` (the default): the PostgreSQL side of
:mod:`cdc.snapshots`. The exported mode's materialisation lives in :mod:`.exported`.

**Start.** The query's slot is created with an exported snapshot (``CREATE_REPLICATION_SLOT ... (SNAPSHOT
'export')``); under that snapshot each table's largest primary key is read, and the export is closed at once.
Changes start at the slot's consistent point, so a key above that largest key was inserted by a change the
slot holds: it is never chunked. The start is kept in ``snapshot.path/<slot>/chunked.json`` so that a
restarted driver, which Spark asks for the initial offset again, gets the same answer.

**Cuts.** A batch that reads chunks creates a temporary logical slot with an exported snapshot on a
replication connection of the driver, as PostgreSQL's own logical replication does to synchronise a table
(tablesync): its consistent point ``C`` is a WAL position, and the exported snapshot holds exactly the
transactions committed before ``C``, whatever order they became visible in. The batch's change range ends at
``C`` exactly; its chunks are read by the executors in their own transactions importing the snapshot (one
chunk's read long) and carry ``_seq = (C << 20) - 1`` (:mod:`.positions`): after every change before ``C``,
before every change at or after it. The driver holds the export (an idle replication connection) until it
plans the next batch, then closes it and the temporary slot goes with it. Creating the slot waits for the
write transactions in flight; past ``snapshot.cutTimeout`` it is cancelled and the batch delivers changes
only (:meth:`PostgresChunkedSnapshot.plan_uncut`), so a long transaction never blocks the query's changes. A
cut needs a replication slot and a WAL sender besides the query's: the start checks that the server has them.

**Chunks** are ``(after, upto]`` ranges of the primary key, in its index's order (:mod:`.keys`), each found by an
index scan of the next ``snapshot.chunkRows`` keys at the cut (so each holds exactly that many rows, the last
one fewer), never past the table's largest key at the start. A chunk's rows go to :class:`cdc.snapshots.store.
ChunkStore` under ``snapshot.path`` before the task hands them to Spark; a retried task imports the same cut,
a replayed batch whose cut is gone (driver killed, server restarted) yields the first complete read's rows or
reads at a new cut, which the next batch learns (:meth:`PostgresChunkedSnapshot.recorded`).
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import adbc_driver_manager as adbc_errors
import psycopg
import pyarrow as pa
from psycopg import sql

from cdc.backend import PlannedRange
from cdc.backends.postgres import connection, keys
from cdc.backends.postgres.catalog import TableInfo
from cdc.backends.postgres.changes import decode_changes
from cdc.backends.postgres.chunks import at_snapshot, fetch_rows, now, read_arrow, reads_arrow, relation
from cdc.backends.postgres.errors import CutLostError
from cdc.backends.postgres.keys import KeyColumn
from cdc.backends.postgres.positions import CHANGES, boundary_after, lsn_of, pack
from cdc.backends.postgres.records import Layout, Record
from cdc.channels import ChannelRange, Position
from cdc.errors import OptionError
from cdc.model import Op
from cdc.options import SecretStr
from cdc.snapshots.holdback import HoldBack, LayoutKeys, rekeyed_to_json
from cdc.snapshots.planning import CHUNK_PREFIX, SnapshotStart
from cdc.snapshots.rows import refresh_batch, with_meta
from cdc.snapshots.state import Cut, Key, Late, SnapshotState
from cdc.snapshots.store import ChunkStore, entry_name, load_start, recorded, save_start

if TYPE_CHECKING:
    from cdc.backends.postgres.backend import PostgresBackend

log = logging.getLogger(__name__)

INVALID_PARAMETER_VALUE = "22023"  # SQLSTATE of SET TRANSACTION SNAPSHOT when the snapshot is gone

START_FILE = "chunked.json"
REKEYED = "rekeyed"
"""The store entry of a batch's re-keyed rows (one change range per batch)."""


def cut_at(lsn: int) -> Cut:
    """The cut of a consistent point: its rows' ``_seq`` is the largest below every change at or after it."""
    return Cut(pack(lsn), pack(lsn) - 1)


@dataclass
class ChunkedReads:
    """What executors need to read a chunked snapshot's ranges (picklable; connections are opened per read)."""

    dsn: SecretStr
    layout: Layout
    store_root: str
    key_columns: Mapping[str, tuple[KeyColumn, ...]]
    cuts: dict[int, tuple[Cut, str]] = field(default_factory=dict)
    """Planned cut position -> the cut actually held for it and its exported snapshot's name."""
    only: frozenset[str] | None = None
    """The tables whose changes a read delivers (``None``: the layout's)."""

    def store(self) -> ChunkStore:
        return ChunkStore(self.store_root)

    def table(self, name: str) -> TableInfo:
        return next(t for t in self.layout.tables if t.name == name)

    def _held(self, planned: Cut) -> tuple[Cut, str]:
        try:
            return self.cuts[int(planned.pos)]
        except KeyError:
            raise CutLostError(
                f"the cut at {planned.pos} this batch reads at is not held by the driver (restarted?): retrying"
            ) from None

    def read_chunk(self, table: str, after: Key | None, upto: Key, window: Mapping[str, Any]) -> pa.Table:
        """The rows of ``(after, upto]`` as of the batch's cut, or of the first complete read of them."""
        planned = Cut.from_json(window["cut"], "chunk window")
        store = self.store()
        name = entry_name(table, after, upto)
        kept = store.get(int(planned.pos), name)
        if kept is not None:
            return kept[0]
        cut, snapshot = self._held(planned)
        info = self.table(table)
        columns = self.key_columns[table]
        channel = CHUNK_PREFIX + table
        schema = self.layout.arrow_schema()
        dsn = self.dsn.get_secret_value()
        try:
            if reads_arrow(self.layout, info):  # the bounds are settings: the driver's COPY takes no parameters
                cond, _ = keys.range_condition(columns, after, upto, as_settings=True)
                data = read_arrow(dsn, snapshot, info, cond, keys.setting_values(after, upto), schema)
                rows = with_meta(schema, data, channel, cut.seq, now())
            else:
                with at_snapshot(dsn, snapshot) as conn:
                    cond, params = keys.range_condition(columns, after, upto)
                    rows = fetch_rows(conn, self.layout, info, cond, params, channel, cut.seq, now())
        except (psycopg.OperationalError, adbc_errors.OperationalError) as exc:
            raise CutLostError(f"reading chunk {channel} at its cut failed: {exc}") from exc
        except (psycopg.errors.InvalidParameterValue, adbc_errors.DataError) as exc:
            if getattr(exc, "sqlstate", INVALID_PARAMETER_VALUE) != INVALID_PARAMETER_VALUE:
                raise
            raise CutLostError(f"the cut of chunk {channel} is gone: {exc}") from exc  # the exported snapshot
        return store.put_once(int(planned.pos), name, rows, {"cut": json.dumps(cut.to_json())})[0]

    def refresh_record(self, table: str, seq: int) -> pa.RecordBatch:
        """The ``refresh`` record that ends a re-snapshot of ``table`` started at ``_seq`` ``seq``
        (:class:`cdc.model.Op`): every row of the table with a smaller sequence is gone at the source."""
        info = self.table(table)
        channel = CHUNK_PREFIX + table
        if self.layout.typed:
            return refresh_batch(self.layout.arrow_schema(), info.keys, channel, seq, now())
        values = tuple(None for _ in info.columns)
        return self.layout.batch([Record(Op.REFRESH, 0, now(), relation(info), values)], channel, seq=seq)

    def read_changes(self, slot: str, publication: str, start: int, end: int,
                     window: Mapping[str, Any]) -> Iterator[pa.RecordBatch]:
        """The change range, holding back the keys not yet emitted (:mod:`cdc.snapshots.holdback`); a batch with a
        cut ends with the rows of the keys re-keyed into, as of the cut."""
        dsn = self.dsn.get_secret_value()
        with connection.connect(dsn) as conn:
            hold = HoldBack(window.get("hold", {}), LayoutKeys(self.layout),
                            lambda t, ks, rs: keys.classify(conn, self.key_columns[t], ks, rs))
            if lsn_of(end) > lsn_of(start):
                connection.check_held(conn, slot, start)
                messages = connection.peek(conn, slot, publication, lsn_of(end))
                for batch in decode_changes(messages, self.layout, CHANGES, start, end, only=self.only):
                    kept = hold.apply(batch)
                    if kept.num_rows:
                        yield kept
            if hold.held:
                log.info("change range [%d, %d): %d records held back for the snapshot", start, end, hold.held)
        if "cut" not in window:
            if hold.rekeyed:
                raise RuntimeError(f"keys re-keyed into in [{start}, {end}) without a cut to read them at")
            return
        planned = Cut.from_json(window["cut"], "change window")
        store = self.store()
        kept_rows = store.get(int(planned.pos), REKEYED)
        if kept_rows is None:
            rows = self._read_rekeyed(planned, hold.rekeyed)
            cut = self.cuts[int(planned.pos)][0] if hold.rekeyed else planned
            meta = {"cut": json.dumps(cut.to_json()), REKEYED: rekeyed_to_json(hold.rekeyed)}
            kept_rows = store.put_once(int(planned.pos), REKEYED, rows, meta)
        yield from kept_rows[0].to_batches()

    def _read_rekeyed(self, planned: Cut, rekeyed: Mapping[str, Sequence[Key]]) -> pa.Table:
        schema = self.layout.arrow_schema()
        if not rekeyed:
            return schema.empty_table()
        cut, snapshot = self._held(planned)
        parts = []
        with at_snapshot(self.dsn.get_secret_value(), snapshot) as conn:
            for table, found in rekeyed.items():
                columns = self.key_columns[table]
                names = sql.SQL(", ").join(sql.Identifier(f"t{i}") for i in range(len(columns)))
                typed = sql.SQL(", ").join(c.cast(sql.Identifier("u", f"t{i}")) for i, c in enumerate(columns))
                cond = sql.SQL("{} IN (SELECT {} FROM unnest({}) AS u({}))").format(
                    keys.row(columns), typed, sql.SQL(", ").join([sql.SQL("%s::text[]")] * len(columns)), names)
                arrays = [[k[i] for k in found] for i in range(len(columns))]
                parts.append(fetch_rows(conn, self.layout, self.table(table), cond, arrays, CHUNK_PREFIX + table,
                                        cut.seq, now()))
        return pa.concat_tables(parts)


class PostgresChunkedSnapshot:
    """The driver side (:class:`cdc.snapshots.planning.ChunkedSnapshot`); one per backend instance."""

    channel = CHANGES

    def __init__(self, backend: PostgresBackend) -> None:
        options = backend.options
        if not options.snapshot_path:
            raise OptionError(
                "option 'snapshot.path' is required with startingOffsets=snapshot: a directory every executor can "
                "write and read, where the rows of the chunks in flight are kept so that a replayed batch yields "
                "the same rows", "snapshot.path",
            )
        self.backend = backend
        self.dsn = options.dsn.get_secret_value()
        self.slot = backend.slot
        self.chunk_rows = options.snapshot_chunk_rows
        self.chunks_per_batch = options.snapshot_chunks_per_batch
        self.timeout = options.snapshot_cut_timeout_s
        self.root = Path(options.snapshot_path) / self.slot
        self.store = ChunkStore(self.root / "cuts")
        self.key_columns = {t.name: keys.key_columns(backend.conn, t) for t in backend.layout.tables}
        self._live: tuple[Cut, connection.ExportedSlot] | None = None
        self._replays: dict[int, tuple[Cut, connection.ExportedSlot]] = {}
        self._made = 0
        self._token = secrets.token_hex(4)

    # ------------------------------------------------------------------ start
    def start(self) -> SnapshotStart:
        conn = self.backend.conn
        self.backend.prepare_publication()
        path = self.root / START_FILE
        kept = load_start(path)
        if kept is not None and connection.state(conn, self.slot) is not None:
            log.info("chunked snapshot of slot %s: resuming the start at %s", self.slot, kept.position)
            return kept
        if connection.state(conn, self.slot) is not None:
            log.warning("replication slot %s exists without a recorded snapshot start: dropping it", self.slot)
            connection.drop_slot(conn, self.slot)
        shutil.rmtree(self.root, ignore_errors=True)
        connection.check_capacity(conn, slots=2, senders=1)
        held = connection.create_exported_slot(self.dsn, self.slot, temporary=False, timeout=None)
        assert held is not None
        try:
            with at_snapshot(self.dsn, held.snapshot) as reader:
                last = {t.name: keys.last_key(reader, t, self.key_columns[t.name]) for t in self.backend.layout.tables}
        finally:
            held.close()
        begun = SnapshotStart(pack(held.lsn), last)
        save_start(path, begun)
        return begun

    # ------------------------------------------------------------------ cuts
    def _create(self, wait: bool) -> tuple[Cut, connection.ExportedSlot] | None:
        self._made += 1
        # Unique per object, not per process: a restarted driver may have the pid of the one before (a
        # container's), and the temporary slot of that one's session lives until the server sees it end.
        name = f"{self.slot[:36]}_cut_{self._token}_{self._made}"
        held = connection.create_exported_slot(self.dsn, name, temporary=True, timeout=None if wait else self.timeout)
        return None if held is None else (cut_at(held.lsn), held)

    def open_cut(self, wait: bool) -> Cut | None:
        self.close_cut()
        made = self._create(wait)
        if made is None:
            log.warning("no cut within snapshot.cutTimeout=%.1f s (write transactions in flight): this batch "
                        "delivers changes only", self.timeout)
            return None
        self._live = made
        return made[0]

    def close_cut(self) -> None:
        if self._live is not None:
            self._live[1].close()
            self._live = None
        for _, held in self._replays.values():
            held.close()
        self._replays.clear()

    def held_cuts(self) -> dict[int, tuple[Cut, str]]:
        """Planned cut position -> (the cut held for it, its exported snapshot), for the executors."""
        out: dict[int, tuple[Cut, str]] = {}
        if self._live is not None:
            out[int(self._live[0].pos)] = (self._live[0], self._live[1].snapshot)
        for planned, (cut, held) in self._replays.items():
            out[planned] = (cut, held.snapshot)
        return out

    def prepare(self, ranges: Sequence[ChannelRange]) -> None:
        windows = [r.window for r in ranges if isinstance(r.window, dict) and "cut" in r.window]
        if not windows:
            return
        planned = Cut.from_json(windows[0]["cut"], "window")
        pos = int(planned.pos)
        if (self._live is not None and self._live[0] == planned) or pos in self._replays:
            return
        names = [entry_name(r.channel[len(CHUNK_PREFIX):], None if r.start is None else tuple(r.start), tuple(r.end))
                 for r in ranges if r.channel.startswith(CHUNK_PREFIX) and r.end]  # (no end: a refresh alone)
        if any(r.channel == CHANGES for r in ranges):
            names.append(REKEYED)
        missing = [n for n in names if self.store.meta(pos, n) is None]
        if not missing:
            return
        made = self._create(wait=True)
        assert made is not None
        log.warning("replaying a batch whose cut at %d is gone: %d of its reads run at a new cut %d", pos,
                    len(missing), made[0].pos)
        self._replays[pos] = made

    def add_tables(self, tables: Sequence[str]) -> tuple[Cut, Mapping[str, Key | None]]:
        """Tables added to the running query (:class:`cdc.snapshots.planning.TableAdder`): the publication carries
        them first, so the cut, whose consistent point comes after that commit in the WAL, starts their changes."""
        self.backend.include(tables)  # committed before the slot of the cut is created
        self.close_cut()
        connection.check_capacity(self.backend.conn, slots=1, senders=1)
        made = self._create(wait=True)
        assert made is not None
        self._live = made
        cut, held = made
        infos = {t.name: t for t in self.backend.layout.tables}
        with at_snapshot(self.dsn, held.snapshot) as reader:
            last = {t: keys.last_key(reader, infos[t], self.key_columns[t]) for t in tables}
        return cut, last

    # ------------------------------------------------------------------ planning
    def bounds(self, table: str, after: Key | None, last: Key, count: int, cut: Cut) -> list[Key]:
        assert self._live is not None and self._live[0] == cut, "chunk bounds are found at the live cut"
        info = next(t for t in self.backend.layout.tables if t.name == table)
        with at_snapshot(self.dsn, self._live[1].snapshot) as conn:
            return keys.next_bounds(conn, info, self.key_columns[table], after, last, self.chunk_rows, count)

    def recorded(self, state: SnapshotState) -> Mapping[str, Sequence[Late]]:
        return recorded(self.store, state, REKEYED)

    def plan_uncut(
        self, start: Position, max_records: int | None, until: Position | None, state: SnapshotState
    ) -> PlannedRange:
        """Changes only, stopping before the first transaction that changes the key of a table still being
        snapshotted: the unchanged values of such a change's new row could only be read at a cut."""
        conn = self.backend.conn
        begin = int(start)
        connection.check_held(conn, self.slot, begin)
        bound = connection.flush_lsn(conn)
        if until is not None:
            bound = min(bound, lsn_of(int(until)))
        relids = [oid for oid, name in self.backend.relation_ids().items() if name in state.tables]
        end, taken = begin, 0
        for commit_lsn, n, rekeys, signals in connection.transaction_sizes(
                conn, self.slot, self.backend.publication, begin, bound, rekeys_of=relids):
            if rekeys:
                log.info("changes stop before the key change committed at %d until a cut is taken", commit_lsn)
                break
            if max_records is not None and taken > 0 and taken + n > max_records:
                break
            taken += n
            end = boundary_after(commit_lsn)
            self.backend.signalled(commit_lsn, signals)
            if max_records is not None and taken >= max_records:
                break
        return PlannedRange(end, taken, False)
