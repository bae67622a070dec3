"""What a backend provides for chunked snapshots (:class:`ChunkedSnapshot`), and the planner's pure steps over
the cursors of :mod:`.state`.

A batch of a chunked snapshot either reads chunks or it does not:

* **With a cut.** The backend opens a :class:`~.state.Cut` (PostgreSQL: a temporary replication slot whose
  exported snapshot holds exactly the transactions committed before its consistent point). The batch's change
  range ends exactly at the cut's position, and its chunks, read at the cut by the executors, carry
  ``_seq = cut.seq``: after every change before the cut, before every change at or after it. Each table's
  cursor moves past the batch's chunks (:func:`advance`).
* **Without one** (the backend could not open a cut in time: PostgreSQL waits for the write transactions in
  flight), the batch delivers changes only, planned by :meth:`ChunkedSnapshot.plan_uncut`.

A batch opens a cut even when every chunk has been read, as long as late entries (reads at a later cut than
planned) still hold keys back: a key change out of a held key into one that is not held is completed by
reading the new key's row, which needs a cut.

Either way the change range holds back the changes of every key no chunk has emitted yet (see
:mod:`.holdback`): the chunk that emits the key later includes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from cdc.backend import PlannedRange
from cdc.channels import ChannelRange, Position
from cdc.errors import OptionError
from cdc.snapshots.state import Chunk, Cut, Key, Late, SnapshotState, TableCursor

DEFAULT_CHUNK_ROWS = 100_000
"""``snapshot.chunkRows``'s default: a chunk is one Spark task, read whole into its Python worker (about 100 MB
for rows of 1 kB). Larger chunks read faster (each chunk costs a task, a connection and a key-range query:
250k-row chunks read 10M rows about a quarter faster) but hold more memory in each task, and in local mode in
the driver's JVM, where the tasks run."""

DEFAULT_CHUNKS_PER_BATCH = 16
"""``snapshot.chunksPerBatch``'s default: each batch costs a cut and the micro-batch's own logs (about 0.3 s),
so a snapshot goes in few, large batches; the changes between batches wait for one (1.6M rows by default)."""

CHUNK_PREFIX = "chunk:"
"""Chunk ranges are named ``chunk:<table>`` (never a channel the backend lists)."""


def chunk_channel(table: str) -> str:
    return CHUNK_PREFIX + table


@dataclass(frozen=True)
class SnapshotStart:
    """Where a chunked snapshot starts: the change channel's position, and each table's largest key there
    (``None``: the table was empty, so every row of it arrives as a change)."""

    position: Position
    last: Mapping[str, Key | None]


class ChunkedSnapshot(Protocol):
    """A backend's chunked snapshot (``Backend.chunked_snapshot()``). Its change channel's positions are longs
    that order like ``_seq``."""

    channel: str
    """The change channel a cut is a position of."""
    chunk_rows: int
    """Rows per chunk (a chunk holds at most twice as many)."""
    chunks_per_batch: int
    """Chunks a batch reads at most (fewer under ``maxRecordsPerTrigger``)."""

    def start(self) -> SnapshotStart:
        """Set the query's change log up and read each table's largest key, consistently with its start:
        every key above it is inserted by a change at or after the start position. Idempotent per query (a
        restarted driver asks again and must get the same answer while the query has logged batches)."""

    def open_cut(self, wait: bool) -> Cut | None:
        """A cut to read chunks at, held until :meth:`close_cut`; ``None`` if it could not be opened in time
        (``wait``: block until it can, for batch reads and Trigger.AvailableNow, whose planning cannot skip)."""

    def close_cut(self) -> None:
        """Release the cut opened last, if any (the planner calls it when it plans the next batch)."""

    def bounds(self, table: str, after: Key | None, last: Key, count: int, cut: Cut) -> list[Key]:
        """Up to ``count`` chunk upper bounds after ``after`` (ascending, each chunk at most twice the chunk
        size as of ``cut``); the last one is ``last`` when the rest of the table fits."""

    def recorded(self, state: SnapshotState) -> Mapping[str, Sequence[Late]]:
        """After the batch whose end offset holds ``state`` ran: the late entries its reads recorded (a chunk or
        re-read rows read at another cut than ``state.cut``)."""

    def plan_uncut(
        self, start: Position, max_records: int | None, until: Position | None, state: SnapshotState
    ) -> PlannedRange:
        """Plan a change range for a batch that has no cut while ``state``'s tables are being snapshotted or
        hold late entries: it must be deliverable without a cut (PostgreSQL: stop before a transaction that changes the key of
        such a table, whose unchanged values could only be read at a cut)."""

    def prepare(self, ranges: Sequence[ChannelRange]) -> None:
        """Before the executors read ``ranges`` (a batch, or its replay): make sure their cut can be read."""


@runtime_checkable
class TableAdder(Protocol):
    """A chunked snapshot that can take tables added to a running query (PostgreSQL's)."""

    def add_tables(self, tables: Sequence[str]) -> tuple[Cut, Mapping[str, Key | None]]:
        """Make the change log carry ``tables`` (PostgreSQL: add them to the query's publication), then open a cut
        after that, held like :meth:`ChunkedSnapshot.open_cut`'s (waiting as long as it takes), and read each
        table's largest key at it (``None``: empty). Every change of these tables at or after the cut's position
        is in the change log; their snapshot starts at the cut."""


def add_tables(
    state: SnapshotState, chunked: ChunkedSnapshot, added: Sequence[str], redo: Sequence[str] = ()
) -> tuple[Cut, SnapshotState]:
    """The cut the tables added to a running query start at (:meth:`TableAdder.add_tables`), and ``state`` with
    them: each holds back all of its changes before the cut (a late entry for every key) and, unless it was
    empty, is chunked up to its largest key at the cut. Tables to snapshot again (``redo``: already streaming,
    a re-snapshot) are chunked the same way from the same cut, but hold nothing back but the late entries they
    had: their changes keep being delivered, and their cursors record the cut's ``_seq`` (``refresh``), below
    every row the re-snapshot delivers."""
    if not isinstance(chunked, TableAdder):
        raise OptionError(f"option 'tables': this backend cannot add tables {sorted([*added, *redo])} to a running "
                          "query: start a new query (new checkpoint) with them", "tables")
    cut, last = chunked.add_tables([*added, *redo])
    tables = dict(state.tables)
    for name, key in last.items():
        if name in redo:  # (late entries of an earlier snapshot of it still hold)
            old = state.tables.get(name)
            tables[name] = TableCursor(key, done=key is None, late=old.late if old else (), refresh=cut.seq)
        else:
            tables[name] = TableCursor(key, done=key is None, late=(Late(cut, every=True),))
    return cut, SnapshotState(tables, state.cut)


def advance(state: SnapshotState, cut: Cut, bounds: Callable[[str, TableCursor, int], list[Key]], want: int) -> SnapshotState:
    """The state after a batch that reads up to ``want`` chunks at ``cut``, table by table in order: each table's
    chunks come from ``bounds(table, cursor, count)``; a table whose last chunk is read is ``done``."""
    tables: dict[str, TableCursor] = {}
    for name, cursor in state.tables.items():
        if cursor.done or want <= 0:
            tables[name] = cursor
            continue
        chunks = []
        after = cursor.after
        for upto in bounds(name, cursor, want):
            chunks.append(Chunk(after, upto))
            after = upto
        want -= len(chunks)
        tables[name] = replace(cursor, after=after, done=after == cursor.last, chunks=tuple(chunks))
    return SnapshotState(tables, cut)


def expire(state: SnapshotState, position: int) -> SnapshotState:
    """Late entries a change range from ``position`` on can no longer meet are dropped (then finished tables)."""
    tables = {n: replace(t, late=tuple(e for e in t.late if int(e.cut.pos) > position)) for n, t in state.tables.items()}
    return SnapshotState({n: t for n, t in tables.items() if t.holds}, state.cut)


def chunk_ranges(state: SnapshotState) -> list[ChannelRange]:
    """The chunk reads of the batch whose end offset holds ``state``: ``chunk:<table>`` ranges ``(after, upto]``
    whose window names the cut."""
    if state.cut is None:
        return []
    window = {"cut": state.cut.to_json()}
    out = []
    for name, t in state.tables.items():
        for c in t.chunks:
            last = t.refresh is not None and c.upto == t.last  # a re-snapshot's last chunk ends with its refresh
            out.append(ChannelRange(chunk_channel(name), None if c.after is None else list(c.after), list(c.upto),
                                    {**window, "refresh": t.refresh} if last else window))
        if t.refresh is not None and t.last is None and state.cut.seq == t.refresh:  # empty at its cut: refresh only
            out.append(ChannelRange(chunk_channel(name), None, [], {**window, "refresh": t.refresh}))
    return out


def hold_window(state: SnapshotState) -> dict[str, object] | None:
    """What the batch's change range must hold back (see :mod:`.holdback`), as the range's window; ``None``
    when nothing is held."""
    hold = {}
    for name, t in state.tables.items():
        entry: dict[str, object] = {}
        if t.refresh is not None:  # a re-snapshot: the consumer has every key's row; see TableCursor.refresh
            if t.late:
                entry = {"late": [e.to_json() for e in t.late], "deletes": True}
                hold[name] = entry
            continue
        if not t.done or t.chunks:
            entry["after"] = None if t.held_after is None else list(t.held_after)
            assert t.last is not None, "a table with chunks to read has a last key"
            entry["last"] = list(t.last)
        if t.late:
            entry["late"] = [e.to_json() for e in t.late]
        if entry:
            hold[name] = entry
    if not hold:
        return None
    out: dict[str, object] = {"hold": hold}
    if state.cut is not None:
        out["cut"] = state.cut.to_json()
    return out
