"""Reading planned ranges on executors: the executor side of ``backend=postgres`` (picklable).

The change channel's range ``[start, end)`` is read by peeking the slot up to ``lsn_of(end)``
(:func:`.slot.peek`) and decoding the records whose positions lie in the range (:mod:`.changes`); the slot is not
moved, so a replay reads the same records. The slot having moved past ``start`` (dropped, or consumed by
someone else) fails the read with :class:`~cdc.errors.DataLossError`, never a silently shorter batch.
Chunks of an exported snapshot are Arrow files materialised while it was held (:mod:`.exported`); ranges of a
chunked snapshot (:mod:`.snapshot`) carry a window and are read by :meth:`PostgresRangeReader.read_window`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc.backend import Position, RangeReader
from cdc.backends.postgres import connection
from cdc.backends.postgres.changes import decode_changes
from cdc.backends.postgres.exported import CHUNK_PREFIX, chunk_file
from cdc.backends.postgres.positions import CHANGES, lsn_of
from cdc.backends.postgres.records import Layout
from cdc.backends.postgres.snapshot import ChunkedReads
from cdc.errors import PositionError
from cdc.options import SecretStr
from cdc.snapshots.planning import CHUNK_PREFIX as CHUNKED_PREFIX

__all__ = ["CHANGES", "PostgresRangeReader", "read_chunk"]


class PostgresRangeReader(RangeReader):
    def __init__(self, dsn: SecretStr, slot: str, publication: str, layout: Layout, snapshot_dir: str | None,
                 chunked: ChunkedReads | None = None, only: frozenset[str] | None = None) -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.layout = layout
        self.snapshot_dir = snapshot_dir
        self.chunked = chunked
        self.only = only
        """The tables whose changes a read delivers (``None``: the layout's)."""

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        if channel.startswith(CHUNK_PREFIX):
            yield from read_chunk(self.snapshot_dir, channel, int(start), int(end))
            return
        if int(end) <= int(start):
            return
        if lsn_of(int(end)) <= lsn_of(int(start)):
            return  # no transaction commits in the range
        with connection.connect(self.dsn.get_secret_value()) as conn:
            connection.check_held(conn, self.slot, int(start))
            messages = connection.peek(conn, self.slot, self.publication, lsn_of(int(end)))
            yield from decode_changes(messages, self.layout, CHANGES, int(start), int(end), only=self.only)

    def read_window(self, channel: str, start: Position, end: Position, window: Any) -> Iterator[pa.RecordBatch]:
        """A chunked snapshot's chunk ``(start, end]`` of keys, or a change range that holds keys back."""
        if self.chunked is None:
            raise PositionError(f"range {channel!r} belongs to a chunked snapshot, which this reader was not given")
        if channel.startswith(CHUNKED_PREFIX):
            table = channel[len(CHUNKED_PREFIX):]
            if all(t.name != table for t in self.layout.tables):
                return  # a replayed batch's chunk of a table removed from the query since
            after = None if start is None else tuple(start)
            if end:
                yield from self.chunked.read_chunk(table, after, tuple(end), window).to_batches()
            if isinstance(window, dict) and window.get("refresh") is not None:
                yield self.chunked.refresh_record(table, int(window["refresh"]))
            return
        yield from self.chunked.read_changes(self.slot, self.publication, int(start), int(end), window)


def read_chunk(snapshot_dir: str | None, channel: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
    if snapshot_dir is None or end <= start:
        return
    with pa.memory_map(str(chunk_file(Path(snapshot_dir), channel))) as source:
        table = pa.ipc.open_file(source).read_all().slice(start, end - start)
    yield from table.to_batches()
