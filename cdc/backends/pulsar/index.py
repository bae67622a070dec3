"""The driver's message-id index: every message id of a topic, per partition, read by tailing Readers.

Why the driver reads message ids
--------------------------------
Pulsar cannot count the messages between two ids without reading them (an entry may hold a batch of
any size, and ledgers roll). The driver therefore keeps one tailing Reader per topic that records the id
of every message (ids only, trimmed as batches are planned; after a stall, one Reader per partition).
Planning is then exact: ``plan(max_records=n)`` ends on the n-th message id, so admission control holds, and the id that ends a
batch is a real message id stored in Spark's offset log, so a replay reads exactly the same messages.
The cost is one extra read of each message on the driver.

pulsar-lite (the broker that runs in tests and demos)
-----------------------------------------------------
When it auto-creates partitioned topics (``default_partitions > 0``) it cannot serve a Reader on one
``<topic>-partition-N`` (it auto-creates a new partitioned topic of that name), so with
``reader.topic=parent`` readers open on the partitioned parent topic. (With ``default_partitions = 0`` it
serves partitions as topics, like Apache Pulsar: see ``reader.topic=partition`` in
:mod:`cdc.backends.pulsar.backend`.) Such a Reader applies its start id to every
partition by (ledger, entry); each pulsar-lite partition has its own ledger, so a read of partition p
also receives the partitions whose ledger id is higher than p's, and drops them: read amplification
up to the number of partitions (``reader.topic=partition`` avoids it on real Pulsar). Its dispatcher also
redelivers (ids go backwards: dropped by id) and sometimes stalls a reader for good: silent readers are
replaced by new ones (never ``seek``; the index resumes each partition with its own Reader), see
:meth:`TopicIndex.catch_up` and the executor's read loop (:mod:`cdc.backends.pulsar.reader`).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.backends.pulsar.positions import NONE, Key
from cdc.formats.debezium import is_truncate

if TYPE_CHECKING:
    import pulsar

log = logging.getLogger(__name__)


@dataclass
class PartitionIds:
    keys: list[Key] = field(default_factory=list)
    last: Key = (-1, -1, -1)
    truncates: list[Key] = field(default_factory=list)  # Debezium truncates (with find_truncates only)
    marks: list[Any] = field(default_factory=list)  # what ``mark`` said of each message of keys (with mark only)
    marked: list[Key] = field(default_factory=list)  # the keys whose mark is not None


class TopicIndex:
    """The ids of a topic's messages, per partition, read by tailing Readers on the driver.

    Keeps every id from the topic's start, minus ids below a partition's
    trim point. Duplicates and backwards ids (the broker may redeliver) are dropped.
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        *,
        receiver_queue_size: int,
        catch_up_ms: int,
        max_catch_up_s: float = 60.0,
        idle_reopen_s: float = 10.0,
        find_truncates: bool = False,
        mark: Callable[[bytes], Any] | None = None,
    ) -> None:
        self.client = client
        # debezium.truncate=apply: the planner ends a batch right before a truncate, so the index notes them.
        self.find_truncates = find_truncates
        # debezium.transactionTopic: each message's transaction (data topics), or its END event (that topic).
        self.mark = mark
        self.topic = topic
        self.receiver_queue_size = receiver_queue_size
        self.catch_up_ms = catch_up_ms
        self.max_catch_up_s = max_catch_up_s
        self.idle_reopen_s = idle_reopen_s
        self._progress_at = time.monotonic()
        self.parts: dict[int, PartitionIds] = {}
        self.floor: dict[int, Key] = {}  # ids at or below the floor were trimmed (nothing before is known)
        self._readers: list[Any] = []  # one from earliest; after a stall, one per partition (see _reopen)
        self._scoped = False
        self._confirmed = False  # the last round ended at a head the broker confirmed
        self._lock = threading.Lock()
        self.partitions: list[int] = []  # set by the backend from the topic's metadata
        self.indexed = 0  # messages indexed so far and the bytes of their payloads (maxBytesPerTrigger)
        self.indexed_bytes = 0

    def _open(self) -> list[Any]:
        import pulsar

        if not self._readers:
            self._readers = [
                self.client.create_reader(
                    self.topic, pulsar.MessageId.earliest, receiver_queue_size=self.receiver_queue_size
                )
            ]
            self._scoped = False
        return self._readers

    def _reopen(self) -> list[Any]:
        """New readers after a stall: one per partition, each resuming at that partition's last id.

        pulsar-lite serves a Reader started at one partition's message id that partition only (a single
        Reader resumed at the smallest id left the other partitions stalled for good), while Pulsar also
        serves the partitions whose ledgers come later (their messages are dropped by id). Each reader
        starts inclusively at the start of the last indexed entry, so nothing after the last id is
        skipped; while a partition holds no id yet, one more reader reads from earliest.
        """
        import pulsar

        self._close_readers()
        readers = []
        held = [p for p in self.partitions or sorted(self.parts) if self.ids(p).last != NONE]
        for p in held:
            ledger, entry, _ = self.parts[p].last
            readers.append(
                self.client.create_reader(
                    self.topic,
                    pulsar.MessageId(p, ledger, entry, -1),
                    receiver_queue_size=self.receiver_queue_size,
                    start_message_id_inclusive=True,
                )
            )
        if not held or len(held) < len(self.partitions):
            readers.append(
                self.client.create_reader(
                    self.topic, pulsar.MessageId.earliest, receiver_queue_size=self.receiver_queue_size
                )
            )
        self._readers = readers
        self._scoped = True
        return readers

    def _all_partitions_hold_ids(self) -> bool:
        return bool(self.partitions) and all(self.ids(p).last != NONE for p in self.partitions)

    def _broker_has_more(self, raw: Any) -> bool | None:
        """Whether the broker holds messages after the ones the reader delivered; ``None``: unknown.

        Asked only of the reader from earliest (pulsar-client answers a false "yes" at the head for a
        Reader started inclusively), and only when every partition holds a message: pulsar-lite fails
        ``getLastMessageId`` on an empty partition (and pulsar-client 3.13 aborts the process when two
        partitions fail at once).
        """
        if self._scoped or not self._all_partitions_hold_ids():
            return None
        try:
            return bool(raw.has_message_available())
        except Exception:  # noqa: BLE001 - the C++ core raises its own types
            log.debug("has_message_available failed on %s", self.topic, exc_info=True)
            return None

    def catch_up(self) -> None:
        """Read ids up to the broker's head as of now.

        The head is reached when the reader has nothing queued and the broker confirms it holds nothing
        after what was delivered (``has_message_available``, one request per partition): planning then
        waits no longer than one short poll. Where the broker does not confirm (a partition without
        messages yet, or readers resumed after a stall), ``catchUpMs`` of silence counts as the head.
        Messages published after this round began end it early (they belong to the next round). Readers
        whose last round was not confirmed and that brought nothing new for ``idle_reopen_s`` are
        replaced at the next round (they may be stalled).

        pulsar-lite's dispatcher can stall a reader (silent although the broker holds more, typically
        on one partition while the others flow): a silence right after new ids gets a longer wait
        (4 x ``catchUpMs``; 10 x for new readers that have delivered nothing yet) and then new readers,
        one per partition (see :meth:`_reopen`; at most 3 times per round). If all fail, the round plans with what it has (the
        next round goes on from there).
        """
        import pulsar

        with self._lock:
            now = time.monotonic()
            if self._readers and now - self._progress_at > self.idle_reopen_s and not self._confirmed:
                log.info("index readers of %s idle for %.0f s; opening new ones", self.topic, now - self._progress_at)
                self._reopen()
                self._progress_at = now
            # The C++ readers: no Python wrapper per message.
            raws = [getattr(r, "_reader", r) for r in self._open()]
            current = 0
            began_ms = int(time.time() * 1000)
            deadline = now + self.max_catch_up_s
            parts = self.parts
            n = nbytes = 0
            reopens = 0
            flowing = False  # new ids since the last (re)open
            delivered = 0  # messages (new or not) since the last (re)open
            poll_ms = min(self.catch_up_ms, 50)
            silent_since: float | None = None
            self._confirmed = False
            while True:
                try:
                    if len(raws) == 1:
                        msg = raws[0].read_next(poll_ms)
                    else:
                        msg = _next_of(raws, current, poll_ms)
                except pulsar.Timeout:
                    t = time.monotonic()
                    if t > deadline:
                        break
                    silent_since = silent_since or t - poll_ms / 1000
                    silent = t - silent_since
                    if len(raws) == 1 and self._broker_has_more(raws[0]) is False:
                        log.debug("index of %s at the head the broker confirms", self.topic)
                        self._confirmed = True
                        break
                    # Not confirmed. A silence right after new ids may be a stall: wait longer, then
                    # try new readers; otherwise silence counts as the head.
                    patience = self.catch_up_ms
                    if reopens and not delivered:
                        patience *= 10  # new readers that have not started delivering yet
                    elif flowing:
                        patience *= 4
                    if silent * 1000 < patience:
                        continue
                    if not (flowing or (reopens and not delivered)) or reopens >= 3:
                        log.debug("index of %s: %.2f s of silence taken as the head", self.topic, silent)
                        break
                    log.info("index reader of %s went silent after new messages; opening one per partition", self.topic)
                    raws = [getattr(r, "_reader", r) for r in self._reopen()]
                    reopens += 1
                    silent_since = None
                    flowing = False
                    delivered = 0
                    continue
                silent_since = None
                delivered += 1
                if isinstance(msg, tuple):
                    current, msg = msg
                mid = msg.message_id()
                k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                part = parts.get(mid.partition())
                if part is None:
                    part = parts[mid.partition()] = PartitionIds()
                if k > part.last:
                    part.keys.append(k)
                    part.last = k
                    if self.find_truncates or self.mark is not None:
                        data = msg.data()
                        if self.find_truncates and is_truncate(data):
                            part.truncates.append(k)
                        if self.mark is not None:
                            mark = self.mark(data)
                            part.marks.append(mark)
                            if mark is not None:
                                part.marked.append(k)
                    n += 1
                    nbytes += msg.length()
                    flowing = True
                    # Now and then: a message newer than this round ends it (the rest is the next round's).
                    if not n & 1023 and msg.publish_timestamp() > began_ms:
                        break
            if n:
                self._progress_at = time.monotonic()
                self.indexed += n
                self.indexed_bytes += nbytes
                log.debug("indexed %d new message ids of %s", n, self.topic)

    def ids(self, partition: int) -> PartitionIds:
        return self.parts.get(partition) or PartitionIds()

    def first(self, partition: int) -> Key | None:
        p = self.parts.get(partition)
        if p is None or not p.keys:
            return None
        if partition in self.floor:
            return None  # trimmed: the first id is no longer known
        return p.keys[0]

    def trim(self, partition: int, below: Key) -> None:
        """Forget ids ``<= below`` (already planned); keeps memory bounded on long-running queries."""
        p = self.parts.get(partition)
        if p is None:
            return
        del p.truncates[: bisect.bisect_right(p.truncates, below)]
        i = bisect.bisect_right(p.keys, below)
        if i > 4096:
            del p.keys[:i]
            del p.marks[:i]
            del p.marked[: bisect.bisect_right(p.marked, below)]
            self.floor[partition] = max(self.floor.get(partition, (-1, -1, -1)), below)

    def covers(self, partition: int, start: Key) -> bool:
        return start >= self.floor.get(partition, (-1, -1, -1))

    def _close_readers(self) -> None:
        for reader in self._readers:
            try:
                reader.close()
            except Exception:  # noqa: BLE001 - closing a dead reader is not worth an error
                log.debug("closing an index reader of %s failed", self.topic, exc_info=True)
        self._readers = []

    def close(self) -> None:
        self._close_readers()


def _next_of(raws: list[Any], current: int, poll_ms: int) -> tuple[int, Any]:
    """The next queued message of several readers, staying with ``current`` while it has some;
    (reader index, message). Waits ``poll_ms`` on one reader when none has a message queued."""
    import pulsar

    count = len(raws)
    for step in range(count):
        i = (current + step) % count
        try:
            return i, raws[i].read_next(0)
        except pulsar.Timeout:
            continue
    i = (current + 1) % count
    return i, raws[i].read_next(poll_ms)
