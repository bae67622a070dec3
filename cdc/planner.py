"""Planning micro-batches over channels: offsets, lineage, admission control. No Spark in here.

An **offset** is what Spark writes to its offset log for each batch, a JSON-safe dict::

    {"channels": {"c0": {"pos": 120}, "c1": {"pos": 80, "done": true}, "c2": {"pos": 7, "from": 0}}}

``pos`` is the channel's position at the end of the batch. ``done`` marks a finished channel that has
been read to its final end: its children may start in the *next* batch. ``from`` appears only in the
batch that first reads a channel (a newly discovered channel, or a jump forward after data loss with
``failOnDataLoss=false``): it is where that batch's range starts, so a replay never has to ask the backend
where a channel began. A batch's ranges are therefore a pure function of its (start, end) offsets.

``startingOffsets=snapshot`` starts with a snapshot of the table at a consistent cut of the log (see
:class:`~cdc.backend.SnapshotInfo`): its chunks enter the offset as channels marked ``"snapshot": true``,
and the change channels start at the cut. No change channel takes part in a batch until every snapshot chunk
is ``done`` in the batch's start offset, so the full data arrives first, then every change after the cut:
no gap (the cut is consistent), no duplicate (a change is either folded into the snapshot or after the cut),
and a snapshot row's ``_seq`` is that of the last change it includes, smaller than any later change's.

``turn`` (present when ``maxRecordsPerTrigger`` applies) counts limited batches: the channel served first
rotates with it, so a budget smaller than the number of channels starves none.

The first batch is special: Spark does not store a query's initial offset, and after a crash it asks the
source again, which for ``latest`` (or after retention moved ``earliest``) gives a different answer. So
:meth:`Planner.initial` marks its offset ``"initial": true`` and the first batch's end offset carries
``from`` for every channel: batch 0 replays exactly too.

Lineage rule: a channel takes part in a batch only when every parent is ``done`` in the batch's *start*
offset, i.e. has been completely delivered by an earlier batch. A parent the backend has forgotten and the
offset never saw is taken as finished (there is nothing left to deliver from it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.backend import Backend, ChannelInfo, Position
from cdc.errors import DataLossError, OptionError

log = logging.getLogger(__name__)

Offset = dict[str, Any]


@dataclass(frozen=True)
class ChannelRange:
    """One channel's range in a batch: ``[start, end)``."""

    channel: str
    start: Position
    end: Position


def empty_offset() -> Offset:
    return {"channels": {}}


def _entries(offset: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    channels = offset.get("channels")
    if not isinstance(channels, dict):
        raise ValueError(f"not a cdc offset: {json.dumps(offset)[:200]}")
    return channels


class Planner:
    """Turns backend state into offsets and offsets into ranges."""

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

    # ------------------------------------------------------------------ start positions
    def initial(self, spec: str) -> Offset:
        """The offset a new query starts from: ``earliest``, ``latest`` or JSON per channel."""
        channels = self.backend.list_channels()
        text = spec.strip()
        per_channel: dict[str, Any] = {}
        default = text.lower()
        if default == "snapshot":
            return self._initial_snapshot()
        if default not in ("earliest", "latest"):
            try:
                per_channel = json.loads(text)
            except json.JSONDecodeError:
                per_channel = None  # type: ignore[assignment]
            if not isinstance(per_channel, dict):
                raise OptionError(
                    "option 'startingOffsets': accepted values are earliest, latest, or a JSON object "
                    f'{{"<channel>": <position> | "earliest" | "latest"}}; got {spec!r}',
                    "startingOffsets",
                )
            known = {c.id for c in channels}
            unknown = sorted(set(per_channel) - known)
            if unknown:
                raise OptionError(
                    f"option 'startingOffsets': unknown channels {unknown}; channels: {sorted(known)}",
                    "startingOffsets",
                )
            default = "earliest"
        out: dict[str, dict[str, Any]] = {}
        for ch in channels:
            where = per_channel.get(ch.id, default)
            if where == "earliest":
                out[ch.id] = {"pos": self.backend.earliest(ch.id)}
            elif where == "latest":
                out[ch.id] = {"pos": self.backend.latest(ch.id)}
                if ch.finished:
                    out[ch.id]["done"] = True
            else:
                out[ch.id] = {"pos": self.backend.parse_position(ch.id, where)}
        return {"channels": out, "initial": True}

    def _initial_snapshot(self) -> Offset:
        snap = self.backend.snapshot()
        out: dict[str, dict[str, Any]] = {chunk: {"pos": self.backend.earliest(chunk), "snapshot": True} for chunk in snap.chunks}
        for cid, pos in snap.positions.items():
            out[cid] = {"pos": pos}
        log.info("snapshot %s: %d chunks, change log cut at %s", snap.id, len(snap.chunks), dict(snap.positions))
        return {"channels": out, "initial": True}

    def until(self, spec: str) -> dict[str, Position]:
        """Per-channel upper bounds from ``endingOffsets`` (batch) or a frozen AvailableNow target."""
        text = spec.strip()
        if text.lower() == "latest":
            return {c.id: self.backend.latest(c.id) for c in self.backend.list_channels()}
        try:
            given = json.loads(text)
        except json.JSONDecodeError:
            given = None
        if not isinstance(given, dict):
            raise OptionError(
                f'option \'endingOffsets\': accepted values are latest or a JSON object {{"<channel>": <position>}}; got {spec!r}',
                "endingOffsets",
            )
        out: dict[str, Position] = {}
        known = {c.id for c in self.backend.list_channels()}
        for ch in known:
            value = given.get(ch, "latest")
            out[ch] = self.backend.latest(ch) if value == "latest" else self.backend.parse_position(ch, value)
        unknown = sorted(set(given) - known)
        if unknown:
            raise OptionError(f"option 'endingOffsets': unknown channels {unknown}", "endingOffsets")
        return out

    # ------------------------------------------------------------------ planning
    def next(
        self,
        start: Offset,
        max_records: int | None = None,
        until: Mapping[str, Position] | None = None,
        *,
        respect_lineage: bool = True,
    ) -> Offset:
        """The end offset of the next batch from ``start``: at most ``max_records`` records in all."""
        start_entries = _entries(start)
        channels = {c.id: c for c in self.backend.list_channels()}
        entries: dict[str, dict[str, Any]] = {
            cid: {k: v for k, v in e.items() if k != "from"} for cid, e in start_entries.items()
        }
        for cid in sorted(channels):
            if cid not in entries and (until is None or cid in until):
                pos = self.backend.earliest(cid)
                entries[cid] = {"pos": pos, "new": True}

        snapshot_pending = any(e.get("snapshot") and not e.get("done") for e in start_entries.values())
        eligible = [
            cid
            for cid in sorted(entries, key=_channel_sort_key)
            if not entries[cid].get("done")
            and (
                entries[cid].get("snapshot")
                or (
                    cid in channels
                    and not (respect_lineage and snapshot_pending)
                    and (not respect_lineage or self._parents_done(channels[cid], start_entries, channels))
                )
            )
        ]
        positions = {cid: entries[cid]["pos"] for cid in eligible}
        begin = dict(positions)
        taken = dict.fromkeys(eligible, 0)
        finished: dict[str, bool] = {}
        budget = max_records
        active = list(eligible)
        turn = int(start.get("turn", 0))

        def plan(cid: str, want: int | None) -> int:
            bound = None if until is None else until.get(cid)
            try:
                p = self.backend.plan(cid, positions[cid], want, bound)
            except DataLossError as exc:
                if self.fail_on_data_loss:
                    raise
                earliest = self.backend.earliest(cid)
                log.warning("%s; skipping to %r because failOnDataLoss is false", exc, earliest)
                positions[cid] = begin[cid] = earliest
                entries[cid]["skipped"] = True
                p = self.backend.plan(cid, earliest, want, bound)
            positions[cid] = p.end
            finished[cid] = p.finished
            taken[cid] += p.records
            return p.records

        cap = self.max_records_per_channel
        if budget is None:
            for cid in active:
                plan(cid, cap)
        else:
            # Water-filling: share the budget evenly, hand what exhausted channels leave to the others.
            # Every round either drops a channel or spends at least one record, so it terminates.
            # Who goes first rotates from batch to batch (the offset counts the turns), so a budget
            # smaller than the number of channels starves no channel.
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
                    got = plan(cid, want)
                    budget -= got
                    if got == want and not finished[cid]:
                        still.append(cid)
                active = still
            for cid in eligible:  # a finished, already-exhausted channel must still be marked done
                if cid not in finished:
                    plan(cid, 0)

        for cid in eligible:
            e = entries[cid]
            e["pos"] = positions[cid]
            if finished.get(cid):
                e["done"] = True
        first_batch = bool(start.get("initial"))
        unchanged = entries == {cid: {k: v for k, v in e.items() if k != "from"} for cid, e in start_entries.items()}
        if unchanged:
            return start  # nothing to read and nothing learned: Spark runs no batch
        out: dict[str, dict[str, Any]] = {}
        for cid, e in entries.items():
            is_new = e.pop("new", False)
            skipped = e.pop("skipped", False)
            if cid in begin and (skipped or (is_new and begin[cid] != e["pos"])):
                e["from"] = begin[cid]
            out[cid] = e
        if first_batch:  # every range of batch 0 is recorded: its start is not kept by Spark
            for cid, e in out.items():
                e.setdefault("from", start_entries[cid]["pos"] if cid in start_entries else e["pos"])
        return {"channels": out, "turn": turn + 1} if max_records is not None else {"channels": out}

    @staticmethod
    def _parents_done(
        ch: ChannelInfo, start_entries: Mapping[str, Mapping[str, Any]], channels: Mapping[str, ChannelInfo]
    ) -> bool:
        for parent in ch.parents:
            entry = start_entries.get(parent)
            if entry is None:
                if parent in channels:
                    return False  # the parent is known but not yet registered: it goes first
                continue  # forgotten by the backend and never seen: nothing left to deliver
            if not entry.get("done"):
                return False
        return True

    # ------------------------------------------------------------------ ranges
    @staticmethod
    def ranges(start: Offset, end: Offset) -> list[ChannelRange]:
        """The channel ranges of the batch ``(start, end]``; empty ranges are left out."""
        if start == end:
            return []  # no batch: ``from`` marks of an offset returned unchanged do not start a range
        start_entries = _entries(start)
        out = []
        for cid, e in _entries(end).items():
            if "from" in e:
                begin = e["from"]
            elif cid in start_entries:
                begin = start_entries[cid]["pos"]
            else:
                continue  # registered in this batch with nothing to read
            if begin != e["pos"]:
                out.append(ChannelRange(cid, begin, e["pos"]))
        out.sort(key=lambda r: _channel_sort_key(r.channel))
        return out


def _channel_sort_key(cid: str) -> tuple[int, str]:
    return (len(cid), cid)


def positions(offset: Offset) -> dict[str, Position]:
    return {cid: e["pos"] for cid, e in _entries(offset).items()}


def describe(ranges: Sequence[ChannelRange]) -> str:
    return ", ".join(f"{r.channel}[{r.start!r}, {r.end!r})" for r in ranges) or "nothing"
