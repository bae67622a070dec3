"""The executor side of ``backend=local``: reads planned ranges straight from the log's files."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from cdc.backend import Position, RangeReader
from cdc.backends.local.log import LocalLog


class LocalRangeReader(RangeReader):
    """Picklable: holds only the log's path and opens the log where it runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        return LocalLog(self.path).read(channel, int(start), int(end))
