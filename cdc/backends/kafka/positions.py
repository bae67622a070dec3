"""Kafka's partitions as channels and offsets as positions.

A channel is one partition of one topic, named ``<topic>:<partition>`` (``orders:0``; a colon is not a
character of Kafka's topic names, so the name always parses back). A position is an offset: the offset of the
next record to read, so the range ``[start, end)`` holds the records at offsets ``start`` to ``end - 1``, exactly
as Kafka's own positions work. Not every offset holds a record a consumer sees: a compacted topic drops records
that a later one of the same key superseded, and transactional producers leave commit and abort markers
(control records) and, under ``read_committed``, aborted records in the log. A range therefore holds *at most*
``end - start`` records, and a gap between offsets is no data loss; only a start below the partition's first
offset (its log start offset, moved by retention) is.

Spark's own Kafka source writes ``startingOffsets``/``endingOffsets`` as ``{"<topic>": {"<partition>": <offset>}}``
with ``-2`` for earliest and ``-1`` for latest: :func:`from_spark_offsets` reads that form too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdc.errors import PositionError

EARLIEST, LATEST = -2, -1
"""Spark's (and Kafka's) codes in startingOffsets/endingOffsets JSON."""


@dataclass(frozen=True, order=True)
class Partition:
    topic: str
    partition: int

    @property
    def id(self) -> str:
        return f"{self.topic}:{self.partition}"

    @classmethod
    def parse(cls, channel: str) -> Partition:
        topic, sep, number = channel.rpartition(":")
        if not sep or not topic or not number.isdigit():
            raise PositionError(f"not a Kafka channel: {channel!r} (expected <topic>:<partition>)")
        return cls(topic, int(number))


def to_offset(value: Any, channel: str) -> int:
    """A position as an offset; anything else raises :class:`PositionError` naming the channel."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PositionError(f"channel {channel!r}: a Kafka position is an offset (an integer >= 0), got {value!r}")
    return value


def from_spark_offsets(given: Mapping[str, Any]) -> dict[str, Any]:
    """``{"<topic>": {"<partition>": <offset>}}`` (Spark's form; ``-2`` earliest, ``-1`` latest) as
    ``{"<topic>:<partition>": <offset> | "earliest" | "latest"}``; the channel form passes through as it is."""
    out: dict[str, Any] = {}
    for key, value in given.items():
        if not isinstance(value, Mapping):
            out[key] = value
            continue
        for partition, offset in value.items():
            if not str(partition).lstrip("-").isdigit():
                raise PositionError(f"topic {key!r}: {partition!r} is not a partition number")
            out[f"{key}:{int(partition)}"] = {EARLIEST: "earliest", LATEST: "latest"}.get(offset, offset)
    return out
