"""``backend=memory``: an in-memory change log for tests, scripted without servers or files."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field

from cdc.backend import Backend, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.errors import OptionError, PositionError
from cdc.model import ChangeSchema, Op
from cdc.options import BackendOptions
from cdc.partitions import pick_near
from cdc.testing.harness import Harness

_EPOCH_US = 1_700_000_000_000_000


class MemoryLog:
    """An in-memory change log of ``(k, v)`` records: channels, lineage, sequences; nothing on disk.

    Records are spread over the open channels by key (``k = v % keys``). A split finishes a channel and
    opens ``parts`` children; a merge finishes the channels and opens one child. ``_seq`` is global, so a
    child's records always have larger sequences than its parents'. Logs are found by name within the
    process (:meth:`named`), which is how :class:`MemoryBackend`'s string options reach one.
    """

    change_schema: ClassVar[ChangeSchema] = ChangeSchema.of([("k", pa.int64()), ("v", pa.int64())], ["k"])
    _named: ClassVar[dict[str, MemoryLog]] = {}
    _ids: ClassVar[Iterator[int]] = itertools.count()

    def __init__(self, channels: int = 2, keys: int = 12) -> None:
        self.keys = keys
        self.records: dict[str, list[dict[str, Any]]] = {f"m{i}": [] for i in range(channels)}
        self.parents: dict[str, tuple[str, ...]] = {c: () for c in self.records}
        self.finished: set[str] = set()
        self.seq = 0
        self.name = f"memory-{next(self._ids)}"
        MemoryLog._named[self.name] = self

    @classmethod
    def named(cls, name: str) -> MemoryLog:
        try:
            return cls._named[name]
        except KeyError:
            raise OptionError(f"option 'log': no in-memory log named {name!r} in this process", "log") from None

    def forget(self) -> None:
        MemoryLog._named.pop(self.name, None)

    def open_channels(self) -> list[str]:
        return [c for c in self.records if c not in self.finished]

    def append(self, n: int, channel: str | None = None) -> None:
        open_ = self.open_channels()
        if channel is not None and channel not in open_:
            raise PositionError(f"channel {channel!r} is not an open channel of {self.name}")
        for _ in range(n):
            v = self.seq
            target = channel or open_[(v % self.keys) % len(open_)]
            rows = self.records[target]
            rows.append({"_op": Op.INSERT.value, "_seq": v, "_commit_ts": _EPOCH_US + v, "_channel": target,
                         "_position": len(rows), "k": v % self.keys, "v": v})
            self.seq += 1

    def _child(self, parents: tuple[str, ...]) -> str:
        cid = f"m{len(self.records)}"
        self.records[cid] = []
        self.parents[cid] = parents
        return cid

    def split(self, channel: str, parts: int = 2) -> list[str]:
        self.finished.add(channel)
        return [self._child((channel,)) for _ in range(parts)]

    def merge(self, channels: Sequence[str]) -> str:
        self.finished.update(channels)
        return self._child(tuple(channels))


class MemoryOptions(BackendOptions):
    log: str = Field(description="The name of a MemoryLog of this process (MemoryLog.name).")


class MemoryRangeReader(RangeReader):
    """Carries a copy of the records (executors may run in other processes); ranges never change later."""

    def __init__(self, records: Mapping[str, list[dict[str, Any]]], schema: pa.Schema) -> None:
        self.records = {c: list(rows) for c, rows in records.items()}
        self.schema = schema

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        yield from pa.Table.from_pylist(self.records[channel][int(start) : int(end)], schema=self.schema).to_batches()


class MemoryBackend(Backend):
    """A :class:`MemoryLog` of this process as a change log (tests only; not in the backend registry)."""

    name = "memory"
    options_model = MemoryOptions
    options: MemoryOptions

    def __init__(self, options: MemoryOptions) -> None:
        super().__init__(options)
        self.log = MemoryLog.named(options.log)

    def schema(self) -> pa.Schema:
        return self.log.change_schema.arrow()

    def list_channels(self) -> Sequence[ChannelInfo]:
        return [ChannelInfo(c, self.log.parents[c], c in self.log.finished) for c in self.log.records]

    def earliest(self, channel: str) -> Position:
        return 0

    def latest(self, channel: str) -> Position:
        return len(self.log.records[channel])

    def parse_position(self, channel: str, value: Any) -> Position:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= self.latest(channel):
            raise PositionError(f"channel {channel!r}: a memory position is an index in 0..head, got {value!r}")
        return value

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        begin, head = int(self.parse_position(channel, start)), len(self.log.records[channel])
        end = head if until is None else min(head, max(begin, int(until)))
        if max_records is not None:
            end = min(end, begin + max_records)
        return PlannedRange(end, end - begin, channel in self.log.finished and end == head)

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        """Any index inside the range: records are a list."""
        begin, stop = int(start), int(end)
        return pick_near(range(begin + 1, stop), begin, stop, parts)

    def range_size(self, channel: str, start: Position, end: Position) -> int | None:
        return max(0, int(end) - int(start))

    def reader(self) -> RangeReader:
        return MemoryRangeReader(self.log.records, self.schema())


class MemoryHarness(Harness):
    """The harness of :class:`MemoryBackend`: a script runs in memory, in milliseconds."""

    def __init__(self, channels: int = 2, keys: int = 12) -> None:
        self.log = MemoryLog(channels, keys)

    def backend(self) -> Backend:
        return MemoryBackend(MemoryOptions.model_validate({"log": self.log.name}))

    def append(self, n: int, channel: str | None = None) -> None:
        self.log.append(n, channel)

    def split(self, channel: str) -> Sequence[str]:
        return self.log.split(channel)

    def merge(self, channels: Sequence[str]) -> str:
        return self.log.merge(channels)

    def close(self) -> None:
        self.log.forget()
