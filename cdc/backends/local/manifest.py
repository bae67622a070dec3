"""The manifest: the published state of a local log, in one file replaced by one atomic rename.

It lists every channel (parents, key-hash range, earliest and head positions, finished or not) with the next
sequence number and channel number, so one rename publishes an append to several channels together with the
sequence numbers it used, and a split or merge together with its children. The JSON carries a CRC-32 of its
body, so a damaged manifest is refused instead of misread.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cdc.backends.local.errors import CorruptLogError

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ChannelEntry:
    parents: tuple[str, ...]
    hash_range: tuple[int, int]
    earliest: int = 0
    head: int = 0
    closed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "parents": list(self.parents),
            "range": list(self.hash_range),
            "earliest": self.earliest,
            "head": self.head,
            "closed": self.closed,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChannelEntry:
        lo, hi = d["range"]
        return cls(tuple(d["parents"]), (int(lo), int(hi)), int(d["earliest"]), int(d["head"]), bool(d["closed"]))


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Manifest:
    next_seq: int
    next_channel: int
    channels: Mapping[str, ChannelEntry] = field(default_factory=dict)

    def ordered_ids(self) -> list[str]:
        return sorted(self.channels, key=lambda c: (len(c), c))

    def advanced(
        self,
        heads: Mapping[str, int],
        next_seq: int | None = None,
        channels: Mapping[str, ChannelEntry] | None = None,
    ) -> Manifest:
        """This manifest with channels moved to new ``heads`` (and entries replaced by ``channels``)."""
        entries = {**self.channels, **(channels or {})}
        for cid, head in heads.items():
            entries[cid] = replace(entries[cid], head=head)
        return replace(self, next_seq=self.next_seq if next_seq is None else next_seq, channels=entries)

    def handed_over(self, parents: Iterable[str], children: Mapping[str, ChannelEntry]) -> Manifest:
        """This manifest with ``parents`` finished at their heads and ``children`` added."""
        entries = dict(self.channels)
        for p in parents:
            entries[p] = replace(entries[p], closed=True)
        entries.update(children)
        return replace(self, next_channel=self.next_channel + len(children), channels=entries)

    def to_bytes(self) -> bytes:
        body = {
            "next_seq": self.next_seq,
            "next_channel": self.next_channel,
            "channels": {c: e.to_json() for c, e in self.channels.items()},
        }
        return json.dumps({"crc32": zlib.crc32(_canonical(body)), "manifest": body}, sort_keys=True).encode()

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read a manifest; :class:`~cdc.backends.local.errors.CorruptLogError` if it is damaged."""
        raw = path.read_bytes()
        try:
            doc = json.loads(raw)
            body = doc["manifest"]
            if zlib.crc32(_canonical(body)) != doc["crc32"]:
                raise CorruptLogError(f"{path} is damaged: its checksum does not match its content", str(path))
            channels = {str(c): ChannelEntry.from_json(e) for c, e in body["channels"].items()}
            return cls(int(body["next_seq"]), int(body["next_channel"]), channels)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptLogError(f"{path} is damaged: {exc!r}", str(path)) from exc
