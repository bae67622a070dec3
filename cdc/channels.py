"""The words for a change log's parts, shared by the backend contract, the offsets and the planner.

A change log is a set of **channels**; a channel's records are addressed by **positions** that the backend
defines (see :mod:`cdc.backend`), and a **range** ``[start, end)`` of a channel holds the records from
``start`` up to, not including, ``end``. This module imports nothing heavy: the offsets and the planner use
it without loading pyarrow or pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Position = Any
"""A JSON-safe value (int, str, list or dict of those) that addresses a gap between records."""


@dataclass(frozen=True)
class ChannelRange:
    """The records ``[start, end)`` of ``channel``."""

    channel: str
    start: Position
    end: Position

    def __str__(self) -> str:
        return f"{self.channel}[{self.start!r}, {self.end!r})"
