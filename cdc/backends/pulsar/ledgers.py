"""Where a partition's range can be cut without reading it (``minPartitions``): the entries of its ledgers.

A partition's messages live in BookKeeper ledgers, one after another; a ledger's entries are numbered from 0,
and each entry holds one message or one producer batch. The admin API's internal stats of the partition list
its ledgers and, for every closed ledger, how many entries it holds (the open ledger, last, shows 0 there).
So every entry of a range is known without reading a message: the entries of the closed ledgers between the
range's two ends, and, in the ledger of the range's end, the entries before the end's own.

A range ``(s, e]`` is cut before whole entries: the position ``[ledger, entry, -2]`` is the gap before the
entry's first message, where a Reader can start (the entry exists, so the reader's data-loss check holds).
The candidates are the entries strictly between ``s``'s entry and ``e``'s entry; the cut points are those
nearest to equal shares of them (:func:`cdc.partitions.pick_near`). They depend on the two ends and on closed
ledgers' entry counts, which never change: a replayed batch is cut at the same entries. Entries are the unit
of size, not messages: a producer's batches make entries of different sizes, so pieces hold about as many
entries, not always as many messages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cdc.backends.pulsar.positions import Key
from cdc.errors import BackendUnavailableError
from cdc.partitions import pick_near

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ledgers:
    """A partition's ledgers as the internal stats list them: ``(ledger id, entries)``, in id order (the last,
    open ledger with 0 entries)."""

    ledgers: tuple[tuple[int, int], ...]

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> Ledgers:
        try:
            pairs = tuple(sorted((int(x["ledgerId"]), int(x["entries"])) for x in stats["ledgers"]))
        except (TypeError, KeyError, ValueError):
            raise BackendUnavailableError(
                f"Pulsar admin internalStats: unexpected 'ledgers' {str(stats.get('ledgers'))[:200]}"
            ) from None
        return cls(pairs)

    @property
    def last(self) -> int:
        return self.ledgers[-1][0] if self.ledgers else -1

    def spans(self, start: Key, end: Key) -> Iterator[tuple[int, int, int]]:
        """``(ledger, first entry, entry after the last)`` of the entries strictly between the entries of
        ``start`` and ``end``: every whole entry of the range ``(start, end]`` but the end's own."""
        for ledger, entries in self.ledgers:
            if ledger < start[0] or ledger > end[0]:
                continue
            lo = start[1] + 1 if ledger == start[0] else 0
            hi = end[1] if ledger == end[0] else entries  # a closed ledger's count; the end's ledger: up to it
            if hi > lo:
                yield ledger, lo, hi

    def count(self, start: Key, end: Key) -> int:
        """The entries strictly between the two ends' entries."""
        return sum(hi - lo for _, lo, hi in self.spans(start, end))

    def cut_points(self, start: Key, end: Key, parts: int) -> list[list[int]]:
        """At most ``parts - 1`` positions before whole entries of ``(start, end]``, nearest to equal shares."""
        spans = list(self.spans(start, end))
        n = sum(hi - lo for _, lo, hi in spans)
        # Entry i of the range (counted from 0) opens piece k when it is nearest to k * n / parts; entry 0 never
        # does: the first piece starts at ``start``, and holds at least that entry.
        picks = pick_near(range(1, n), 0, n, parts)
        out: list[list[int]] = []
        seen = 0
        it = iter(picks)
        want = next(it, None)
        for ledger, lo, hi in spans:
            while want is not None and want < seen + hi - lo:
                out.append([ledger, lo + want - seen, -2])
                want = next(it, None)
            seen += hi - lo
        return out
