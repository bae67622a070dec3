"""Planning micro-batches over channels: offsets, lineage, admission control. No Spark in here.

An **offset** is what Spark writes to its offset log for each batch: every channel's position at the end
of the batch, plus the marks a replay needs; :mod:`cdc.offsets` defines its JSON. A batch's ranges are a
pure function of its (start, end) offsets: a replay never has to ask the backend where a range began.

``startingOffsets=snapshot`` starts with a snapshot of the table. **Chunked** (the backend offers
:meth:`~cdc.backend.Backend.chunked_snapshot`): the offset holds one cursor per table (:mod:`cdc.snapshots`);
a batch that reads chunks opens a cut, ends its change range there and reads the next chunks at it, and
every batch's change range holds back the keys no chunk has emitted yet. Changes flow between and alongside
the chunks. A batch read plans such batches all at once where the driver reads the chunks
(:meth:`Planner.chunked_batch`). **Exported** (:class:`~cdc.backend.SnapshotInfo`, and every other batch
read): its chunks enter the
offset as channels marked ``"snapshot": true``, and the change channels start at the cut. No change channel
takes part in a batch until every snapshot chunk is ``done`` in the batch's start offset, so the full data
arrives first, then every change after the cut: no gap (the cut is consistent), no duplicate (a change is
either folded into the snapshot or after the cut), and a snapshot row's ``_seq`` is that of the last change
it includes, smaller than any later change's.

``turn`` (present when ``maxRecordsPerTrigger`` applies) counts limited batches: the channel served first
rotates with it, so a budget smaller than the number of channels starves none.

The first batch is special: Spark does not store a query's initial offset, and after a crash it asks the
source again, which for ``latest`` (or after retention moved ``earliest``) gives a different answer. So
:meth:`Planner.initial` marks its offset ``"initial": true`` and the first batch's end offset carries
``from`` for every channel: batch 0 replays exactly too.

Lineage rule: a channel takes part in a batch only when every parent is ``done`` in the batch's *start*
offset, i.e. has been completely delivered by an earlier batch. A parent the backend has forgotten and the
offset never saw is taken as finished (there is nothing left to deliver from it).

:meth:`Planner.next` is three pure steps around the backend's answers, each testable alone:
:func:`eligible_channels` (lineage, snapshot gating), :func:`share_budget` (who reads how much) and
:func:`end_offset` (the offset that records it); :func:`batch_ranges` reads the ranges back. The :class:`Planner` speaks the JSON Spark stores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from cdc.backend import Backend, ChannelInfo
from cdc.channels import ChannelRange, Position
from cdc.errors import DataLossError, OptionError, PositionError
from cdc.offsets import ChannelOffset, Offset, OffsetJson
from cdc.options import per_channel
from cdc.snapshots.planning import (
    CHUNK_PREFIX,
    ChunkedSnapshot,
    add_tables,
    advance,
    chunk_ranges,
    expire,
    hold_window,
)
from cdc.snapshots.state import Cut, SnapshotState, TableCursor, with_late

log = logging.getLogger(__name__)

__all__ = [
    "ChannelPlan",
    "ChannelRange",
    "Planner",
    "Taken",
    "batch_ranges",
    "describe",
    "eligible_channels",
    "end_offset",
    "followed",
    "parents_done",
    "per_channel",
    "positions",
    "share_budget",
]


@dataclass(frozen=True)
class Taken:
    """What one request to a channel gave: ``records`` records, and whether the channel is now exhausted."""

    records: int
    finished: bool


@dataclass(frozen=True)
class ChannelPlan:
    """A channel's range ``[start, end)`` while the batch is being planned (the channel is the key it is
    kept under), and what planning learned of it."""

    start: Position
    end: Position
    finished: bool = False
    skipped: bool = False
    """``start`` jumped forward past data the backend no longer holds (``failOnDataLoss=false``)."""


_STARTING_ACCEPTED = 'earliest, latest, or a JSON object {"<channel>": <position> | "earliest" | "latest"}'
_ENDING_ACCEPTED = 'latest or a JSON object {"<channel>": <position> | "latest"}'


def _channel_sort_key(cid: str) -> tuple[int, str]:
    return (len(cid), cid)


# ---------------------------------------------------------------------- the steps of Planner.next
def eligible_channels(
    start: Offset,
    new: Mapping[str, Position],
    channels: Mapping[str, ChannelInfo],
    *,
    respect_lineage: bool = True,
    gates: Mapping[str, Mapping[str, Position]] | None = None,
) -> list[str]:
    """The channels that may take records in the batch from ``start``, in planning order.

    ``new`` are the channels registered by this batch (at their earliest position), ``channels`` what the
    backend lists now. Snapshot chunks are always eligible until done. A change channel is eligible when the
    backend still lists it and, under ``respect_lineage``, no snapshot chunk is pending in ``start``, every
    parent is done in ``start``, and the positions it waits for are reached (``after``, or ``gates``: those of
    the channels registered now). Batch reads pass ``respect_lineage=False``: they read every channel at once.
    """
    snapshot_pending = any(e.snapshot and not e.done for e in start.channels.values())
    candidates = [cid for cid, e in start.channels.items() if not e.done]
    candidates += [cid for cid in new if cid not in start.channels]
    out = []
    for cid in sorted(candidates, key=_channel_sort_key):
        entry = start.channels.get(cid)
        if entry is not None and entry.snapshot:
            out.append(cid)
        elif cid in channels and (
            not respect_lineage
            or (
                not snapshot_pending
                and parents_done(channels[cid], start, channels)
                and followed(cid, start, gates, new)
            )
        ):
            out.append(cid)
    return out


def followed(
    cid: str,
    start: Offset,
    gates: Mapping[str, Mapping[str, Position]] | None = None,
    new: Mapping[str, Position] | None = None,
) -> bool:
    """The query's positions in ``start`` reached every position the channel waits for (its ``after``, or the
    gate it is registered with now: ``gates``); see :attr:`cdc.backend.ChannelInfo.follows`. A followed channel
    registered in the same batch (``new``) is at its first position: several channels that appeared between two
    batches take part one after another, in the order they follow each other."""
    entry = start.channels.get(cid)
    after = (gates or {}).get(cid) or (entry.after if entry is not None else None) or {}
    for other, target in after.items():
        have = start.channels.get(other)
        if have is not None:
            if not have.done and not _reached(have.pos, target):
                return False
        elif new is not None and other in new and not _reached(new[other], target):
            return False
    return True


def _reached(pos: Position, target: Position) -> bool:
    try:
        return bool(pos >= target)
    except TypeError:  # positions that do not compare: the backend named no such gate; never wait for good
        return True


def parents_done(ch: ChannelInfo, start: Offset, channels: Mapping[str, ChannelInfo]) -> bool:
    """Every parent of ``ch`` was completely delivered before ``start`` (see the lineage rule above)."""
    for parent in ch.parents:
        entry = start.channels.get(parent)
        if entry is None:
            if parent in channels:
                return False  # the parent is known but not yet registered: it goes first
            continue  # forgotten by the backend and never seen: nothing left to deliver
        if not entry.done:
            return False
    return True


def share_budget(
    order: Sequence[str],
    budget: int | None,
    cap: int | None,
    turn: int,
    take: Callable[[str, int | None], Taken],
) -> dict[str, int]:
    """Ask ``take(channel, want)`` for records until the budget is spent; return the records per channel.

    Without a budget every channel is asked once, for at most ``cap`` (``None``: everything). With one,
    water-filling: share the budget evenly, hand what exhausted channels leave to the others. Every round
    either drops a channel or spends at least one record, so it terminates. Who goes first rotates with
    ``turn``, so a budget smaller than the number of channels starves none. A channel the budget never
    reached is still asked for 0 records: a finished, already exhausted channel must be marked done.
    """
    taken = dict.fromkeys(order, 0)
    if budget is None:
        for cid in order:
            taken[cid] += take(cid, cap).records
        return taken
    asked: set[str] = set()
    active = list(order)
    if active:
        first = turn % len(active)
        active = active[first:] + active[:first]
    while budget > 0 and active:
        share = max(1, budget // len(active))
        still = []
        for cid in active:
            room = budget if cap is None else min(budget, cap - taken[cid])
            want = min(share, room)
            if want <= 0:
                continue
            got = take(cid, want)
            asked.add(cid)
            taken[cid] += got.records
            budget -= got.records
            if got.records == want and not got.finished:
                still.append(cid)
        active = still
    for cid in order:
        if cid not in asked:
            take(cid, 0)
    return taken


def end_offset(
    start: Offset,
    new: Mapping[str, Position],
    plans: Mapping[str, ChannelPlan],
    *,
    limited: bool,
    gates: Mapping[str, Mapping[str, Position]] | None = None,
) -> Offset | None:
    """The end offset of the batch from ``start``, or ``None`` when nothing moved and nothing was learned
    (Spark then runs no batch).

    ``new`` are the channels this batch registers (at their earliest position), ``plans`` the ranges of the
    channels that took part. A range gets a ``from`` when it does not start at the channel's previous
    position (a new channel, a skip after data loss), and every range of the first batch gets one: Spark
    keeps no start offset for batch 0. ``limited`` batches count their ``turn``.
    """
    entries = start.without_from()
    for cid, pos in new.items():
        entries.setdefault(cid, ChannelOffset(pos, after=(gates or {}).get(cid) or None))
    for cid, p in plans.items():
        entries[cid] = replace(entries[cid], pos=p.end, done=entries[cid].done or p.finished, after=None)
    if not new and not any(p.skipped for p in plans.values()) and entries == start.without_from():
        return None
    for cid, p in plans.items():
        if p.skipped or (cid in new and p.start != p.end):
            entries[cid] = replace(entries[cid], from_=p.start)
    if start.initial:
        for cid, e in entries.items():
            if e.from_ is None:
                entries[cid] = replace(e, from_=start.channels[cid].pos if cid in start.channels else e.pos)
    return Offset(entries, turn=(start.turn or 0) + 1 if limited else None)


def _settled(begin: Offset) -> SnapshotState | None:
    """The snapshot state a batch after ``begin`` starts from; None when there is none. A snapshot that has just
    ended (its last chunks read, nothing held back) settles to None: its state leaves the offset with the next
    batch that reads something, not in an empty batch of its own."""
    settled = None if begin.snapshot is None else begin.snapshot.settled()
    return settled if settled is not None and settled.tables else None


def batch_ranges(start: Offset, end: Offset) -> list[ChannelRange]:
    """The channel ranges of the batch ``(start, end]``; empty ranges are left out. During a chunked snapshot
    the chunks the batch reads are ranges too (``chunk:<table>``), and the change ranges carry the window of
    keys they hold back; both come from ``end`` alone, so a replay needs nothing else."""
    if start == end:
        return []  # no batch: ``from`` marks of an offset returned unchanged do not start a range
    window = None if end.snapshot is None else hold_window(end.snapshot)
    out = []
    for cid, e in end.channels.items():
        if e.from_ is not None:
            first = e.from_
        elif cid in start.channels:
            first = start.channels[cid].pos
        else:
            continue  # registered in this batch with nothing to read
        if first != e.pos:
            out.append(ChannelRange(cid, first, e.pos, window))
    out.sort(key=lambda r: _channel_sort_key(r.channel))
    if end.snapshot is not None:
        out += chunk_ranges(end.snapshot)
    return out


# ---------------------------------------------------------------------- the planner
class Planner:
    """Turns backend state into offsets and offsets into ranges. Takes and returns offsets as the JSON Spark
    stores (:class:`~cdc.offsets.Offset` is its typed form)."""

    def __init__(
        self,
        backend: Backend,
        *,
        fail_on_data_loss: bool = True,
        max_records_per_channel: int | None = None,
    ) -> None:
        self.backend = backend
        self.fail_on_data_loss = fail_on_data_loss
        self.max_records_per_channel = max_records_per_channel
        self.last_records = 0
        """Records the last :meth:`next` planned (a lower bound where the backend counts lazily, rule 2)."""

    # ------------------------------------------------------------------ start positions
    def initial(self, spec: str, at: datetime | None = None, *, batch: bool = False) -> OffsetJson:
        """The offset a new query starts from: ``earliest``, ``latest``, ``snapshot`` or JSON per channel; or,
        given ``at`` (``startingTimestamp``), each channel's first record committed at or after it. A ``batch``
        read takes an exported snapshot even where the backend offers chunked ones: its plan cannot hold a cut
        while the executors read (PySpark plans a batch read in a worker that exits before they run); a backend
        whose driver reads the chunks plans its batch read with :meth:`chunked_batch` instead.

        A snapshot start asks the backend for nothing before :meth:`~cdc.backend.Backend.snapshot`, which
        sets the change log's start up itself (PostgreSQL creates its slot there, with the export); every
        other start lets the backend prepare first (:meth:`~cdc.backend.Backend.prepare_start`)."""
        out = self._initial(spec, at, batch=batch)
        source = self.backend.source_state()
        return out if source is None else {**out, "source": source}

    def _initial(self, spec: str, at: datetime | None, *, batch: bool) -> OffsetJson:
        text = spec.strip()
        default = text.lower()
        if at is None and default == "snapshot":
            chunked = None if batch else self.backend.chunked_snapshot()
            if chunked is not None:
                return self._initial_chunked(chunked).to_json()
            return self._initial_snapshot().to_json()
        self.backend.prepare_start()
        channels = self.backend.list_channels()
        if at is not None:
            return Offset({ch.id: ChannelOffset(self.backend.position_at(ch.id, at)) for ch in channels},
                          initial=True).to_json()
        given: dict[str, Any] = {}
        if default not in ("earliest", "latest"):
            given = per_channel(text, "startingOffsets", _STARTING_ACCEPTED, (c.id for c in channels),
                                self.backend.channel_positions)
            default = "earliest"
        out: dict[str, ChannelOffset] = {}
        for ch in channels:
            where = given.get(ch.id, default)
            if where == "earliest":
                out[ch.id] = ChannelOffset(self.backend.earliest(ch.id))
            elif where == "latest":
                out[ch.id] = ChannelOffset(self.backend.latest(ch.id), done=ch.finished)
            else:
                out[ch.id] = ChannelOffset(self.backend.parse_position(ch.id, where))
        return Offset(out, initial=True).to_json()

    def _initial_chunked(self, chunked: ChunkedSnapshot) -> Offset:
        begun = chunked.start()
        tables = {t: TableCursor(last) for t, last in begun.last.items() if last is not None}
        log.info("chunked snapshot of %s from %s=%r (empty: %s)", sorted(tables), chunked.channel, begun.position,
                 sorted(t for t, last in begun.last.items() if last is None) or "none")
        return Offset({chunked.channel: ChannelOffset(begun.position)}, initial=True,
                      snapshot=SnapshotState(tables) if tables else None)

    def _initial_snapshot(self) -> Offset:
        snap = self.backend.snapshot()
        out = {chunk: ChannelOffset(self.backend.earliest(chunk), snapshot=True) for chunk in snap.chunks}
        for cid, pos in snap.positions.items():
            out[cid] = ChannelOffset(pos)
        log.info("snapshot %s: %d chunks, change log cut at %s", snap.id, len(snap.chunks), dict(snap.positions))
        return Offset(out, initial=True)

    def until(self, spec: str) -> dict[str, Position]:
        """Per-channel upper bounds from ``endingOffsets`` (batch) or a frozen AvailableNow target."""
        return self._bounds(spec)[0]

    def _bounds(
        self, spec: str, at: datetime | None = None, *, batch: bool = False
    ) -> tuple[dict[str, Position], set[str]]:
        """The bounds of :meth:`until` (or, given ``at``, by time), and the channels whose bound was given.
        A ``batch`` read's ``latest`` is the backend's :meth:`~cdc.backend.Backend.batch_read_end` (rule 6)."""
        if at is not None:
            bounds = {c.id: self.backend.position_at(c.id, at) for c in self.backend.list_channels()}
            return bounds, set(bounds)
        head = self.backend.batch_read_end if batch else self.backend.latest
        text = spec.strip()
        if text.lower() == "latest":
            return {c.id: head(c.id) for c in self.backend.list_channels()}, set()
        known = {c.id for c in self.backend.list_channels()}
        given = per_channel(text, "endingOffsets", _ENDING_ACCEPTED, known, self.backend.channel_positions)
        out: dict[str, Position] = {}
        for ch in known:
            value = given.get(ch, "latest")
            out[ch] = head(ch) if value == "latest" else self.backend.parse_position(ch, value)
        return out, {ch for ch in known if given.get(ch, "latest") != "latest"}

    def batch_end(self, start: OffsetJson, ending: str, at: datetime | None = None) -> OffsetJson:
        """The end offset of a batch read from ``start`` to ``ending`` (``endingOffsets``), every channel at once.

        An ending position before the start is refused, naming both. Positions are the backend's own, so the
        backend answers: a given bound lies before the start when the range from the bound up to the start
        holds a record, or is no longer held. Only a channel whose range came out empty can have such a
        bound, and only a given position can be one (``latest`` is never before a start the backend accepted).
        """
        bounds, given = self._bounds(ending, at, batch=True)
        end = self.next(start, None, bounds, respect_lineage=False)
        begin, stop = Offset.from_json(start), Offset.from_json(end)
        option = "endingOffsets" if at is None else "endingTimestamp"
        backwards = []
        for cid in sorted(given, key=_channel_sort_key):
            entry, last = begin.channels.get(cid), stop.channels.get(cid)
            if entry is None or last is None or last.pos != entry.pos or bounds[cid] == entry.pos:
                continue
            try:
                behind = self.backend.plan(cid, bounds[cid], 1, entry.pos).records > 0
            except DataLossError:
                behind = True
            if behind:
                backwards.append(
                    f"channel {cid!r}: {option} position {bounds[cid]!r} is before its startingOffsets position {entry.pos!r}"
                )
        if backwards:
            raise OptionError(
                f"a batch read cannot end before it starts (option {option!r}): {'; '.join(backwards)}", option
            )
        return end

    def chunked_batch(self, chunked: ChunkedSnapshot, ending: str, at: datetime | None = None) -> list[ChannelRange]:
        """The ranges of a batch read from ``startingOffsets=snapshot`` through a chunked snapshot whose chunks the
        driver reads (:meth:`~cdc.backend.Backend.chunked_batch_snapshot`): exactly the batches a streaming query
        started with the snapshot would run, without a record budget, until the snapshot is done and its change
        channel reached ``ending`` (``endingOffsets``, or ``at``: ``endingTimestamp``). Each of them reads up to
        ``chunks_per_batch`` chunks at its own cut, read here (:meth:`ChunkedSnapshot.prepare`) while the cut is
        held; the change ranges between cuts hold back the keys not emitted yet, as a stream's do.

        The read ends at the later of ``ending`` and the last cut: the rows read at a cut hold every change
        before it, so the changes up to it belong to the read. An ``ending`` position before the snapshot's start
        is refused, naming both."""
        begin = self._initial_chunked(chunked)
        cid = chunked.channel
        first = begin.channels[cid].pos
        bounds, given = self._bounds(ending, at, batch=True)
        if cid in given and int(bounds[cid]) < int(first):
            option = "endingOffsets" if at is None else "endingTimestamp"
            raise OptionError(
                f"a batch read cannot end before it starts (option {option!r}): channel {cid!r}: {option} position "
                f"{bounds[cid]!r} is before the snapshot's position {first!r}", option)
        start = begin.to_json()
        ranges: list[ChannelRange] = []
        try:
            while True:  # every batch moves a cursor or the channel, towards fixed bounds
                end = self.next(start, None, bounds)
                if end == start:
                    break
                batch = self.ranges(start, end)
                chunked.prepare(batch)  # at the cut the planning just opened, before the next one replaces it
                ranges += batch
                start = end
        finally:
            chunked.close_cut()
        state = Offset.from_json(start).snapshot
        if state is not None and state.pending:
            raise PositionError(f"the snapshot of {sorted(state.tables)} stopped before its last chunk")
        log.info("batch read of a chunked snapshot: %d ranges, %d of them chunks, up to %s", len(ranges),
                 sum(1 for r in ranges if r.channel.startswith(CHUNK_PREFIX)), Offset.from_json(start).positions())
        return ranges

    # ------------------------------------------------------------------ planning
    def next(
        self,
        start: OffsetJson,
        max_records: int | None = None,
        until: Mapping[str, Position] | None = None,
        *,
        respect_lineage: bool = True,
    ) -> OffsetJson:
        """The end offset of the next batch from ``start``: at most ``max_records`` records in all.

        Returns ``start`` itself when there is nothing to read and nothing to record.
        """
        begin = Offset.from_json(start)
        change = self.backend.resume(begin.source, planning=True)
        source = self.backend.source_state()
        if change.removed and begin.snapshot is not None:
            kept = {n: t for n, t in begin.snapshot.tables.items() if n not in change.removed}
            begin = replace(begin, snapshot=SnapshotState(kept, begin.snapshot.cut)
                            if kept or begin.snapshot.cut is not None else None)
        if begin.snapshot is not None or change.added:
            chunked = self.backend.chunked_snapshot()
            if chunked is None:
                raise OptionError(
                    "the query's offsets hold a chunked snapshot in progress, which this configuration cannot "
                    "continue (snapshot.mode changed?): restart it with the options it started with",
                    "snapshot.mode",
                )
            end = self._next_chunked(start, begin, chunked, max_records, until, change.added)
        else:
            end = self._next_changes(start, begin, max_records, until, respect_lineage)
        again = self.backend.resnapshots() if respect_lineage else ()
        busy = {n for n, t in (begin.snapshot.tables if begin.snapshot else {}).items() if not t.done and t.refresh is None}
        if busy & set(again):  # the consumer does not have every row yet: holding back goes on, as it was
            log.warning("ignoring the re-snapshot signal for %s: the snapshot of the table is still in progress; "
                        "signal again once it has ended", sorted(busy & set(again)))
        if redo := [t for t in again if t not in change.added and t not in busy]:
            # Signals in the range planned (Backend.resnapshots): planned again, those tables snapshotted anew from
            # the batch's cut, which comes after the signals (they were flushed before the cut was taken).
            chunked = self.backend.chunked_snapshot()
            assert chunked is not None, "a backend that reports re-snapshots snapshots in chunks"
            end = self._next_chunked(start, begin, chunked, max_records, until, change.added, redo)
            self.backend.resnapshots()  # the range planned again holds the same signals: handled
        if source is None or (end is start and (source == begin.source or begin.initial)):
            return end
        if end is start:  # nothing to read, but the set-up changed: a restart must see it recorded
            return Offset(begin.without_from(), turn=begin.turn, snapshot=_settled(begin),
                          source=source).to_json()
        return {**end, "source": source}

    def prepare_read(self, end: OffsetJson) -> None:
        """Before the batch ending at ``end`` is read (maybe a replay): the backend takes its recorded set-up up."""
        self.backend.resume(Offset.from_json(end).source, planning=False)

    def _next_changes(
        self, start: OffsetJson, begin: Offset, max_records: int | None, until: Mapping[str, Position] | None,
        respect_lineage: bool,
    ) -> OffsetJson:
        channels = {c.id: c for c in self.backend.list_channels()}
        new = {
            cid: self.backend.earliest(cid)
            for cid in sorted(channels)
            if cid not in begin.channels and (until is None or cid in until)
        }
        # A channel that appears now waits for the heads of the channels it follows (ChannelInfo.follows). That
        # holds from the query's initial offset too: it lists every channel that existed when the query began
        # (and stays the start while nothing was read), so a channel missing from it appeared after.
        gates = {
            cid: {f: self.backend.latest(f) for f in channels[cid].follows if f in begin.channels or f in new}
            for cid in new
            if channels[cid].follows and respect_lineage
        }
        order = eligible_channels(begin, new, channels, respect_lineage=respect_lineage, gates=gates)
        plans: dict[str, ChannelPlan] = {}
        for cid in order:
            pos = new[cid] if cid in new else begin.channels[cid].pos
            plans[cid] = ChannelPlan(pos, pos)

        def take(cid: str, want: int | None) -> Taken:
            bound = None if until is None else until.get(cid)
            p = plans[cid]
            try:
                planned = self.backend.plan(cid, p.end, want, bound)
            except DataLossError as exc:
                if self.fail_on_data_loss:
                    raise
                earliest = self.backend.earliest(cid)
                log.warning("%s; skipping to %r because failOnDataLoss is false", exc, earliest)
                p = ChannelPlan(earliest, earliest, skipped=True)
                planned = self.backend.plan(cid, earliest, want, bound)
            plans[cid] = replace(p, end=planned.end, finished=planned.finished)
            return Taken(planned.records, planned.finished)

        taken = share_budget(order, max_records, self.max_records_per_channel, begin.turn or 0, take)
        self.last_records = sum(taken.values())
        end = end_offset(begin, new, plans, limited=max_records is not None, gates=gates)
        return start if end is None else end.to_json()

    def _next_chunked(
        self, start: OffsetJson, begin: Offset, chunked: ChunkedSnapshot, max_records: int | None,
        until: Mapping[str, Position] | None, added: Sequence[str] = (), redo: Sequence[str] = (),
    ) -> OffsetJson:
        """The next batch of a chunked snapshot (see :mod:`cdc.snapshots.planning`): chunks at a new cut when
        one opens in time, else changes only; either way the change range holds back the keys not yet emitted.
        Tables ``added`` to the running query start their snapshot at this batch's cut, which waits for as long
        as it takes (their changes before it are never delivered, so no batch may end past it without it)."""
        chunked.close_cut()  # the previous batch has run: its cut is no longer read
        cid = chunked.channel
        pos = begin.channels[cid].pos
        settled = _settled(begin)
        state = SnapshotState()
        if begin.snapshot is not None:
            state = expire(with_late(begin.snapshot, chunked.recorded(begin.snapshot)).settled(), int(pos))
        bound = None if until is None else until.get(cid)
        cut: Cut | None
        if added or redo:
            cut, state = add_tables(state, chunked, added, redo)
            log.info("tables %s added to the query, %s snapshotted again: in chunks from %s=%r", sorted(added),
                     sorted(redo), cid, cut.pos)
        else:
            # A cut also while only late entries hold keys back: a key change out of a held key into one that is
            # not held leaves its unchanged values to a read of the new key's row, which needs a cut (without one,
            # the change range stops before such a change: plan_uncut).
            cut = chunked.open_cut(wait=until is not None) if state.tables else None
        entry = begin.channels[cid]
        records = 0
        if cut is not None:
            want = chunked.chunks_per_batch
            if max_records is not None:
                want = max(1, min(want, max_records // chunked.chunk_rows))
            if int(cut.pos) < int(pos):
                raise PositionError(f"a cut at {cut.pos!r} lies before the query's position {pos!r} on {cid!r}")
            records = self.backend.plan(cid, pos, None, cut.pos).records  # the range ends at the cut exactly

            def bounds(table: str, cursor: TableCursor, count: int) -> list[Any]:
                assert cut is not None and cursor.last is not None
                return chunked.bounds(table, cursor.after, cursor.last, count, cut)

            state = advance(state, cut, bounds, want)
            end_pos = cut.pos
        elif state.tables:
            planned = chunked.plan_uncut(pos, max_records, bound, state)
            records, end_pos = planned.records, planned.end
        else:
            planned = self.backend.plan(cid, pos, max_records, bound)
            records, end_pos = planned.records, planned.end
        self.last_records = records + sum(1 for _ in state.chunks())
        channels = {c: (replace(e, pos=end_pos) if c == cid else e) for c, e in begin.without_from().items()}
        if begin.initial:
            channels[cid] = replace(channels[cid], from_=entry.pos)
        snapshot = state if state.tables or state.cut is not None else None
        end = Offset(channels, turn=(begin.turn or 0) + 1 if max_records is not None else None, snapshot=snapshot)
        if end_pos == pos and cut is None and snapshot == settled and not begin.initial:
            return start  # nothing to read, nothing learned
        return end.to_json()

    # ------------------------------------------------------------------ ranges
    @staticmethod
    def ranges(start: OffsetJson, end: OffsetJson) -> list[ChannelRange]:
        """The channel ranges of the batch ``(start, end]``; empty ranges are left out."""
        return batch_ranges(Offset.from_json(start), Offset.from_json(end))


def positions(offset: OffsetJson) -> dict[str, Position]:
    return Offset.from_json(offset).positions()


def describe(ranges: Sequence[ChannelRange]) -> str:
    return ", ".join(map(str, ranges)) or "nothing"
