"""The driver side of ``backend=local``: channels, planning and snapshots over :mod:`cdc.backends.local.log`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import pyarrow as pa

from cdc.backend import Backend, ChannelHead, ChannelInfo, PlannedRange, Position, RangeReader, SnapshotInfo
from cdc.backends.local.log import LocalLog
from cdc.backends.local.options import LocalOptions
from cdc.backends.local.reader import LocalRangeReader
from cdc.errors import DataLossError, PositionError
from cdc.model import COMMIT_TS
from cdc.partitions import pick_near


class LocalBackend(Backend):
    name = "local"
    orders_keys = True  # every key's changes reach the query in sequence order (see Backend.orders_keys)
    options_model = LocalOptions
    options: LocalOptions

    def __init__(self, options: LocalOptions) -> None:
        super().__init__(options)
        self.log = LocalLog(options.path)
        # Records never change once published, so a record's commit time can be remembered for good.
        self._commit_time = lru_cache(maxsize=4096)(self._read_commit_time)

    def schema(self) -> pa.Schema:
        return self.log.arrow_schema

    def list_channels(self) -> Sequence[ChannelInfo]:
        return [c.info() for c in self.log.channels()]

    def earliest(self, channel: str) -> Position:
        return self.log.channel(channel).earliest

    def latest(self, channel: str) -> Position:
        return self.log.channel(channel).head

    def parse_position(self, channel: str, value: Any) -> Position:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PositionError(f"channel {channel!r}: a local position is a record index >= 0, got {value!r}")
        head = self.log.channel(channel).head
        if value > head:
            raise PositionError(f"channel {channel!r}: position {value} is past the head {head}")
        return value

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        st = self.log.channel(channel)
        begin = int(start)
        if begin < st.earliest:
            raise DataLossError(
                f"channel {channel!r}: position {begin} is no longer held (earliest is {st.earliest})", channel
            )
        if begin > st.head:
            raise PositionError(f"channel {channel!r}: position {begin} is past the head {st.head}")
        end = st.head
        if until is not None:
            end = min(end, max(begin, int(until)))
        if max_records is not None:
            end = min(end, begin + max_records)
        return PlannedRange(end, end - begin, st.closed_at is not None and end == st.closed_at)

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        """Segment boundaries inside the range, those nearest to ``parts`` equal shares (a boundary costs no
        read: segments are immutable files named by the records they hold, so a piece never reads another's
        segment). Fewer where the range holds fewer boundaries."""
        begin, stop = int(start), int(end)
        inside = [seg.start for seg in self.log.channel(channel).segments if begin < seg.start < stop]
        return pick_near(inside, begin, stop, parts)

    def range_size(self, channel: str, start: Position, end: Position) -> int | None:
        return max(0, int(end) - int(start))

    def snapshot(self) -> SnapshotInfo:
        sid, chunks, cut = self.log.snapshot(self.options.snapshot_chunk_rows)
        return SnapshotInfo(sid, tuple(chunks), cut)

    def reader(self) -> RangeReader:
        return LocalRangeReader(str(self.log.path))

    def average_record_bytes(self) -> float | None:
        return self.log.average_record_bytes()

    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        out = {}
        for cid, pos in positions.items():
            st = self.log.channel(cid)
            at = min(int(pos), st.head)
            out[cid] = ChannelHead(
                st.head, st.head - at, self._commit_time(cid, st.head - 1), self._commit_time(cid, at - 1)
            )
        return out

    def position_at(self, channel: str, when: datetime) -> Position:
        st = self.log.channel(channel)
        # Commit times rise along a channel (appends stamp them), so a binary search over the records is exact.
        lo, hi = st.earliest, st.head
        while lo < hi:
            mid = (lo + hi) // 2
            t = self._commit_time(channel, mid)
            if t is not None and t >= when:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _read_commit_time(self, channel: str, index: int) -> datetime | None:
        if index < 0:
            return None
        try:
            batches = list(self.log.read(channel, index, index + 1))
        except DataLossError:  # truncated away: its time is gone with it
            return None
        value: datetime = batches[0].column(COMMIT_TS)[0].as_py()
        return value
