"""Lag per channel: how far a query's positions are behind each channel's head.

PySpark's Python sources cannot put custom metrics into a query's progress; the one thing they report
besides offsets is ``reportLatestOffset()``, which Spark shows as the source's ``latestOffset``. The source
therefore reports there, per channel, the head, the records behind it and the commit times, as JSON::

    {"channels": {"c0": {"pos": 120, "behind": 20, "headTime": "2026-11-23T06:00:00.000000Z",
                         "deliveredTime": "2026-11-23T05:59:58.000000Z", "timeBehindMs": 2150}},
     "at": "2026-11-23T06:00:00.150000Z"}

``pos`` is the head (as in the offsets Spark logs), ``behind`` the records from the query's position after
the batch being planned up to the head, ``deliveredTime`` the commit time of the last change that batch
delivers, ``timeBehindMs`` how long ago that was when the query is behind (``0`` when it is not: a query
that has read everything is not late, however quiet the table), and the backend's own measures (Tablestore
``rpoMs``, Pulsar ``backlog``) beside them. :func:`from_report` reads it back for the listener
(:mod:`cdc.monitor`) and ``cdc status`` builds the same :class:`ChannelLag` from a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cdc.backend import Backend, ChannelHead, Position

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class ChannelLag:
    """One channel's lag at ``at``."""

    channel: str
    head: Position
    behind: int | None
    head_time: datetime | None = None
    delivered_time: datetime | None = None
    time_behind_ms: int | None = None
    measures: Mapping[str, float] = field(default_factory=dict)


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime(_TIME_FORMAT)


def _parse_time(value: Any) -> datetime | None:
    return datetime.strptime(value, _TIME_FORMAT).replace(tzinfo=UTC) if isinstance(value, str) else None


def time_behind_ms(head: ChannelHead, now: datetime) -> int | None:
    """How long ago the last delivered change was committed, while records are behind; 0 when none is."""
    if head.behind == 0:
        return 0
    if head.position_time is None:
        # Nothing delivered yet: the query is as late as the oldest change, at least the head's age.
        return None if head.head_time is None else max(0, int((now - head.head_time).total_seconds() * 1000))
    return max(0, int((now - head.position_time).total_seconds() * 1000))


def measure(
    backend: Backend, positions: Mapping[str, Position], now: datetime | None = None
) -> list[ChannelLag]:
    """The lag of every channel in ``positions`` (a query's), asking the backend for its heads."""
    now = now or datetime.now(UTC)
    heads = backend.heads(positions)
    return [
        ChannelLag(
            cid, h.head, h.behind, h.head_time, h.position_time, time_behind_ms(h, now), dict(h.measures)
        )
        for cid, h in heads.items()
    ]


def to_report(lags: list[ChannelLag], now: datetime) -> dict[str, Any]:
    """The JSON the source returns from ``reportLatestOffset`` (see the module docstring)."""
    channels: dict[str, Any] = {}
    for lag in lags:
        entry: dict[str, Any] = {"pos": lag.head}
        if lag.behind is not None:
            entry["behind"] = lag.behind
        for key, value in (("headTime", _time(lag.head_time)), ("deliveredTime", _time(lag.delivered_time))):
            if value is not None:
                entry[key] = value
        if lag.time_behind_ms is not None:
            entry["timeBehindMs"] = lag.time_behind_ms
        entry.update(lag.measures)
        channels[lag.channel] = entry
    return {"channels": channels, "at": _time(now)}


_KNOWN = {"pos", "behind", "headTime", "deliveredTime", "timeBehindMs"}


def from_report(report: str | Mapping[str, Any] | None) -> list[ChannelLag]:
    """The lags in a source's ``latestOffset`` (as progress shows it: a JSON string); empty if not ours."""
    if isinstance(report, str):
        try:
            report = json.loads(report)
        except json.JSONDecodeError:
            return []
    if not isinstance(report, Mapping) or not isinstance(report.get("channels"), Mapping):
        return []
    out = []
    for cid, e in report["channels"].items():
        if not isinstance(e, Mapping) or "pos" not in e:
            continue
        measures = {k: float(v) for k, v in e.items() if k not in _KNOWN and isinstance(v, (int, float))}
        out.append(
            ChannelLag(
                str(cid),
                e["pos"],
                e.get("behind"),
                _parse_time(e.get("headTime")),
                _parse_time(e.get("deliveredTime")),
                e.get("timeBehindMs"),
                measures,
            )
        )
    return out
