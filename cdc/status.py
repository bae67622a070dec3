"""``cdc status CHECKPOINT``: where a streaming query is, per channel, against the change log's heads now.

The checkpoint holds the positions (Spark's offset log, read through :mod:`cdc.checkpoint`); it does not
hold the source's options, so the command takes them (``--option key=value``) and opens the backend to ask
for the heads (:meth:`~cdc.backend.Backend.heads`). A channel's state:

``finished``             read to its final end (split or merged away)
``waiting-for-parents``  a child whose parents are not completely delivered yet: it has not started
``snapshot``             a chunk of the snapshot the query started with, still being read; for a chunked
                         snapshot, one row per table still being read (``chunk:<table>``): its position is the
                         last key emitted, its head the last key to read
``new``                  created after the query's last batch: the next batch registers it
``reading``              any other channel
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from cdc.backend import Backend, ChannelInfo, Position, open_backend
from cdc.checkpoint import BatchOffsets, read_batch
from cdc.lag import time_behind_ms
from cdc.offsets import Offset
from cdc.options import SourceOptions, accepted_options
from cdc.planner import parents_done


@dataclass(frozen=True)
class ChannelStatus:
    channel: str
    state: str
    position: Position | None
    head: Position | None
    behind: int | None
    time_behind_ms: int | None
    measures: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class QueryStatus:
    checkpoint: str
    batch: BatchOffsets
    channels: list[ChannelStatus]
    at: datetime


def open_source_backend(options: Mapping[str, str]) -> Backend:
    """The backend that the source's options name, given only the backend's own options (the source's
    behaviour options such as ``maxRecordsPerTrigger`` are accepted and ignored here)."""
    core = accepted_options(SourceOptions)
    name = next((v for k, v in options.items() if k.lower() == "backend"), "local")
    return open_backend(name, {k: v for k, v in options.items() if k.lower() not in core})


def _state(cid: str, offset: Offset, channels: Mapping[str, ChannelInfo]) -> str:
    entry = offset.channels.get(cid)
    if entry is not None and entry.done:
        return "finished"
    if entry is not None and entry.snapshot:
        return "snapshot"
    if cid in channels and not parents_done(channels[cid], offset, channels):
        return "waiting-for-parents"
    return "new" if entry is None else "reading"


def query_status(checkpoint: str, backend: Backend, source_index: int = 0) -> QueryStatus:
    """The status of the query's source ``source_index`` after its last planned batch."""
    batch = read_batch(checkpoint)
    offset = batch.source(source_index)
    channels = {c.id: c for c in backend.list_channels()}
    live = {cid: e.pos for cid, e in offset.channels.items() if not e.done}
    new = {cid: backend.earliest(cid) for cid in channels if cid not in offset.channels}
    now = datetime.now(UTC)
    heads = backend.heads({**live, **new})
    out = []
    for cid in sorted({*offset.channels, *new}, key=lambda c: (len(c), c)):
        entry = offset.channels.get(cid)
        if entry is not None and entry.done:
            out.append(ChannelStatus(cid, "finished", entry.pos, entry.pos, 0, 0))
            continue
        h = heads[cid]
        state = _state(cid, offset, channels)
        if state == "reading" and h.behind == 0 and cid in channels and channels[cid].finished:
            state = "finished"  # read to its final end; the offset marks it done with the next batch
        position = None if entry is None else entry.pos
        out.append(
            ChannelStatus(cid, state, position, h.head, h.behind, time_behind_ms(h, now), dict(h.measures))
        )
    if offset.snapshot is not None:
        for table, cursor in offset.snapshot.tables.items():
            if not cursor.done:
                after = None if cursor.after is None else list(cursor.after)
                out.append(ChannelStatus(f"chunk:{table}", "snapshot", after,
                                           None if cursor.last is None else list(cursor.last), None, None))
    return QueryStatus(checkpoint, batch, out, now)


def _short(value: Any, width: int = 36) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def _duration(ms: int | None) -> str:
    if ms is None:
        return "?"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


_STATE_STYLE = {"finished": "dim", "waiting-for-parents": "yellow", "new": "cyan", "snapshot": "magenta"}


def render(status: QueryStatus) -> Group:
    """A heading line, and a rich table with one row per channel."""
    b = status.batch
    heading = Text.assemble(
        (status.checkpoint, "bold"),
        f" · batch {b.batch_id} ({'committed' if b.committed else 'planned, not committed'})"
        f" · {status.at:%Y-%m-%d %H:%M:%S} UTC",
    )
    measures = sorted({k for c in status.channels for k in c.measures})
    table = Table()
    for name, justify in [
        ("channel", "left"),
        ("state", "left"),
        ("position", "right"),
        ("head", "right"),
        ("records behind", "right"),
        ("time behind", "right"),
        *((m, "right") for m in measures),
    ]:
        table.add_column(name, justify=justify, no_wrap=name in ("channel", "state"))  # type: ignore[arg-type]
    for c in status.channels:
        behind = "?" if c.behind is None else f"{c.behind:,}"
        extra = [f"{c.measures[m]:g}" if m in c.measures else "-" for m in measures]
        table.add_row(
            c.channel,
            c.state,
            _short(c.position),
            _short(c.head),
            behind,
            _duration(c.time_behind_ms),
            *extra,
            style=_STATE_STYLE.get(c.state),
        )
    return Group(heading, table)
