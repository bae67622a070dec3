"""How a batch's channel ranges become Spark input partitions: one task per range, or several (``minPartitions``).

Without ``minPartitions`` every channel range of a batch is read by one Spark task. With it, as in Spark's
Kafka source, a batch with fewer ranges than ``minPartitions`` shares that many tasks among its ranges in
proportion to their sizes (:func:`parts_per_range`), and each range is cut at positions its backend finds
*without reading the range* (:meth:`~cdc.backend.Backend.split_points`: the local log's segment boundaries,
Pulsar's ledger entries). The pieces of a range are adjacent ranges that concatenate to the whole (contract
rule 1), so a split read holds exactly the records of the unsplit one.

The split is a pure function of the batch's ranges, which are a pure function of its offsets, and of facts
the backend keeps for good (a segment's boundaries, a closed ledger's entries): a replayed batch splits the
same way. A backend that finds no point inside a range leaves it to one task, and the log says so.

Per-key order inside a batch is then no longer one task's read order: ``_seq`` orders a key's changes (see
:mod:`cdc.model`), which is what ``DeltaUpsertSink`` sorts by, and what a ``foreachBatch`` user sorts by.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from cdc.channels import ChannelRange, Position
from cdc.errors import CdcError, OptionError

if TYPE_CHECKING:
    from cdc.backend import Backend
    from cdc.options import BackendOptions

log = logging.getLogger(__name__)

__all__ = ["Splitter", "check_splittable", "parts_per_range", "pick_near", "split_ranges"]


class Splitter(Protocol):
    """What :func:`split_ranges` asks of a backend (:class:`~cdc.backend.Backend` provides it)."""

    @property
    def name(self) -> str: ...

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]: ...

    def range_size(self, channel: str, start: Position, end: Position) -> int | None: ...


def parts_per_range(sizes: Sequence[int | None], min_partitions: int | None) -> list[int]:
    """How many tasks each of a batch's ranges gets: Spark's Kafka rule.

    With fewer ranges than ``min_partitions``, range ``i`` gets ``max(1, round(size_i / total *
    min_partitions))`` (halves round up); an unknown size (``None``) makes every range count alike. Otherwise,
    and without ``min_partitions``, one each."""
    if not min_partitions or len(sizes) >= min_partitions:
        return [1] * len(sizes)
    known = [max(0, s) for s in sizes if s is not None]
    weights = known if len(known) == len(sizes) and sum(known) > 0 else [1] * len(sizes)
    total = sum(weights)
    return [max(1, (2 * w * min_partitions + total) // (2 * total)) for w in weights]


def split_ranges(ranges: Sequence[ChannelRange], min_partitions: int | None, backend: Splitter) -> list[ChannelRange]:
    """The pieces each range of a batch is read in, range by range and in position order within a range.

    A range given ``n > 1`` tasks by :func:`parts_per_range` is cut at the at most ``n - 1`` positions
    :meth:`~cdc.backend.Backend.split_points` gives (fewer where it finds fewer, none: one task)."""
    if not min_partitions or len(ranges) >= min_partitions:
        return list(ranges)
    sizes = [backend.range_size(r.channel, r.start, r.end) for r in ranges]
    out: list[ChannelRange] = []
    for r, parts in zip(ranges, parts_per_range(sizes, min_partitions), strict=True):
        points = list(backend.split_points(r.channel, r.start, r.end, parts)) if parts > 1 else []
        _check_points(backend.name, r, points, parts)
        if parts > 1 and not points:
            log.info("minPartitions: backend %r found no split point inside %s; one task reads it", backend.name, r)
        elif points:
            log.debug("minPartitions: %s in %d pieces, cut at %s", r, len(points) + 1, points)
        bounds = [r.start, *points, r.end]
        out += [ChannelRange(r.channel, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


def pick_near(candidates: Sequence[int], lo: int, hi: int, parts: int) -> list[int]:
    """The candidates nearest to the ``parts - 1`` points that cut ``[lo, hi)`` into equal shares (ties: the
    lower), each taken once, in order. ``candidates`` are sorted and strictly inside the range; any sequence
    that bisects works (a ``range`` too). Exact integer arithmetic: the same answer on every machine."""
    out: list[int] = []
    for k in range(1, parts):
        target = lo * parts + (hi - lo) * k  # the k-th cut, scaled by parts
        i = bisect.bisect_left(candidates, -(-target // parts))
        near = [candidates[j] for j in (i - 1, i) if 0 <= j < len(candidates)]
        if not near:
            break
        best = min(near, key=lambda c: (abs(c * parts - target), c))
        if not out or best > out[-1]:
            out.append(best)
    return out


def _check_points(backend: str, r: ChannelRange, points: Sequence[Position], parts: int) -> None:
    """Positions are the backend's own, so their order is its to keep; what can be checked without it is."""
    distinct = len({repr(p) for p in points}) == len(points)
    if len(points) >= parts or not distinct or any(p in (r.start, r.end) for p in points):
        raise CdcError(
            f"backend {backend!r} gave split points {points!r} for {r} in {parts} pieces: expected at most "
            f"{parts - 1} distinct positions strictly inside the range"
        )


def check_splittable(backend_cls: type[Backend], options: BackendOptions, min_partitions: int | None) -> None:
    """Refuse ``minPartitions`` (above 1) for a backend that cannot split a channel's range, naming the backend
    and why (:meth:`~cdc.backend.Backend.split_refusal`)."""
    if not min_partitions or min_partitions <= 1:
        return
    reason = backend_cls.split_refusal(options)
    if reason is not None:
        raise OptionError(
            f"option 'minPartitions': backend {backend_cls.name!r} cannot read a channel's range in several tasks: "
            f"{reason}; leave minPartitions unset (one task per channel range)",
            "minPartitions",
        )
