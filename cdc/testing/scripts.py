"""Scripted histories: steps that change a change log and run micro-batches, and :func:`play`, which runs
them against any :class:`~cdc.testing.harness.Harness` and checks what the contract promises."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdc.backend import Backend
from cdc.channels import ChannelRange
from cdc.partitions import split_ranges
from cdc.planner import Planner
from cdc.testing.harness import Harness, read_range


@dataclass(frozen=True)
class Append:
    """Append ``n`` records, to ``channel`` or spread over the open channels by key."""

    n: int
    channel: str | None = None


@dataclass(frozen=True)
class Split:
    """Split ``channel`` (default: the first open channel) into children. Skipped where channels don't split."""

    channel: str | None = None


@dataclass(frozen=True)
class Merge:
    """Merge ``channels`` into one child. Skipped where channels don't merge.

    By default, the children of the latest split while both are open (so they are adjacent), else the first
    two open channels."""

    channels: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Batch:
    """Plan, read and commit one micro-batch of at most ``max_records`` records (``None``: all there is)."""

    max_records: int | None = None


@dataclass(frozen=True)
class Crash:
    """The driver dies after logging the next batch's end offset, before committing that batch's output.

    The restarted query (a fresh backend and planner) replays the batch from the logged offsets; the replay
    must yield exactly the records of the first attempt."""

    max_records: int | None = None


Step = Append | Split | Merge | Batch | Crash


class ScriptError(AssertionError):
    """A scripted history broke the contract; the message says which rule, and where."""


@dataclass
class PlayResult:
    """What :func:`play` saw: the committed batches in order, what was appended, how many replays."""

    batches: list[pa.Table] = field(default_factory=list)
    appended: int = 0
    replays: int = 0

    @property
    def delivered(self) -> int:
        return sum(b.num_rows for b in self.batches)


def _open_channels(backend: Backend) -> list[str]:
    return [c.id for c in backend.list_channels() if not c.finished]


def _read_batch(backend: Backend, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    tables = [read_range(backend, r.channel, r.start, r.end) for r in Planner.ranges(start, end)]
    return pa.concat_tables(tables) if tables else backend.schema().empty_table()


def _read_split(
    harness: Harness, backend: Backend, start: dict[str, Any], end: dict[str, Any], min_partitions: int
) -> tuple[list[ChannelRange], pa.Table]:
    """The batch's pieces under ``minPartitions`` and its records, read piece by piece and put in the order of
    the harness's order columns (what a ``foreachBatch`` user does: tasks finish in any order). The pieces are
    read last to first; sorted, they must give exactly the unsplit read."""
    pieces = split_ranges(Planner.ranges(start, end), min_partitions, backend)
    tables = [read_range(backend, r.channel, r.start, r.end) for r in reversed(pieces)]
    whole = _read_batch(backend, start, end)
    split = pa.concat_tables(tables) if tables else whole.schema.empty_table()
    keys = list(harness.order_columns or harness.identity_columns)
    if not split.sort_by([(c, "ascending") for c in keys]).equals(whole.sort_by([(c, "ascending") for c in keys])):
        raise ScriptError(f"a batch read in pieces {[str(p) for p in pieces]} holds other records than unsplit")
    return pieces, whole


def play(
    harness: Harness, steps: Sequence[Step], *, drain_at_end: bool = True, min_partitions: int | None = None
) -> PlayResult:
    """Run ``steps`` against ``harness`` as a streaming query would, and check the contract's promises.

    Checked: a replayed batch equals its first attempt; no record (``harness.identity_columns``) is
    delivered twice; per channel, the order column increases in delivery order (``harness.order_columns``); a child channel's first record comes in a
    later batch than every record of its parents; with ``drain_at_end`` (the default), the remaining records
    are delivered after the last step and every appended record must have arrived. With ``min_partitions``,
    each batch is also read in the pieces ``minPartitions`` cuts it into (:mod:`cdc.partitions`): they must
    hold exactly its records, and a replayed batch must be cut the same way. A violation raises
    :class:`ScriptError`.
    """
    result = PlayResult()
    backend = harness.backend()
    planner = Planner(backend)
    start = planner.initial("earliest")
    last_split: tuple[str, ...] = ()

    def run_batch(limit: int | None, crash: bool) -> bool:
        nonlocal backend, planner, start
        end = planner.next(start, limit)
        if end == start:
            return False
        pieces: list[ChannelRange] = []
        if min_partitions:
            pieces, first = _read_split(harness, backend, start, end, min_partitions)
        else:
            first = _read_batch(backend, start, end)
        if crash:  # the offset log holds ``end``, nothing was committed: the query restarts and replays
            backend.close()
            backend = harness.backend()
            planner = Planner(backend)
            if min_partitions:
                again, replayed = _read_split(harness, backend, start, end, min_partitions)
                if again != pieces:
                    raise ScriptError(
                        f"batch {len(result.batches)} was cut into other pieces when replayed: "
                        f"{[str(p) for p in pieces]}, then {[str(p) for p in again]}"
                    )
            else:
                replayed = _read_batch(backend, start, end)
            if not replayed.equals(first):
                raise ScriptError(f"batch {len(result.batches)} replayed differently after a crash")
            result.replays += 1
        result.batches.append(first)
        start = end
        return True

    try:
        for step in steps:
            if isinstance(step, Append):
                harness.append(step.n, step.channel)
                result.appended += step.n
            elif isinstance(step, Split):
                target = step.channel or next(iter(_open_channels(harness.backend())), None)
                if harness.supports_split and target is not None:
                    last_split = tuple(harness.split(target))
            elif isinstance(step, Merge):
                open_now = _open_channels(harness.backend())
                pair = step.channels or (last_split[:2] if set(last_split[:2]) <= set(open_now) else ()) or tuple(
                    open_now[:2]
                )
                if harness.supports_merge and len(pair) >= 2:
                    harness.merge(list(pair))
            else:
                run_batch(step.max_records, isinstance(step, Crash))
        if drain_at_end:
            while run_batch(None, False):
                pass
        _check_history(harness, backend, result, complete=drain_at_end)
    finally:
        backend.close()
    return result


def _check_history(harness: Harness, backend: Backend, result: PlayResult, complete: bool) -> None:
    seen: set[tuple[Any, ...]] = set()
    last: dict[Any, Any] = {}
    batches_of: dict[Any, list[int]] = defaultdict(list)
    for b, table in enumerate(result.batches):
        identities = zip(*(table.column(c).to_pylist() for c in harness.identity_columns), strict=True)
        for identity in identities:
            if identity in seen:
                raise ScriptError(f"record {identity} delivered twice (again in batch {b})")
            seen.add(identity)
        if harness.order_columns is None:
            continue
        channel_col, order_col = harness.order_columns
        for channel, order in zip(table.column(channel_col).to_pylist(), table.column(order_col).to_pylist(),
                                  strict=True):
            if channel in last and order <= last[channel]:
                raise ScriptError(f"channel {channel}: {order_col} {order} delivered after {last[channel]} (batch {b})")
            last[channel] = order
            batches_of[channel].append(b)
    for info in backend.list_channels() if harness.order_columns else ():
        for parent in info.parents:
            if batches_of.get(info.id) and batches_of.get(parent) and min(batches_of[info.id]) <= max(batches_of[parent]):
                raise ScriptError(f"channel {info.id} delivered before its parent {parent} was complete")
    if complete and result.delivered != result.appended:
        raise ScriptError(f"{result.appended} records appended, {result.delivered} delivered")
