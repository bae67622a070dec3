"""``backend=pulsar``: channels are topic partitions, positions are message ids.

The read path
-------------
Batch ends must be real message ids fixed before any executor reads (a replay then reads the same
messages). How the driver finds them depends on ``reader.topic``; ``auto`` (the default) picks ``partition``
when the broker serves each partition as a topic of its own (Apache Pulsar: a partition's partition metadata
names the partition itself), detected once per query at its first partitioned topic, else ``parent``.

*``partition`` (Apache Pulsar).* Without a record budget a batch ends at each partition's last message id,
asked of the broker (:mod:`cdc.backends.pulsar.heads`: the admin API's ``lastMessageId`` when ``admin.url``
is given, else the consumer of the query's durable subscription on that partition, kept by the driver).
When the answer has no batch index, the driver reads that one entry to find its last message. No message
is read to plan; ``records`` is then a lower bound (the contract allows it without a budget). With a record budget the driver reads only the ids the
budget needs, from the plan's start up to that head, on one kept Reader per partition topic
(:mod:`cdc.backends.pulsar.budget`), so a first batch after a restart costs its budget, not the backlog;
``maxBytesPerTrigger`` is such a budget too, its record size estimated from what those Readers read.
Executors open one Reader per partition topic.

*``parent`` (pulsar-lite's auto-created partitioned topics), and Debezium truncate checks.* Pulsar cannot count the messages between two
ids without reading them, so the driver keeps a tailing Reader per topic that records every message id
(:class:`~cdc.backends.pulsar.index.TopicIndex`; ids only, trimmed once planned). Each planning round reads
the new ids up to the head and stops as soon as the broker confirms there is nothing more
(``has_message_available``). Executors open the Reader on the partitioned topic with a partition-scoped
start id and drop other partitions' messages (see :mod:`cdc.backends.pulsar.index`).

*Reading (executors)* is :mod:`cdc.backends.pulsar.reader`; acknowledgement,
:mod:`cdc.backends.pulsar.acknowledge`; writes, :mod:`cdc.backends.pulsar.writer`.

Cost (``benchmarks/pulsar_source.py``, 1M messages, 2 partitions): with ``partition`` planning takes 0.04 s
and the two partitions are read in parallel, one Spark task each; the source reaches about 0.55 of two plain
Reader processes (README, Performance: the executors' readers wait for messages, not for decoding); with
``parent`` about half of that again (the driver's id pass alone costs about the reference's whole read, and
executors receive other partitions' messages).
"""

from __future__ import annotations

import bisect
import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc.backend import Backend, ChannelHead, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.backends.pulsar.acknowledge import Subscription
from cdc.backends.pulsar.admin import match_topics, registry_schema
from cdc.backends.pulsar.budget import PartitionBudget
from cdc.backends.pulsar.connection import Channel, admin_client, connect, partitions_of
from cdc.backends.pulsar.errors import HeadUnavailableError, SchemaMismatchError
from cdc.backends.pulsar.heads import PartitionHeads, first_published_at
from cdc.backends.pulsar.index import TopicIndex
from cdc.backends.pulsar.ledgers import Ledgers
from cdc.backends.pulsar.options import PulsarOptions
from cdc.backends.pulsar.positions import START, Key, before, count_between, to_key
from cdc.backends.pulsar.reader import PulsarRangeReader
from cdc.backends.pulsar.records import Decoder
from cdc.backends.pulsar.transactions import IndexedMessages, TransactionLog, transaction_cut
from cdc.errors import CdcError, OptionError, requires_extra
from cdc.formats.debezium import (
    record_schema_of_avro,
    registry_envelope_avro,
    schema_from_first_message,
)
from cdc.options import BackendOptions

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

SIZE_SAMPLE = 100
"""Messages per partition that maxBytesPerTrigger's first estimate reads when plans end at the broker's heads."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PulsarBackend(Backend):
    """Topic partitions of one Pulsar cluster as channels."""

    name = "pulsar"
    options_model = PulsarOptions
    options: PulsarOptions

    def __init__(self, options: PulsarOptions) -> None:
        with requires_extra("pulsar", "backend 'pulsar'"):
            import fastavro  # noqa: F401 - the decoders' (imported where used; checked here, on first use)
            import pulsar  # noqa: F401 - imported where used, by the driver and executors alike
        super().__init__(options)
        self._admin = admin_client(options, options.admin_url) if options.admin_url else None
        self._client: Any = None
        # Topics whose registry schema was checked against the query's; None: the schema is an option.
        self._registry_checked: set[str] | None = None
        if options.value_format in ("json", "avro") and not options.value_schema:
            # Read once per query from the schema registry; executors get it inside the options. Topics
            # that topicsPattern discovers later are checked against it (see _check_registry).
            assert self._admin is not None  # the options model requires admin.url here
            topics = self.topics()
            text = registry_schema(self._admin, topics, options.value_format)
            options = self.options = options.model_copy(update={"value_schema": text})
            self._registry_checked = set(topics)
        if options.value_format == "debezium":
            options = self.options = self._debezium_schemas(options)
        self._decoder = Decoder(options.value_format, options.value_schema, options.change_keys)
        self._indexes: dict[str, TopicIndex] = {}
        self._channels: dict[str, Channel] = {}
        self._subscription = Subscription(lambda: self.client, options.subscription())
        # Partition mode: the broker serves each partition as a topic, so the driver asks it for each
        # partition's last message id (getLastMessageId) instead of reading every id. None (reader.topic=auto)
        # until a partitioned topic shows whether the broker does; non-partitioned topics read the same
        # either way, and take their heads from the broker meanwhile.
        self._probe: bool | None = {"partition": True, "parent": False}.get(options.reader_topic)
        self._subscription.per_partition = self._probe is not False
        self._heads = PartitionHeads(lambda: self.client, self._admin, options, self._subscription)
        self._budget = PartitionBudget(lambda: self.client, options)
        self._stale: set[str] = set()  # topics whose index has not caught up this round
        self._partitions: dict[str, list[Channel]] = {}
        self._ledger_lists: dict[str, Ledgers] = {}  # per channel, for minPartitions (see _ledgers)
        self._verified: set[str] = set()  # topics whose partitions were checked to be served as topics
        # debezium.transactionTopic: the END events, and this round's window of transaction orders that the
        # cut may take (None: not opened yet this round). See cdc.backends.pulsar.transactions.
        self._transactions: TransactionLog | None = None
        self._window: tuple[float, float] | None = None
        if options.debezium_transaction_topic is not None and options.envelope_avro is not None:
            raise OptionError(
                "option 'debezium.transactionTopic' reads the transaction blocks of JSON envelopes; the schema "
                "registry says these are Avro: accepted with JSON converters only",
                "debezium.transactionTopic",
            )

    def _debezium_schemas(self, options: PulsarOptions) -> PulsarOptions:
        """Avro envelopes (the schema registry says so, when admin.url is given), and the row schema from the
        registry's envelope or the first JSON envelope when valueSchema is not given."""
        avro = registry_envelope_avro(self._admin, self.topics()) if self._admin is not None else None
        if avro is not None and not options.value_schema:
            text = record_schema_of_avro(json.loads(avro))
            log.info("valueSchema read from the registry's Debezium Avro envelope: %s", text)
            options = options.model_copy(update={"value_schema": text})
        elif not options.value_schema:
            text = schema_from_first_message(self.client, self.topics(), options.catch_up_ms * 10)
            log.info("valueSchema read from the first Debezium envelope: %s", text)
            options = options.model_copy(update={"value_schema": text})
            options._schema_from_events = True
        options._envelope_avro = avro
        return options

    def __repr__(self) -> str:
        return f"PulsarBackend({self.options.service_url!r}, topics={self._topics_hint()})"

    def _topics_hint(self) -> str:
        return self.options.topics_pattern or ",".join(self.options.topic_list())

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.options)
        return self._client

    def schema(self) -> pa.Schema:
        return self._decoder.schema()

    def topics(self) -> list[str]:
        if self.options.topics_pattern:
            assert self._admin is not None
            return match_topics(self._admin, self.options.topics_pattern)
        return self.options.topic_list()

    def _index(self, topic: str) -> TopicIndex:
        """The topic's id index, caught up to the head once per planning round (at its first use)."""
        index = self._indexes.get(topic)
        if index is None:
            index = self._indexes[topic] = TopicIndex(
                self.client,
                topic,
                receiver_queue_size=self.options.receiver_queue_size,
                catch_up_ms=self.options.catch_up_ms,
                find_truncates=self._applies_truncates,
                mark=(lambda data: self._saw(topic, data)) if self._keeps_transactions else None,
            )
            self._stale.add(topic)
        if topic in self._stale:
            chans = self._partitions.get(topic) or partitions_of(self.client, topic, self.options)
            index.partitions = [ch.partition for ch in chans]
            index.catch_up()
            self._stale.discard(topic)
        return index

    def _check_registry(self, topic: str) -> None:
        """A topic discovered after the query started must have the registry schema the query decodes with:
        its messages would otherwise be decoded with another topic's schema (quarantined, or failing the
        query, message by message). It fails the batch's planning instead, naming the topic."""
        if self._registry_checked is None or topic in self._registry_checked:
            return
        assert self._admin is not None and self.options.value_schema is not None
        try:
            text = registry_schema(self._admin, [topic], self.options.value_format)
        except OptionError as exc:
            raise SchemaMismatchError(f"topic {topic}, discovered through topicsPattern: {exc}") from None
        if text != json.dumps(json.loads(self.options.value_schema), sort_keys=True):
            raise SchemaMismatchError(
                f"topic {topic}, discovered through topicsPattern, has another {self.options.value_format} schema in "
                f"the schema registry than the query's topics ({', '.join(sorted(self._registry_checked))}); a query "
                "decodes every topic with one schema: narrow topicsPattern, or start a query for that topic"
            )
        self._registry_checked.add(topic)

    def list_channels(self) -> Sequence[ChannelInfo]:
        """Every partition of every topic. Starts a planning round (the planner calls this first): the id
        indexes catch up to the head at their first use in the round (at once unless reader.topic=partition,
        where an index is needed only for a record budget) and partition heads are asked again."""
        out = []
        topics = self.topics()
        for topic in topics:
            self._check_registry(topic)
            chans = self._partitions[topic] = partitions_of(self.client, topic, self.options)
            if self._probe is None and chans and chans[0].partition >= 0:
                self._probe = self._serves_partition_topics(chans[0])
                self._subscription.per_partition = self._probe
                log.info(
                    "reader.topic=auto: %s (%s)", "partition" if self._probe else "parent",
                    "the broker serves partitions as topics" if self._probe
                    else "the broker does not serve partitions as topics (pulsar-lite)",
                )
            elif self._probe and self.options.reader_topic == "partition" and topic not in self._verified:
                self._check_partition_topics(chans)
                self._verified.add(topic)
            for ch in chans:
                self._channels[ch.id] = ch
                out.append(ChannelInfo(ch.id))
        self._stale.update(topics)
        self._heads.clear()
        if self._keeps_transactions:
            # Before the data topics: every data event of a transaction whose END is read now is then
            # indexed in this round (Debezium publishes a transaction's events before its END).
            self._transaction_log().catch_up(self._transaction_partitions())
            self._window = None
        if self._probe is False:
            for topic in topics:
                self._index(topic)
        return out

    @property
    def partition_mode(self) -> bool:
        """Whether partitions are read as topics with heads from the broker (``reader.topic`` resolved)."""
        if self._probe is None and not self._partitions:
            self.list_channels()  # a replayed batch may be read before any planning round
        return self._probe is not False

    def _serves_partition_topics(self, ch: Channel) -> bool:
        """Whether the broker serves partition ``ch`` as a topic of its own: Apache Pulsar answers its partition
        metadata with the partition itself; pulsar-lite, when it auto-creates partitioned topics, makes a new
        partitioned topic of that name."""
        return list(self.client.get_topic_partitions(ch.id)) == [ch.id]

    def _check_partition_topics(self, chans: Sequence[Channel]) -> None:
        """reader.topic=partition needs a broker that serves a partition as a topic of its own (Apache Pulsar
        does; pulsar-lite only when it auto-creates non-partitioned topics, else it makes a new partitioned
        topic of that name): fail clearly instead of reading an empty look-alike."""
        if not chans or chans[0].partition < 0:
            return
        if not self._serves_partition_topics(chans[0]):
            names = self.client.get_topic_partitions(chans[0].id)
            raise OptionError(
                f"option 'reader.topic': 'partition' needs a broker that serves each partition as a topic, but it "
                f"answers {chans[0].id} as a partitioned topic of its own ({len(names)} partitions; pulsar-lite "
                "does that when it auto-creates partitioned topics); accepted values: auto, parent, partition",
                "reader.topic",
            )

    def _channel(self, channel: str) -> Channel:
        return self._channels.get(channel) or Channel.parse(channel)

    def earliest(self, channel: str) -> Position:
        ch = self._channel(channel)
        if self._probe is not False and ch.topic not in self._indexes:
            return START  # an executor's Reader from the earliest message the broker holds
        first = self._index(ch.topic).first(ch.partition)
        return START if first is None else before(first)

    def latest(self, channel: str) -> Position:
        ch = self._channel(channel)
        try:
            head = self._heads.of(ch) if self._probe is not False else None
        except HeadUnavailableError:
            head = None  # where the query starts is worth reading the ids for
        if head is not None:
            return list(head)
        return list(self._index(ch.topic).ids(ch.partition).last)

    def parse_position(self, channel: str, value: Any) -> Position:
        return list(to_key(value, channel))

    def position_at(self, channel: str, when: datetime) -> Position:
        """Before the partition's first message published at or after ``when`` (see
        :func:`~cdc.backends.pulsar.heads.first_published_at`), else the head. The head is taken first: a
        message published meanwhile then lies after it, not skipped."""
        ch = self._channel(channel)
        head = self.latest(channel)
        # Publish times are whole milliseconds: a time inside one starts at the next.
        when_ms = -((_EPOCH - when) // timedelta(milliseconds=1))
        first = first_published_at(self.client, self.options, ch, when_ms, parent=not self.partition_mode)
        return head if first is None else before(first)

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        ch = self._channel(channel)
        s = to_key(start, channel)
        u = None if until is None else to_key(until, channel)
        apply_truncates, transactions = self._applies_truncates, self._keeps_transactions
        if self._plans_from_heads:
            try:
                head = self._heads.of(ch)
            except HeadUnavailableError:
                return PlannedRange(list(start), 0)  # nothing this round; the next asks again
            if head is not None:
                last = head if u is None else min(head, u)
                if max_records is None:
                    # Without a record budget nothing needs counting: the range ends at the partition's last
                    # message (or the bound). ``records`` is then a lower bound (the contract allows it).
                    return PlannedRange(list(last), 1) if last > s else PlannedRange(list(start), 0)
                # A budget reads only the ids it needs, from the start (see cdc.backends.pulsar.budget).
                counted, n = self._budget.end_after(ch, s, max_records, last)
                return PlannedRange(list(counted), n) if n else PlannedRange(list(start), 0)
        index = self._index(ch.topic)
        if not index.covers(ch.partition, s):
            log.info("re-reading the ids of %s: planning from %s, before what the index still holds", ch.topic, s)
            if self._transactions is not None:
                self._transactions.forget(ch.topic)
            index.close()
            del self._indexes[ch.topic]
            index = self._index(ch.topic)
        keys = index.ids(ch.partition).keys
        ids = index.ids(ch.partition)
        i, j = count_between(keys, s, u, max_records)
        # what the range may not pass; a transaction may extend it up to there past the budget
        limit = count_between(keys, s, u, None)[1] if transactions and max_records is not None else j
        bound = limit
        if apply_truncates and limit > i:
            # A batch ends right before a truncate: it may only start one (the sink empties the table first).
            t = bisect.bisect_right(ids.truncates, keys[i])
            if t < len(ids.truncates) and ids.truncates[t] <= keys[limit - 1]:
                limit = bisect.bisect_left(keys, ids.truncates[t])
                j = min(j, limit)
        if transactions:
            cut, window = self._transaction_end(ch, i, j, limit)
            if cut == i and limit < bound:
                # The truncate lies inside the transaction the range starts with: ending before it would plan
                # nothing, forever. The transaction stays whole (the sink applies a truncate amid a batch's
                # changes, in _seq order).
                cut, window = self._transaction_end(ch, i, j, bound)
            j, self._window = cut, window
        end = list(keys[j - 1]) if j > i else list(start)
        index.trim(ch.partition, s)
        return PlannedRange(end, j - i)

    # ------------------------------------------------------------------ split reads (minPartitions)
    @classmethod
    def split_refusal(cls, options: BackendOptions) -> str | None:
        assert isinstance(options, PulsarOptions)
        if options.admin_url is None:
            return (
                "a partition's range is cut before ledger entries that the admin API lists (internal stats), "
                "and option 'admin.url' is not given"
            )
        return None

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        """Positions before whole entries of the range, from the partition's ledgers (see
        :mod:`cdc.backends.pulsar.ledgers`)."""
        s, e = to_key(start, channel), to_key(end, channel)
        return self._ledgers(channel, e).cut_points(s, e, parts)

    def range_size(self, channel: str, start: Position, end: Position) -> int | None:
        """Entries of the range (its ends' own entries counted once each)."""
        s, e = to_key(start, channel), to_key(end, channel)
        return self._ledgers(channel, e).count(s, e) + 1

    def _ledgers(self, channel: str, end: Key) -> Ledgers:
        """The partition's ledgers, asked again unless the last answer already lists the end's ledger: every
        ledger before the last one listed was closed then, and a closed ledger's entries never change."""
        known = self._ledger_lists.get(channel)
        if known is None or known.last < end[0]:
            assert self._admin is not None  # split_refusal: minPartitions needs admin.url
            known = self._ledger_lists[channel] = Ledgers.from_stats(self._admin.internal_stats(channel))
        return known

    # ------------------------------------------------------------------ transaction metadata
    def _transaction_log(self) -> TransactionLog:
        if self._transactions is None:
            assert self.options.debezium_transaction_topic is not None
            self._transactions = TransactionLog(
                self.client,
                self.options.debezium_transaction_topic,
                receiver_queue_size=self.options.receiver_queue_size,
                catch_up_ms=self.options.catch_up_ms,
            )
        return self._transactions

    def _transaction_partitions(self) -> list[int]:
        """The transaction topic's partitions: one, since the order of its END events is the commit order."""
        topic = self.options.debezium_transaction_topic
        assert topic is not None
        chans = partitions_of(self.client, topic, self.options)
        if len(chans) > 1:
            raise OptionError(
                f"option 'debezium.transactionTopic': {topic} has {len(chans)} partitions, so its END events have "
                "no one order (their order is the commit order batches follow); accepted values: a topic with one "
                "partition, as Debezium writes it",
                "debezium.transactionTopic",
            )
        return [ch.partition for ch in chans]

    def _saw(self, topic: str, data: bytes) -> str | None:
        return self._transaction_log().saw(topic, data)

    def _transaction_end(self, ch: Channel, i: int, j: int, limit: int) -> tuple[int, tuple[float, float]]:
        """Where a channel's range from index ``i`` ends at a transaction boundary consistent with the round's
        other channels, and the round's window after it (see :mod:`cdc.backends.pulsar.transactions`)."""
        log_ = self._transaction_log()
        if self._window is None:
            for topic in list(self._partitions) or [ch.topic]:
                self._index(topic)  # every data topic caught up before the frontier is taken
            self._window = (-1.0, float(log_.advance()))
        return transaction_cut(IndexedMessages(self._index(ch.topic).ids(ch.partition), log_.order), i, j, limit,
                               self._window)

    def reader(self) -> RangeReader:
        mode = "partition" if self.partition_mode else "parent"
        return PulsarRangeReader(self.options.model_copy(update={"reader_topic": mode}))

    @property
    def _applies_truncates(self) -> bool:
        """Batches end before Debezium truncates (``debezium.truncate=apply``): planning checks every message."""
        return self.options.debezium_truncate == "apply" and self.options.value_format == "debezium"

    @property
    def _keeps_transactions(self) -> bool:
        """Batches end between source transactions (``debezium.transactionTopic``)."""
        return self.options.debezium_transaction_topic is not None

    @property
    def _plans_from_heads(self) -> bool:
        """Whether plans end at the heads the broker names (budgets counted by :class:`PartitionBudget`)
        rather than on the id index: partition mode, unless a Debezium truncate or transaction check needs
        every id."""
        return self._probe is not False and not self._applies_truncates and not self._keeps_transactions

    def average_record_bytes(self) -> float | None:
        """Payload bytes per message (metadata and the decoded columns are not counted) over the messages
        the driver read to plan. When plans end at the broker's heads, those are the messages the record
        budgets read, and before any was read a sample of :data:`SIZE_SAMPLE` messages at each partition's
        start: a first batch after a restart then costs its budget, not the backlog. Otherwise every
        message the id index read (it reads each message's size along with its id); a topic without an
        index yet gets one first, and existing ones are not caught up again here: the planning round that
        follows does that, and an estimate may lag it."""
        if not self._partitions:
            self.list_channels()
        if self._plans_from_heads:
            if not self._budget.delivered:
                for ch in (ch for chans in self._partitions.values() for ch in chans):
                    try:
                        head = self._heads.of(ch)
                    except HeadUnavailableError:
                        continue  # this partition is left out of the first estimate
                    if head is not None:
                        self._budget.sample(ch, head, SIZE_SAMPLE)
            return self._budget.average_bytes()
        for topic in self._partitions:
            if topic not in self._indexes:
                self._index(topic)
        count = sum(index.indexed for index in self._indexes.values())
        return sum(index.indexed_bytes for index in self._indexes.values()) / count if count else 0.0

    # ------------------------------------------------------------------ acknowledgement
    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        """Advance the query's durable subscription (``subscription.name``) to the committed positions
        (see :mod:`cdc.backends.pulsar.acknowledge`)."""
        if not self.options.acknowledge:
            return
        self._subscription.advance({self._channel(c): to_key(p, c) for c, p in positions.items()})
        log.debug("acknowledged %s on subscription %s", dict(positions), self._subscription.name)

    def backlog(self) -> dict[str, int]:
        """The durable subscription's (``subscription.name``) backlog per channel: messages not acknowledged
        yet, from the admin API's partitioned stats (``msgBacklog``). Needs ``admin.url``. Acknowledgement
        follows Spark's commits (an entry is acknowledged whole), so this is an upper bound of what the
        query has left to commit. Channels the subscription does not exist on yet (before the first
        commit) are left out."""
        if self._admin is None:
            raise OptionError("the subscription backlog is read through the admin API: give option 'admin.url'", "admin.url")
        out: dict[str, int] = {}
        for topic in self.topics():
            out.update(self._admin.backlog(topic, self._subscription.name))
        return out

    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        """The heads, and with ``admin.url`` the durable subscription's backlog per channel (``backlog``).
        Reading partitions as topics, planning counts lazily (a lower bound, contract rule 2): records behind
        are then left unknown rather than understated, and the backlog is the count to watch."""
        out = super().heads(positions)
        if self.partition_mode:
            out = {cid: replace(h, behind=None) for cid, h in out.items()}
        if self._admin is None:
            return out
        try:
            backlog = self.backlog()
        except CdcError as exc:  # lag is a report: a failed admin call never fails the caller
            log.warning("reading the subscription backlog failed: %s", exc)
            return out
        return {
            cid: replace(h, measures={**h.measures, "backlog": float(backlog[cid])}) if cid in backlog else h
            for cid, h in out.items()
        }

    # ------------------------------------------------------------------ writes
    @classmethod
    def register_spark(cls, spark: Any) -> None:
        """``cdc-pulsar``, the sink-only format name, where pulsar-client is installed (asked without loading
        its C++ core, which is slow to load and not needed by reads of other backends)."""
        if importlib.util.find_spec("pulsar") is not None:
            from cdc.backends.pulsar.writer import register

            register(spark)

    @classmethod
    def writer(cls, options: Mapping[str, Any], schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Batch writes (``df.write.format("cdc").option("backend", "pulsar")``): see
        :mod:`cdc.backends.pulsar.writer`."""
        from cdc.backends.pulsar.writer import PulsarWriter

        if overwrite:
            raise OptionError("the Pulsar sink only appends; use mode('append')", "mode")
        return PulsarWriter(options, schema)

    @classmethod
    def stream_writer(cls, options: Mapping[str, Any], schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Streaming writes: each micro-batch's rows are sent, at least once."""
        from cdc.backends.pulsar.writer import PulsarStreamWriter

        return PulsarStreamWriter(options, schema)

    def close(self) -> None:
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()
        if self._transactions is not None:
            self._transactions.close()
            self._transactions = None
        self._budget.close()
        self._subscription.close()
        if self._client is not None:
            self._client.close()
            self._client = None


def drop_subscription(options: PulsarOptions) -> list[str]:
    """Remove the query's durable subscription from every topic it reads; returns the topics."""
    backend = PulsarBackend(options)
    try:
        done = []
        for topic in backend.topics():
            # One consumer per partition, never one on the partitioned topic: the C++ client's multi-topic
            # consumer crashed the process (SIGSEGV in Consumer.unsubscribe) when unsubscribed right after it
            # subscribed, before all its partitions had connected.
            for channel in partitions_of(backend.client, topic, options):
                consumer = backend.client.subscribe(channel.id, options.subscription(), receiver_queue_size=1)
                consumer.unsubscribe()
            done.append(topic)
        return done
    finally:
        backend.close()
