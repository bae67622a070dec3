"""The test kit checks what it claims: random scripted histories pass on a correct backend, and each kind
of broken backend is caught."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.backend import Backend, Position, RangeReader
from cdc.testing import Append, Batch, Crash, MemoryHarness, Merge, ScriptError, Split, Step, play
from cdc.testing.memory import MemoryBackend, MemoryOptions, MemoryRangeReader

steps = st.one_of(
    st.builds(Append, st.integers(1, 20)),
    st.builds(Batch, st.none() | st.integers(1, 9)),
    st.builds(Crash, st.none() | st.integers(1, 9)),
    st.just(Split()),
    st.just(Merge()),
)


@settings(max_examples=150, deadline=None)
@given(script=st.lists(steps, max_size=25), channels=st.integers(1, 3), min_partitions=st.none() | st.integers(2, 7))
def test_random_histories_deliver_everything_once(script: list[Step], channels: int, min_partitions: int | None) -> None:
    harness = MemoryHarness(channels=channels)
    try:
        result = play(harness, script, min_partitions=min_partitions)
    finally:
        harness.close()
    assert result.delivered == sum(s.n for s in script if isinstance(s, Append))
    # A crash with nothing planned is no batch: nothing to replay.
    assert result.replays <= sum(1 for s in script if isinstance(s, Crash))


class _ShuffledReader(MemoryRangeReader):
    """Reads a range differently on every call: the kind of backend the replay check exists for."""

    calls = 0

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        _ShuffledReader.calls += 1
        rows = self.records[channel][int(start) : int(end)]
        rows = rows[::-1] if _ShuffledReader.calls % 2 else rows
        yield from pa.Table.from_pylist(rows, schema=self.schema).to_batches()


class _EarlyReader(MemoryRangeReader):
    """Every range starts one record early: ranges overlap."""

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        return super().read(channel, max(0, int(start) - 1), end)


class _ReaderSwap(MemoryBackend):
    reader_type: type[MemoryRangeReader] = MemoryRangeReader

    def reader(self) -> RangeReader:
        return self.reader_type(self.log.records, self.schema())


class _ShuffledBackend(_ReaderSwap):
    reader_type = _ShuffledReader


class _EarlyBackend(_ReaderSwap):
    reader_type = _EarlyReader


class _ForgetfulHarness(MemoryHarness):
    def backend(self) -> Backend:
        return _ShuffledBackend(MemoryOptions.model_validate({"log": self.log.name}))


class _OverlappingHarness(MemoryHarness):
    def backend(self) -> Backend:
        return _EarlyBackend(MemoryOptions.model_validate({"log": self.log.name}))


@pytest.mark.parametrize(
    ("harness_type", "message"),
    [(_ForgetfulHarness, "replayed differently"), (_OverlappingHarness, "delivered twice")],
)
def test_broken_backends_are_caught(harness_type: type[MemoryHarness], message: str) -> None:
    harness = harness_type(channels=1)
    try:
        with pytest.raises(ScriptError, match=message):
            play(harness, [Append(5), Crash(2), Append(3), Batch(2), Batch()])
    finally:
        harness.close()


class _HeadSplitBackend(MemoryBackend):
    """Cuts a range at a place that depends on the driver run (here: how many backends were opened), not on
    the range alone: a restarted query cuts a replayed batch elsewhere."""

    opened = 0

    def __init__(self, options: MemoryOptions) -> None:
        super().__init__(options)
        _HeadSplitBackend.opened += 1
        self.run = _HeadSplitBackend.opened

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        cut = int(start) + 1 + self.run % max(1, int(end) - int(start) - 1)
        return [cut] if int(start) < cut < int(end) else []


class _HeadSplitHarness(MemoryHarness):
    def backend(self) -> Backend:
        return _HeadSplitBackend(MemoryOptions.model_validate({"log": self.log.name}))


@pytest.mark.parametrize("min_partitions", [2, None])
def test_a_replay_cut_into_other_pieces_is_caught(min_partitions: int | None) -> None:
    harness = _HeadSplitHarness(channels=1)
    script: list[Step] = [Append(30), Batch(20), Crash(), Append(30)]
    try:
        if min_partitions:
            with pytest.raises(ScriptError, match="cut into other pieces"):
                play(harness, script, min_partitions=min_partitions)
        else:  # without minPartitions nothing asks for split points
            assert play(harness, script).replays == 1
    finally:
        harness.close()


def test_lost_records_are_caught() -> None:
    class Lossy(MemoryHarness):
        def append(self, n: int, channel: str | None = None) -> None:
            super().append(max(0, n - 1), channel)

    harness = Lossy(channels=2)
    with pytest.raises(ScriptError, match="appended"):
        play(harness, [Append(4), Batch()])
    harness.close()


def test_a_child_before_its_parent_is_caught() -> None:
    harness = MemoryHarness(channels=1)
    result: Any = None
    try:
        result = play(harness, [Append(3), Split(), Append(4)])
        assert result.delivered == 7
        # Hand-made history: the child's record in the same batch as the parent's last one.
        from cdc.testing.scripts import _check_history

        merged = pa.concat_tables(result.batches)
        result.batches = [merged]
        with pytest.raises(ScriptError, match="before its parent"):
            _check_history(harness, harness.backend(), result, complete=True)
    finally:
        harness.close()
