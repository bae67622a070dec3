"""Record budgets on partition topics (``reader.topic=partition``, what ``auto`` picks on Apache Pulsar).

A plan with ``maxRecordsPerTrigger`` must end on the n-th message after its start, a real message id, and
Pulsar cannot count messages between two ids without reading them. The topic-wide id index
(:mod:`cdc.backends.pulsar.index`) reads every id from the topic's first retained message up to the head
before the first plan: after a driver restart over a large backlog, the first batch waited for the whole
backlog to be read on the driver whatever the budget (13-48 s measured).

Here each partition gets a Reader on its own topic opened at the plan's start, and a plan reads only the
ids it needs: at most the budget, never past the head the broker names (``getLastMessageId``, so no wait
for silence at the head). The Reader is kept for the next round, which starts where this plan ended, so
each message id is read once on the driver, as with the index.

``maxBytesPerTrigger`` is a record budget too, through the payload bytes per message of what these readers
read (:meth:`PartitionBudget.average_bytes`). Before the first plan of a query they have read nothing, so
the first estimate reads a small sample at each partition's start (:meth:`PartitionBudget.sample`) instead
of the index's every id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.backends.pulsar.connection import Channel
from cdc.backends.pulsar.options import PulsarOptions
from cdc.backends.pulsar.positions import NONE, Key
from cdc.backends.pulsar.reader import _open_reader

log = logging.getLogger(__name__)


@dataclass
class _Cursor:
    reader: Any
    last: Key  # the id of the last message this reader delivered (or its start)


class PartitionBudget:
    """Counts a budget of messages after a position on each partition topic, with one kept Reader each."""

    def __init__(self, client: Callable[[], Any], options: PulsarOptions) -> None:
        self._client = client  # the backend's client, opened on first use
        # Readers open on partition topics whatever reader.topic says: this class serves partition mode only.
        self._options = options.model_copy(update={"reader_topic": "partition"})
        self._cursors: dict[str, _Cursor] = {}
        self.delivered = 0  # messages received on the driver (what a budget costs there)
        self.payload_bytes = 0  # their payloads' bytes: maxBytesPerTrigger's estimate of a record's size

    def end_after(self, ch: Channel, start: Key, want: int, head: Key) -> tuple[Key, int]:
        """The id of the ``want``-th message after ``start`` (at most ``head``, the partition's last message
        or the plan's bound) and how many messages lie in ``(start, end]``. A partition that stays silent
        short of ``head`` for ``catchUpMs`` x 10 ends the plan with what was read (the next round goes on)."""
        import pulsar

        if want <= 0 or head <= start:
            return start, 0
        cursor = self._cursors.get(ch.id)
        if cursor is None or cursor.last != start:
            # A replay, a new query or a plan that did not take what was counted: start over at ``start``.
            self._close(ch.id)
            reader, _ = _open_reader(self._client(), self._options, ch, start)
            cursor = self._cursors[ch.id] = _Cursor(reader, start)
        raw = getattr(cursor.reader, "_reader", cursor.reader)  # the C++ reader: no Python wrapper per message
        patience_s = self._options.catch_up_ms * 10 / 1000
        last, n = start, 0
        silent_since: float | None = None
        while n < want and last < head:
            try:
                msg = raw.read_next(50)
            except pulsar.Timeout:
                now = time.monotonic()
                silent_since = silent_since or now
                if now - silent_since >= patience_s:
                    log.info("channel %s silent at %s short of %s; planning %d messages", ch.id, list(last), list(head), n)
                    break
                continue
            silent_since = None
            self.delivered += 1
            self.payload_bytes += msg.length()
            mid = msg.message_id()
            k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            if k <= last:
                continue  # the start entry read inclusively, or a redelivery
            if k > head:
                # Past the bound: this message belongs to a later plan, which must open a new reader.
                cursor.last = (-2, -2, -2)
                return last, n
            last = k
            n += 1
        cursor.last = last
        return last, n

    def average_bytes(self) -> float:
        """Payload bytes per message over every message these readers and samples received (``0.0``: none
        yet). Metadata and the decoded columns are not counted, as in the id index's estimate."""
        return self.payload_bytes / self.delivered if self.delivered else 0.0

    def sample(self, ch: Channel, head: Key, count: int) -> None:
        """Read up to ``count`` messages from the start of ``ch`` (never past ``head``, its last message) into
        :meth:`average_bytes`, on a Reader of their own: the plans' readers open where the query stands."""
        import pulsar

        reader, _ = _open_reader(self._client(), self._options, ch, NONE)
        try:
            raw = getattr(reader, "_reader", reader)
            for _ in range(count):
                try:
                    msg = raw.read_next(self._options.catch_up_ms * 10)
                except pulsar.Timeout:
                    break  # silent short of the head (trimmed by retention meanwhile): what was read will do
                self.delivered += 1
                self.payload_bytes += msg.length()
                mid = msg.message_id()
                if (mid.ledger_id(), mid.entry_id(), mid.batch_index()) >= head:
                    break
        finally:
            reader.close()

    def _close(self, channel: str) -> None:
        cursor = self._cursors.pop(channel, None)
        if cursor is not None:
            try:
                cursor.reader.close()
            except Exception:  # noqa: BLE001 - closing a dead reader is not worth an error
                log.debug("closing the budget reader of %s failed", channel, exc_info=True)

    def close(self) -> None:
        for channel in list(self._cursors):
            self._close(channel)
