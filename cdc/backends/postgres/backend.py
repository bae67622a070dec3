"""``backend=postgres``: PostgreSQL logical replication (``pgoutput``) as a change log, no Kafka or Debezium.

Design
======
**Channels.** A replication slot is one ordered stream (transactions in commit order), so the backend has
one change channel, ``changes``. With ``startingOffsets=snapshot`` the snapshot's chunks are channels too
(``snapshot:<slot>:<table>:<n>``; :mod:`.snapshot`), delivered before any change (the planner's snapshot
gating) and handed off exactly at the slot's consistent point.

**Positions** are longs: ``commit_lsn << 20 | index of the change in its transaction``
(:mod:`.positions`). ``_seq`` and ``_position`` are the record's position, so ``_seq`` orders every key's
changes. Batch ends always fall between transactions: a transaction is never split across batches, and
one larger than the budget (``maxRecordsPerTrigger``) is taken whole (the budget is soft).

**Repeatable reads until commit.** Planning and reading *peek* the slot
(``pg_logical_slot_peek_binary_changes``) up to the planned end, never consuming it. Planning only counts
each transaction's changes, in SQL, from the messages' first bytes (:func:`.slot.transaction_sizes`); reads
decode pgoutput (:mod:`.pgoutput`). Planning never passes ``pg_current_wal_flush_lsn()``, so every commit below
a planned end is decodable. The slot moves only in :meth:`acknowledge` (Spark's commit of a batch, which
Spark never replays), with ``pg_replication_slot_advance``. A needed position the slot no longer holds
(the slot dropped, invalidated, or advanced by someone else) is :class:`~cdc.errors.DataLossError`, which
``failOnDataLoss`` governs. A forgotten slot retains WAL forever: drop it with ``cdc postgres drop-slot``.

**Slot and publication.** Named by ``slot.name`` / ``publication.name`` or derived stably from the
database, tables and publication; both are created when missing (idempotent: Spark asks a restarted
source for its initial offset again). The publication covers the query's tables. The slot is created
once, when the query first asks for its initial offset: by :meth:`prepare_start`, or with
``startingOffsets=snapshot`` by :meth:`snapshot`, with the exported snapshot (a plain slot made first
would have to be dropped for the export, and each creation waits for the transactions running then to
end). Listing the channel and reading the head (the flushed WAL) need no slot and create none: Spark
asks for Trigger.AvailableNow's target before the initial offset.

**Tables.** Each table must have a primary key (else :class:`~.errors.NoPrimaryKeyError` naming it). One
table: typed columns; several: ``_table``, ``_key``, ``_row`` JSON columns (:mod:`.records`). Unchanged
TOASTed columns of an update become ``_unchanged`` entries, never nulls; TRUNCATE is logged, not delivered.

**Signals.** Planning also reads the slot's logical decoding messages of prefix ``cdc-tunnel`` (:mod:`.signals`,
written by ``cdc postgres resnapshot``): a range that holds a re-snapshot signal for a table of the query is planned
again, the table chunked anew from the batch's cut (:meth:`resnapshots`; the planner, as for an added table, but
nothing held back) and ended by a ``refresh`` record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from cdc.backend import (
    Backend,
    ChannelHead,
    ChannelInfo,
    PlannedRange,
    Position,
    RangeReader,
    SnapshotInfo,
    SourceChange,
)
from cdc.backends.postgres import connection
from cdc.backends.postgres.catalog import describe
from cdc.backends.postgres.exported import CHUNK_PREFIX, export_and_materialise, load_manifest
from cdc.backends.postgres.options import PostgresOptions
from cdc.backends.postgres.positions import CHANGES, boundary_after, lsn_of, pack
from cdc.backends.postgres.reader import PostgresRangeReader
from cdc.backends.postgres.records import Layout
from cdc.backends.postgres.signals import tables_of as resnapshot_tables
from cdc.backends.postgres.snapshot import ChunkedReads, PostgresChunkedSnapshot
from cdc.errors import DataLossError, OptionError, PositionError
from cdc.options import BackendOptions

log = logging.getLogger(__name__)


class PostgresBackend(Backend):
    name = "postgres"
    orders_keys = True  # every key's changes reach the query in sequence order (see Backend.orders_keys)
    options_model = PostgresOptions
    options: PostgresOptions

    def __init__(self, options: PostgresOptions) -> None:
        super().__init__(options)
        self.slot = options.slot
        self.publication = options.publication
        self._conn: psycopg.Connection[Any] | None = None
        conn = self.conn
        self.layout = Layout(tuple(describe(conn, t) for t in options.table_list), options.layout == "json")
        self._published = False
        self._reading: frozenset[str] | None = None
        """The tables a read delivers; ``None``: all of the layout's (see :meth:`resume`)."""
        self._chunks: dict[str, int] = {}
        self._chunked: PostgresChunkedSnapshot | None = None
        self._resnapshots: list[str] = []
        """Tables whose re-snapshot a signal in a change range planned since :meth:`resnapshots` last asked."""
        if options.snapshot_mode == "exported":
            manifest = self._manifest()
            if manifest is not None:
                self._chunks = dict(manifest.chunks)

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connection.connect(self.options.dsn.get_secret_value())
        return self._conn

    def _manifest(self) -> Any:
        path = self.options.snapshot_path
        return load_manifest(Path(path), self.slot) if path else None

    def schema(self) -> pa.Schema:
        return self.layout.arrow_schema()

    def prepare_publication(self) -> None:
        """Create the publication when missing (once per driver; never before :meth:`resume` took the recorded
        names up: a query restarted with other tables keeps its slot and publication)."""
        if not self._published:
            connection.ensure_publication(self.conn, self.publication, self.options.table_list)
            self._published = True

    def prepare_start(self) -> None:
        self.prepare_publication()
        connection.ensure_slot(self.conn, self.slot)

    def source_state(self) -> dict[str, Any]:
        return {"tables": [t.name for t in self.layout.tables], "layout": "typed" if self.layout.typed else "json",
                "slot": self.slot, "publication": self.publication}

    def resume(self, recorded: Mapping[str, Any] | None, *, planning: bool) -> SourceChange:
        """Take up the query's slot and publication as recorded (their default names derive from the tables, which
        may have changed since), and tell the tables added and removed since ``recorded``. A batch planned before
        the change (a replay: ``planning`` false) reads only the tables both sets name."""
        if planning:
            self._resnapshots = []  # signals seen by other planning: only those of the batch planned now count
        if recorded is None:  # an offset of an earlier release names no tables: those not published yet are new
            published = connection.published_tables(self.conn, self.publication)
            added = tuple(t.name for t in self.layout.tables if t.name not in published) if published else ()
            if added and planning:
                self._check_change({}, [], added)
            self.prepare_publication()
            return SourceChange(added)
        if not self.options.slot_name:
            self.slot = str(recorded.get("slot", self.slot))
        if not self.options.publication_name:
            self.publication = str(recorded.get("publication", self.publication))
        before = [str(t) for t in recorded.get("tables", [])]
        now = [t.name for t in self.layout.tables]
        added = tuple(t for t in now if t not in before)
        removed = tuple(t for t in before if t not in now)
        self._reading = None if not removed and not added else frozenset(before) & frozenset(now)
        if planning:
            self._reading = None
            self._check_change(recorded, before, added)
        self.prepare_publication()
        if (added or removed) and planning:
            log.info("tables of the query: %s (added %s, removed %s)", now, list(added) or "none",
                     list(removed) or "none")
        return SourceChange(added, removed)

    def _check_change(self, recorded: Mapping[str, Any], before: Sequence[str], added: Sequence[str]) -> None:
        layout = "typed" if self.layout.typed else "json"
        if recorded.get("layout", layout) != layout:
            if recorded.get("layout") == "typed":
                raise OptionError(
                    f"option 'tables': the query reads the one table {before[0]!r} in the typed layout, and adding "
                    f"{list(added)} would turn it into a many-table query, whose records have other columns. Start "
                    "a new query (new checkpoint) in the many-table layout (option layout=json, which a one-table "
                    "query can use too), then add tables to it on a restart", "tables")
            raise OptionError(
                f"option 'tables': the query reads {list(before)} in the many-table layout; reading only "
                f"{[t.name for t in self.layout.tables]} would change its records to the typed layout. Keep the "
                "many-table layout with option layout=json", "layout")
        if added and self.options.snapshot_mode != "chunked":
            raise OptionError(
                f"option 'snapshot.mode': tables {list(added)} added to the running query are snapshotted in chunks; "
                "accepted value: chunked (the default)", "snapshot.mode")
        if added and not self.options.snapshot_path:
            raise OptionError(
                f"option 'snapshot.path' is required to add tables {list(added)} to the running query: a directory "
                "every executor can write and read, where the rows of their chunks in flight are kept",
                "snapshot.path")

    def include(self, tables: Sequence[str]) -> None:
        """Make the query's publication carry ``tables`` before their snapshot's cut is taken. Its own publication
        (``publication.name`` not given) gets them added; a publication the user names must already hold them."""
        published = connection.published_tables(self.conn, self.publication)
        missing = [t for t in tables if t not in published]
        if not missing:
            return
        if self.options.publication_name:
            names = ", ".join(missing)
            raise OptionError(
                f"option 'tables': {missing} are not in publication {self.publication!r}, which the query does not "
                f"manage (option 'publication.name'): run ALTER PUBLICATION {self.publication} ADD TABLE {names}; "
                "then restart the query", "tables")
        connection.add_to_publication(self.conn, self.publication, missing)

    def list_channels(self) -> Sequence[ChannelInfo]:
        return [ChannelInfo(CHANGES)]

    def earliest(self, channel: str) -> Position:
        if channel.startswith(CHUNK_PREFIX):
            return 0
        connection.ensure_slot(self.conn, self.slot)
        st = connection.state(self.conn, self.slot)
        assert st is not None
        return pack(st.confirmed_lsn)

    def latest(self, channel: str) -> Position:
        if channel.startswith(CHUNK_PREFIX):
            return self._chunk_rows(channel)
        return pack(connection.flush_lsn(self.conn))

    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        """The WAL flushed so far is the head; how far behind is in WAL bytes (``walBytesBehind``): counting the
        changes would decode the WAL a second time each trigger. Snapshot chunks count their rows."""
        out: dict[str, ChannelHead] = {}
        for cid, pos in positions.items():
            head = self.latest(cid)
            if cid.startswith(CHUNK_PREFIX):
                out[cid] = ChannelHead(head, max(0, int(head) - int(pos)))
            else:
                wal = float(max(0, lsn_of(head) - lsn_of(pos)))
                out[cid] = ChannelHead(head, None, measures={"walBytesBehind": wal})
        return out

    def _chunk_rows(self, channel: str) -> int:
        if channel not in self._chunks:
            manifest = self._manifest()
            if manifest is None or channel not in manifest.chunks:
                raise DataLossError(f"snapshot chunk {channel!r} is not under snapshot.path any more", channel)
            self._chunks.update(manifest.chunks)
        return self._chunks[channel]

    def parse_position(self, channel: str, value: Any) -> Position:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PositionError(
                f"channel {channel!r}: a postgres position is a long (commit LSN << 20 | index) >= 0, got {value!r}"
            )
        return value

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        begin = int(start)
        if channel.startswith(CHUNK_PREFIX):
            rows = self._chunk_rows(channel)
            end = rows if until is None else min(rows, max(begin, int(until)))
            if max_records is not None:
                end = min(end, begin + max_records)
            return PlannedRange(end, end - begin, end == rows)
        if channel != CHANGES:
            raise PositionError(f"backend postgres has no channel {channel!r}; channels: {CHANGES}")
        conn = self.conn
        connection.check_held(conn, self.slot, begin)
        bound = connection.flush_lsn(conn)
        if until is not None:
            bound = min(bound, lsn_of(int(until)))
        end, taken = begin, 0
        if max_records != 0:
            for commit_lsn, n, _, signals in connection.transaction_sizes(conn, self.slot, self.publication, begin,
                                                                          bound):
                if max_records is not None and taken > 0 and taken + n > max_records:
                    break
                taken += n
                end = boundary_after(commit_lsn)
                self.signalled(commit_lsn, signals)
                if max_records is not None and taken >= max_records:
                    break
        return PlannedRange(end, taken, False)

    def signalled(self, commit_lsn: int, signals: Sequence[bytes]) -> None:
        """Take the signals of a transaction a planned change range includes (:mod:`.signals`)."""
        if signals:
            for table in resnapshot_tables(signals, commit_lsn, [t.name for t in self.layout.tables], self.slot):
                if table not in self._resnapshots:
                    self._resnapshots.append(table)

    def resnapshots(self) -> tuple[str, ...]:
        """The tables whose re-snapshot the signals in the change ranges planned since the last call ask for (see
        :meth:`cdc.backend.Backend.resnapshots`). A query that cannot snapshot in chunks logs them and gets none."""
        tables, self._resnapshots = tuple(self._resnapshots), []
        if tables and (self.options.snapshot_mode != "chunked" or not self.options.snapshot_path):
            log.warning(
                "ignoring the re-snapshot signal for %s: a re-snapshot is read in chunks, which needs options "
                "snapshot.mode=chunked (the default) and snapshot.path (a directory every executor can write and "
                "read); restart the query with them and signal again", list(tables))
            return ()
        return tables

    def snapshot(self) -> SnapshotInfo:
        if not self.options.snapshot_path:
            raise OptionError(
                "option 'snapshot.path' is required with startingOffsets=snapshot: a directory every executor can "
                "read, where the exported snapshot is materialised so that replayed batches read the same rows",
                "snapshot.path",
            )
        root = Path(self.options.snapshot_path)
        self.prepare_publication()
        manifest = self._manifest()
        if manifest is None or connection.state(self.conn, self.slot) is None:
            manifest = export_and_materialise(
                self.options.dsn.get_secret_value(), self.slot, self.publication, self.layout, root,
                self.options.snapshot_chunk_rows, self.options.snapshot_parallelism,
            )
        else:
            log.info("reusing the materialised snapshot of slot %s", self.slot)
        self._chunks = dict(manifest.chunks)
        return SnapshotInfo(self.slot, tuple(manifest.chunks), {CHANGES: pack(manifest.cut_lsn)})

    def chunked_snapshot(self) -> PostgresChunkedSnapshot | None:
        if self.options.snapshot_mode != "chunked":
            return None
        if self._chunked is None:
            self._chunked = PostgresChunkedSnapshot(self)
        return self._chunked

    def relation_ids(self) -> dict[int, str]:
        """The query's tables by their OIDs (pgoutput names relations by OID)."""
        return {int(self.conn.execute("SELECT %s::regclass::oid", (t.name,)).fetchone()[0]): t.name  # type: ignore[index]
                for t in self.layout.tables}

    @classmethod
    def split_refusal(cls, options: BackendOptions) -> str | None:
        return (
            "its changes come through one replication slot, which a reader peeks from the slot's confirmed "
            "position only, so a range's middle is reached only by reading up to it (a snapshot is read in "
            "chunks, one task each)"
        )

    def reader(self) -> RangeReader:
        chunked = None
        if self._chunked is not None:
            c = self._chunked
            chunked = ChunkedReads(self.options.dsn, self.layout, str(c.store.root), c.key_columns, c.held_cuts(),
                                   self._reading)
        return PostgresRangeReader(
            self.options.dsn, self.slot, self.publication, self.layout, self.options.snapshot_path, chunked,
            self._reading,
        )

    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        if CHANGES in positions:
            connection.advance(self.conn, self.slot, int(positions[CHANGES]))
            if self._chunked is not None:  # the chunk reads of batches before the committed one are not read again
                self._chunked.store.cleanup(int(positions[CHANGES]))

    def close(self) -> None:
        if self._chunked is not None:
            self._chunked.close_cut()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
