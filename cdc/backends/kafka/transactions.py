"""Debezium transaction metadata on Kafka (``debezium.transactionTopic``): batches never end inside a source
transaction. The design (complete transactions, the frontier, one cut per round over every partition, the
soft budget, bounds that move the end back) is the backends' shared one, :mod:`cdc.formats.transactions`;
here is what the driver reads to apply it.

* **The transaction topic** (``<topic.prefix>.transaction``) is read by the driver's consumer from its first
  offset up to its head at the start of every planning round, before the data partitions: its END events
  give the commit order. It must have one partition: Debezium keys its events by transaction id, so over
  several partitions the END events have no one order.
* **The offset index** (:class:`TransactionIndex`): for every partition of the query, the driver reads the
  data messages from where it stopped up to the head the round plans to (a consumer of its own, with the
  query's ``isolation.level``, ``read_committed`` by default, as the executors read) and keeps only each
  message's offset and transaction key (:class:`Entries`: two machine words a message, the keys interned).
  Offsets with no message the consumer sees (compacted records, aborted records, transaction markers) are
  gaps, never entries. Entries below a partition's planned start are dropped once there are many.
  The index starts at each partition's first offset (its log start) when the query starts: a transaction
  that began before the query's start offsets must be counted whole to be known complete.

The cost: every message of the query's partitions is read twice, once by the driver (its value parsed only
as far as its transaction block) and once by the executors.
"""

from __future__ import annotations

import logging
import sys
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc.backends.kafka.connection import Cluster, consumer
from cdc.backends.kafka.errors import FetchTimeoutError
from cdc.backends.kafka.options import KafkaOptions
from cdc.backends.kafka.positions import Partition
from cdc.backends.kafka.records import confluent_schema_id
from cdc.errors import BackendUnavailableError, OptionError
from cdc.formats.transactions import TransactionLog

log = logging.getLogger(__name__)

TRIM_AT = 4096
"""Entries below a partition's planned start are dropped once at least this many are."""
POLL_S = 0.5
BATCH = 8192


@dataclass
class Entries:
    """One partition's indexed data messages: their offsets (``keys``), each one's transaction key or ``None``
    (``marks``), the offsets of those inside a transaction (``marked``); what the shared cut reads
    (:class:`~cdc.formats.transactions.Indexed`). ``upto``: the next offset to read (every offset below it
    was read or is below ``floor``, the first offset the entries hold)."""

    upto: int
    floor: int
    keys: array[int] = field(default_factory=lambda: array("q"))
    marks: list[str | None] = field(default_factory=list)
    marked: array[int] = field(default_factory=lambda: array("q"))


class TransactionIndex:
    """The transaction log (:class:`~cdc.formats.transactions.TransactionLog`) fed from the transaction topic,
    and the offset index of the query's partitions."""

    def __init__(self, options: KafkaOptions, cluster: Cluster) -> None:
        assert options.debezium_transaction_topic is not None
        self.options, self.cluster = options, cluster
        self.topic = options.debezium_transaction_topic
        self.log = TransactionLog()
        self.parts: dict[Partition, Entries] = {}
        self._ends: dict[Partition, int] = {}  # the transaction topic's partitions: the next offset to read
        self._consumer: Any = None

    # ------------------------------------------------------------------ the transaction topic
    def catch_up_log(self) -> None:
        """Read the transaction topic's END events published so far (before the data partitions are read)."""
        meta = self.cluster.metadata(self.topic).topics.get(self.topic)
        if meta is None or meta.error is not None:
            if meta is not None and meta.error.code() == 3:  # UNKNOWN_TOPIC_OR_PART
                raise OptionError(f"option 'debezium.transactionTopic': topic {self.topic!r} does not exist on "
                                  f"{self.options.setting('bootstrap.servers')} (does the connector run with "
                                  "provide.transaction.metadata=true?)", "debezium.transactionTopic")
            raise BackendUnavailableError(f"the metadata of topic {self.topic!r}: {meta.error if meta else 'no answer'}")
        if len(meta.partitions) != 1:
            raise OptionError(
                f"option 'debezium.transactionTopic': {self.topic} has {len(meta.partitions)} partitions, so its END "
                "events have no one order (Debezium spreads them by transaction id; their order is the commit order "
                "batches follow); accepted values: a topic with one partition (create it so before the connector "
                "starts, or set topic.creation.default.partitions=1 for it)", "debezium.transactionTopic")
        parts = [Partition(self.topic, p) for p in meta.partitions]
        marks = self.cluster.watermarks(parts)
        targets = {p: (max(self._ends.get(p, low), low), head) for p, (low, head) in marks.items()}
        self._ends.update(self._read(targets, self._end))

    def _end(self, part: Partition, offset: int, value: bytes | None) -> None:
        if value and confluent_schema_id(value) is not None:
            raise OptionError(f"option 'debezium.transactionTopic': {part.id} offset {offset} is an Avro value; the "
                              "transaction metadata is read from JSON events (JSON converter)", "debezium.transactionTopic")
        if value:
            self.log.read_end(value)

    # ------------------------------------------------------------------ the data partitions
    def catch_up(self, heads: Mapping[Partition, tuple[int, int]]) -> None:
        """Index the data messages of these partitions up to their heads ((log start, head) each)."""
        targets = {}
        for part, (low, head) in heads.items():
            entries = self.parts.get(part)
            if entries is None:
                entries = self.parts[part] = Entries(low, low)
            elif entries.upto < low:
                log.warning("%s: offsets [%d, %d) were removed by retention before the driver indexed them; "
                            "their transactions are not counted", part.id, entries.upto, low)
                entries.upto = low
            targets[part] = (entries.upto, head)
        for part, upto in self._read(targets, self._data).items():
            self.parts[part].upto = max(self.parts[part].upto, upto)

    def _data(self, part: Partition, offset: int, value: bytes | None) -> None:
        entries = self.parts[part]
        if offset < entries.upto:
            return  # read before (a message delivered again)
        tx = None
        if value:
            if confluent_schema_id(value) is not None:
                raise OptionError(f"option 'debezium.transactionTopic': {part.id} offset {offset} is an Avro value; "
                                  "transaction blocks are read from JSON envelopes (JSON converter)",
                                  "debezium.transactionTopic")
            tx = self.log.saw(part.id, value)  # counted per partition: one is read again alone
        entries.keys.append(offset)
        if tx is not None:
            tx = sys.intern(tx)
            entries.marked.append(offset)
        entries.marks.append(tx)
        entries.upto = offset + 1

    def entries(self, part: Partition) -> Entries:
        return self.parts.get(part) or Entries(0, 0)

    def covers(self, part: Partition, start: int) -> bool:
        entries = self.parts.get(part)
        return entries is None or start >= entries.floor

    def forget(self, part: Partition) -> None:
        """Read a partition again from its start (a plan starts below what the index still holds)."""
        self.log.forget(part.id)
        self.parts.pop(part, None)

    def trim(self, part: Partition, below: int) -> None:
        """Drop the entries below ``below`` (planned) once there are many: memory stays bounded."""
        entries = self.parts.get(part)
        if entries is None:
            return
        i = bisect_left(entries.keys, below)
        if i >= TRIM_AT:
            del entries.keys[:i]
            del entries.marks[:i]
            del entries.marked[: bisect_right(entries.marked, below - 1)]
            entries.floor = max(entries.floor, below)

    # ------------------------------------------------------------------ reading
    def _read(self, targets: Mapping[Partition, tuple[int, int]],
              take: Callable[[Partition, int, bytes | None], None]) -> dict[Partition, int]:
        """Read each partition from its first offset up to its head; ``take`` each message. Returns the next
        offset to read per partition (the head, or past it when the consumer delivered more)."""
        from confluent_kafka import KafkaError, TopicPartition

        reached = {p: s for p, (s, _) in targets.items()}
        pending = {p: e for p, (s, e) in targets.items() if e > s}
        if not pending:
            return reached
        if self._consumer is None:
            self._consumer = consumer(self.options)
        c = self._consumer
        c.assign([TopicPartition(p.topic, p.partition, reached[p]) for p in pending])
        progress = time.monotonic()
        n = 0
        try:
            while pending:
                first = c.poll(POLL_S)
                messages = [] if first is None else [first, *c.consume(BATCH - 1, 0)]
                for m in messages:
                    part = Partition(m.topic(), m.partition())
                    error = m.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            reached[part] = max(reached[part], m.offset() or 0)
                        elif error.fatal() or not error.retriable():
                            raise BackendUnavailableError(f"the driver's transaction index reading {part.id}: "
                                                          f"{error.str()}")
                    else:
                        offset = m.offset()
                        take(part, offset, m.value())
                        reached[part] = max(reached[part], offset + 1)
                        n += 1
                    if part in pending and reached[part] >= pending[part]:
                        del pending[part]
                if messages:
                    progress = time.monotonic()
                elif (waited := time.monotonic() - progress) * 1000 >= self.options.poll_timeout_ms:
                    left = ", ".join(f"{p.id} [{reached[p]}, {e})" for p, e in sorted(pending.items()))
                    raise FetchTimeoutError(f"the driver's transaction index got nothing from the broker for "
                                            f"{waited:.0f} s while reading {left} (option kafkaConsumer.pollTimeoutMs)")
        finally:
            c.unassign()
        if n:
            log.debug("transaction index: read %d messages of %s", n, sorted(p.id for p in targets))
        return reached

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
