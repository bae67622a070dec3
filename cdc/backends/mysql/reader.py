"""Reading planned ranges on executors: the executor side of ``backend=mysql`` (picklable).

A range ``[start, end)`` of the change channel is read by asking the server for its binary log from ``start``
(:class:`~.connection.BinlogStream`) and decoding the rows events of the query's tables
(:mod:`.binlog`, :mod:`.records`) until the first event at or past ``end``. The binary log is not consumed, so
a replay reads the same records. A file the range needs that the server no longer has fails the read with
:class:`~cdc.errors.DataLossError`, and a stream that ends before ``end`` fails it too: never a silently
shorter batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from cdc.backend import Position, RangeReader
from cdc.backends.mysql import connection
from cdc.backends.mysql.binlog import EventWalker
from cdc.backends.mysql.connection import ServerInfo
from cdc.backends.mysql.options import Endpoint
from cdc.backends.mysql.positions import describe, offset_of
from cdc.backends.mysql.records import BatchBuilder, Layout, MappedTable, decode_rows
from cdc.backends.mysql.snapshot import ChunkedReads
from cdc.errors import DataLossError, PositionError
from cdc.snapshots.planning import CHUNK_PREFIX

CHANGES = "changes"
BATCH_ROWS = 8192


def table_keys(layout: Layout) -> dict[tuple[bytes, bytes], tuple[str, ...]]:
    """The query's tables as the binary log names them (database, table, in UTF-8) -> their key columns."""
    return {(t.database.encode(), t.table.encode()): t.keys for t in layout.tables}


class MySQLRangeReader(RangeReader):
    def __init__(self, endpoint: Endpoint, layout: Layout, server: ServerInfo, batch_rows: int = BATCH_ROWS,
                 chunked: ChunkedReads | None = None) -> None:
        self.endpoint = endpoint
        self.layout = layout
        self.server = server
        self.batch_rows = batch_rows
        self.chunked = chunked

    def read_window(self, channel: str, start: Position, end: Position, window: Any) -> Iterator[pa.RecordBatch]:
        """A chunked snapshot's chunk ``(start, end]`` of keys, or a change range that holds keys back
        (:mod:`.snapshot`)."""
        if self.chunked is None:
            raise PositionError(f"range {channel!r} belongs to a chunked snapshot, which this reader was not given")
        if channel.startswith(CHUNK_PREFIX):
            after = None if start is None else tuple(start)
            yield from self.chunked.read_chunk(channel[len(CHUNK_PREFIX):], after, tuple(end), window).to_batches()
            return
        yield from self.chunked.hold(window, self.read(channel, start, end))

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        begin, stop = int(start), int(end)
        if stop <= begin:
            return
        layout = self.layout
        builder = BatchBuilder(layout, CHANGES)
        known = layout.known_columns()

        def on_rows(kind: int, table: MappedTable, data: bytes, body: int, body_end: int, position: int,
                    when: int) -> None:
            if not table.checked:
                layout.check(table, known)
                table.checked = True
            decode_rows(builder.rows(table), kind, data, body, body_end, position, when)

        with connection.BinlogStream(self.endpoint) as stream:
            files = connection.binary_logs(stream.conn)
            stream.start(connection.file_name(files, begin), offset_of(begin))
            walker = EventWalker(stream, begin, table_keys(layout), self.server.checksum, self.server.mariadb,
                                 log_ddl=True)
            for _ in walker.transactions(stop, on_rows):
                if builder.count() >= self.batch_rows:
                    batch = builder.build()
                    if batch is not None:
                        yield batch
            if walker.reached < stop:
                raise DataLossError(
                    f"the server's binary log ended at {describe(walker.reached, _names(files))} before the planned "
                    f"end {describe(stop, _names(files))} (a binary log reset, or a file truncated?)", CHANGES)
        last = builder.build()
        if last is not None:
            yield last


def _names(files: dict[int, tuple[str, int]]) -> dict[int, str]:
    return {n: name for n, (name, _) in files.items()}
