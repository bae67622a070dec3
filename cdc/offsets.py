"""The offsets Spark writes to a query's offset log, as frozen types. Users' checkpoints keep them forever.

An offset is stored as JSON, one object per batch end::

    {"channels": {"c0": {"pos": 120}, "c1": {"pos": 80, "done": true}, "c2": {"pos": 7, "from": 0}},
     "turn": 3}

Per channel (:class:`ChannelOffset`):

``pos``
    the channel's position at the end of the batch (a backend-defined JSON value, never ``null``).
``done``
    the channel is finished and was read to its final end: its children may start in the *next* batch.
``from``
    only in the batch that first reads a channel (a new channel, a jump forward after data loss, every
    channel of batch 0): where that batch's range starts, so a replay never asks the backend.
``snapshot``
    the channel is a chunk of a materialised snapshot (``snapshot.mode=exported``), not a change channel.
``after``
    ``{channel: position}``: a channel that appeared while the query ran waits until the query's positions in
    these channels reached these (see :attr:`cdc.backend.ChannelInfo.follows`); dropped once it took part.

Per offset (:class:`Offset`): ``turn`` counts batches planned under a record budget (present only then),
``initial`` marks the offset a query starts from (never the end of a batch), ``snapshot`` holds a chunked
snapshot's cursors while one is in progress (one per table, never one per chunk: see
:mod:`cdc.snapshots.state`), ``source`` what the backend records of its own set-up, so that a restart can
tell what changed (:meth:`cdc.backend.Backend.source_state`; PostgreSQL: its tables, slot and publication).

The JSON written by every release must still load: :meth:`Offset.from_json` accepts exactly these keys
and :meth:`Offset.to_json` writes them back in the same order, so ``json.dumps`` gives the same text (Spark
compares offsets as text). Keys are omitted when false or absent, as they always were.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cdc.channels import Position as Position
from cdc.errors import OffsetError
from cdc.snapshots.state import SnapshotState

OffsetJson = dict[str, Any]
"""An offset as Spark stores it and hands it to the source."""

_CHANNEL_KEYS = frozenset({"pos", "done", "from", "snapshot", "after"})
_OFFSET_KEYS = frozenset({"channels", "turn", "initial", "snapshot", "source"})


def _flag(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise OffsetError(f"not a cdc offset: {where}: {key!r} must be true or false, got {value!r}")
    return value


def _after(value: Any, where: str) -> dict[str, Position] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OffsetError(f"not a cdc offset: {where}: 'after' must be an object of positions, got {value!r}")
    return {str(k): v for k, v in value.items()}


@dataclass(frozen=True)
class ChannelOffset:
    """One channel's entry in an offset."""

    pos: Position
    snapshot: bool = False
    done: bool = False
    from_: Position | None = None
    """JSON ``from``: where this batch's range of the channel starts, when not at the previous ``pos``."""
    after: Mapping[str, Position] | None = None
    """JSON ``after``: the positions other channels must reach before this one takes part."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pos": self.pos}
        if self.snapshot:
            out["snapshot"] = True
        if self.done:
            out["done"] = True
        if self.from_ is not None:
            out["from"] = self.from_
        if self.after:
            out["after"] = dict(self.after)
        return out

    @classmethod
    def from_json(cls, channel: str, value: Any) -> ChannelOffset:
        where = f"channel {channel!r}"
        if not isinstance(value, dict) or "pos" not in value:
            raise OffsetError(f"not a cdc offset: {where} has no position: {json.dumps(value)[:200]}")
        unknown = sorted(set(value) - _CHANNEL_KEYS)
        if unknown:
            raise OffsetError(f"not a cdc offset: {where} has unknown keys {unknown}")
        return cls(
            pos=value["pos"],
            snapshot=_flag(value.get("snapshot", False), "snapshot", where),
            done=_flag(value.get("done", False), "done", where),
            from_=value.get("from"),
            after=_after(value.get("after"), where),
        )


@dataclass(frozen=True)
class Offset:
    """Every channel's entry at the end of a batch (or at a query's start). Treat ``channels`` as read-only:
    it keeps the order the channels were registered in, which is the order of the JSON."""

    channels: Mapping[str, ChannelOffset] = field(default_factory=dict)
    turn: int | None = None
    initial: bool = False
    snapshot: SnapshotState | None = None
    """A chunked snapshot in progress (``snapshot.mode=chunked``)."""
    source: Mapping[str, Any] | None = None
    """JSON ``source``: the backend's set-up as of this offset (see :meth:`cdc.backend.Backend.source_state`)."""

    def positions(self) -> dict[str, Position]:
        return {cid: e.pos for cid, e in self.channels.items()}

    def without_from(self) -> dict[str, ChannelOffset]:
        """The channel entries with their ``from`` marks dropped: the state a following batch starts from."""
        return {cid: replace(e, from_=None) if e.from_ is not None else e for cid, e in self.channels.items()}

    def to_json(self) -> OffsetJson:
        out: OffsetJson = {"channels": {cid: e.to_json() for cid, e in self.channels.items()}}
        if self.initial:
            out["initial"] = True
        if self.turn is not None:
            out["turn"] = self.turn
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot.to_json()
        if self.source is not None:
            out["source"] = dict(self.source)
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Offset:
        channels = value.get("channels") if isinstance(value, Mapping) else None
        if not isinstance(channels, dict):
            raise OffsetError(f"not a cdc offset: {json.dumps(value, default=repr)[:200]}")
        unknown = sorted(set(value) - _OFFSET_KEYS)
        if unknown:
            raise OffsetError(f"not a cdc offset: unknown keys {unknown}")
        turn = value.get("turn")
        if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
            raise OffsetError(f"not a cdc offset: 'turn' must be a count, got {turn!r}")
        source = value.get("source")
        if source is not None and not isinstance(source, dict):
            raise OffsetError(f"not a cdc offset: 'source' must be an object, got {json.dumps(source)[:200]}")
        return cls(
            channels={str(cid): ChannelOffset.from_json(str(cid), e) for cid, e in channels.items()},
            turn=turn,
            initial=_flag(value.get("initial", False), "initial", "the offset"),
            snapshot=SnapshotState.from_json(value["snapshot"]) if "snapshot" in value else None,
            source=source,
        )
