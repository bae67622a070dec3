"""``backend=pulsar``: channels are topic partitions, positions are message ids.

The read path
-------------
Batch ends must be real message ids fixed before any executor reads (a replay then reads the same
messages). How the driver finds them depends on ``reader.topic``:

*``partition`` (Apache Pulsar; pulsar-lite when it serves partitions as topics).* Without a record budget
a batch ends at each partition's last message id, asked of the broker (``getLastMessageId``: the admin
API's ``lastMessageId`` when ``admin.url`` is given, else a consumer on a subscription made and removed for
the question; :meth:`PulsarBackend._head`). When the answer has no batch index (pulsar-lite), the driver
reads that one entry to find its last message. No message is read to plan; ``records`` is then a lower
bound (the contract allows it without a budget). Executors open one Reader per partition topic.

*``parent`` (any broker), and any plan with a record budget.* Pulsar cannot count the messages between two
ids without reading them, so the driver keeps a tailing Reader per topic that records every message id
(:class:`~cdc.backends.pulsar.client.TopicIndex`; ids only, trimmed once planned). Each planning round reads
the new ids up to the head and stops as soon as the broker confirms there is nothing more
(``has_message_available``). Executors open the Reader on the partitioned topic with a partition-scoped
start id and drop other partitions' messages (see :mod:`cdc.backends.pulsar.client`).

*Reading (executors).* A new Reader from the stored start id (never ``seek``), a loop that does per message
only what decides membership (``message_id``, drop ids not greater than the last delivered: brokers may
redeliver; stop at the planned end), and the Arrow columns built per batch of 8192 kept messages, one pass
per column (:class:`_Columns`). A read that gets no message for ``reopenAfterMs`` short of its end opens a
new Reader after the last delivered message; one that gets nothing for ``pollTimeoutMs`` fails with
:class:`StallError`. A large receiver queue (20000) avoids most of pulsar-lite's redeliveries.

Cost (``benchmarks/pulsar_source.py``, 1M messages, 2 partitions): with ``partition`` the source reads at
the speed of one plain Reader loop over the topic (ratio ~1.0: planning 0.04 s, two partitions read in
parallel); with ``parent`` at about half of it (the driver's id pass alone costs about the reference's
whole read, and executors receive other partitions' messages).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.backend import Backend, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.backends.pulsar.admin import AdminClient, match_topics, registry_schema
from cdc.backends.pulsar.client import (
    START,
    Channel,
    Key,
    TopicIndex,
    before,
    count_between,
    is_start,
    open_client,
    partitions_of,
    to_key,
)
from cdc.backends.pulsar.codec import PROPERTIES, TS, Decoder, Malformed, sequence_of
from cdc.backends.pulsar.options import PulsarOptions
from cdc.errors import (
    BackendUnavailableError,
    DataLossError,
    MalformedRecordError,
    OptionError,
    TerminalError,
    TransientError,
)

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192


class SchemaMismatchError(TerminalError):
    """A topic of the query has a registry schema other than the one the query decodes with."""


class StallError(TransientError):
    """A read got no message for ``pollTimeoutMs`` before reaching its planned end."""


def _token(options: PulsarOptions) -> str | None:
    return options.auth_token.get_secret_value() if options.auth_token else None


class PulsarRangeReader(RangeReader):
    """Reads one partition's planned range on an executor; opens its own client there."""

    def __init__(self, options: PulsarOptions) -> None:
        self.options = options

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        s, e = to_key(start, channel), to_key(end, channel)
        if e <= s:
            return
        client = open_client(self.options.service_url, _token(self.options), self.options.operation_timeout_s)
        try:
            yield from _read_range(client, self.options, Channel.parse(channel), s, e)
        finally:
            client.close()


def _open_reader(client: Any, options: PulsarOptions, ch: Channel, start: Key) -> tuple[Any, bool]:
    """A Reader positioned at (or before) ``start``; returns it and whether it starts at ``start``'s entry."""
    import pulsar

    topic = ch.topic if options.reader_topic == "parent" or ch.partition < 0 else ch.id
    if is_start(start) or start[1] < 0:
        mid, inclusive, scoped = pulsar.MessageId.earliest, False, False
    else:
        # From the start of the entry, inclusively: ids inside a batch then never depend on how the
        # broker treats a batch index, and the first message proves the entry still exists.
        mid = pulsar.MessageId(ch.partition, start[0], start[1], -1)
        inclusive, scoped = True, True
    try:
        reader = client.create_reader(
            topic,
            mid,
            receiver_queue_size=options.receiver_queue_size,
            start_message_id_inclusive=inclusive,
        )
    except Exception as exc:  # the C++ core raises its own exception types
        raise BackendUnavailableError(
            f"channel {ch.id!r}: cannot open a Reader at {list(start)} on {options.service_url}: {exc}"
        ) from None
    return reader, scoped


def _read_range(client: Any, options: PulsarOptions, ch: Channel, start: Key, end: Key) -> Iterator[pa.RecordBatch]:
    """The read loop: per message only what decides whether it belongs to the range; the columns are
    taken from the kept messages in bulk, per Arrow batch (see :class:`_Columns`)."""
    import pulsar

    columns = _Columns(client, options, ch)
    since = options.starting_time_ms
    reader, check_first = _open_reader(client, options, ch, start)
    opened_at = start
    poll_ms = min(250, options.poll_timeout_ms, options.reopen_after_ms)
    last = start
    # A Reader on the parent topic also delivers other partitions (see cdc.backends.pulsar.client).
    partition = ch.partition if ch.partition >= 0 and options.reader_topic == "parent" else None
    msgs: list[Any] = []
    mids: list[Any] = []
    reopen_error: BackendUnavailableError | None = None
    progress = opened = time.monotonic()
    try:
        read_next = getattr(reader, "_reader", reader).read_next  # C++ reader: no Python wrapper per message
        while True:
            try:
                msg = read_next(poll_ms)
            except pulsar.Timeout:
                now = time.monotonic()
                waited = now - progress
                if waited * 1000 >= options.poll_timeout_ms:
                    raise StallError(
                        f"channel {ch.id!r}: no message for {waited:.0f} s while reading ({list(last)}, "
                        f"{list(end)}] (option pollTimeoutMs={options.poll_timeout_ms}); is the broker up?"
                        + (f" Reopening the reader failed: {reopen_error}" if reopen_error else "")
                    ) from None
                if (now - opened) * 1000 >= options.reopen_after_ms:
                    # Short of the planned end, silence is a stall: open a new reader after the last
                    # delivered message (never seek; pulsar-lite's dispatcher can stall a reader for good).
                    # The old one is kept if that fails (it reconnects by itself when the broker returns).
                    log.info("channel %s: reader silent at %s, reopening it", ch.id, list(last))
                    opened = now
                    try:
                        fresh, scoped = _open_reader(client, options, ch, last)
                    except BackendUnavailableError as exc:
                        reopen_error = exc
                        continue
                    reader.close()
                    reader, check_first, opened_at = fresh, scoped, last
                    read_next = getattr(reader, "_reader", reader).read_next
                continue
            progress = opened = time.monotonic()  # any message: other partitions' may come first for long
            mid = msg.message_id()
            if partition is not None and mid.partition() != partition:
                continue
            k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            if check_first:
                check_first = False
                if (k[0], k[1]) > (opened_at[0], opened_at[1]):
                    raise DataLossError(
                        f"channel {ch.id!r}: message entry {list(opened_at[:2])} is no longer held by the broker "
                        f"(the next is {list(k)}); retention removed it. Set failOnDataLoss=false to skip ahead.",
                        ch.id,
                    )
            if k <= last:
                continue  # a redelivered duplicate, or the start entry read inclusively
            if k > end:
                break
            last = k
            if since is None or msg.publish_timestamp() >= since:
                msgs.append(msg)
                mids.append(mid)
                if len(msgs) >= ROWS_PER_BATCH:
                    batch = columns.batch(msgs, mids)
                    msgs, mids = [], []
                    if batch is not None:
                        yield batch
            if k == end:
                break
        if msgs:
            batch = columns.batch(msgs, mids)
            if batch is not None:
                yield batch
    finally:
        columns.close()
        reader.close()


class _Columns:
    """Builds one Arrow batch from a list of kept messages, column by column (one pass per column, no
    per-row Python objects besides what decoding needs), and sets malformed messages aside."""

    def __init__(self, client: Any, options: PulsarOptions, ch: Channel) -> None:
        self.client, self.options, self.ch = client, options, ch
        self.decoder = Decoder(options.value_format, options.value_schema, options.change_keys)
        self.schema = self.decoder.schema()
        self.change = self.decoder.change is not None
        self._quarantine: Any = None

    def batch(self, msgs: list[Any], mids: list[Any]) -> pa.RecordBatch | None:
        if self.decoder.value_format == "bytes":
            data = [pa.array([m.data() for m in msgs], type=pa.binary())]
        else:
            msgs, mids, data = self._decode(msgs, mids)
            if not msgs:
                return None
        if not self.change:
            data += _metadata(self.schema, msgs, mids, self.ch.id)
        return pa.RecordBatch.from_arrays(data, schema=self.schema)

    def _decode(self, msgs: list[Any], mids: list[Any]) -> tuple[list[Any], list[Any], list[pa.Array]]:
        rows: list[list[Any]] = []
        kept: list[int] = []
        decoder, change, ch = self.decoder, self.change, self.ch.id
        for i, msg in enumerate(msgs):
            try:
                if change:
                    mid = mids[i]
                    seq = sequence_of(mid.ledger_id(), mid.entry_id(), mid.batch_index())
                    op, commit, values = decoder.decode_change(msg.data(), msg.publish_timestamp())
                    rows.append([op, seq, commit, ch, seq, *values])
                else:
                    rows.append(decoder.decode_value(msg.data()))
                kept.append(i)
            except Malformed as exc:
                self._malformed(msg, mids[i], exc)
        if len(kept) < len(msgs):
            msgs, mids = [msgs[i] for i in kept], [mids[i] for i in kept]
        types = [f.type for f in self.schema]
        arrays = [pa.array(col, type=types[j]) for j, col in enumerate(zip(*rows, strict=True))] if rows else []
        return msgs, mids, arrays

    def _malformed(self, msg: Any, mid: Any, exc: Malformed) -> None:
        options = self.options
        k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        where = f"channel {self.ch.id!r} message {list(k)} (key {msg.partition_key() or None!r})"
        if options.on_malformed == "fail":
            raise MalformedRecordError(
                f"{where} does not decode as {options.value_format}: {exc}; set onMalformed=quarantine "
                "with quarantineTopic to set such messages aside"
            ) from None
        if self._quarantine is None:
            self._quarantine = self.client.create_producer(options.quarantine_topic, batching_enabled=False)
        self._quarantine.send(
            msg.data(),
            properties={
                **msg.properties(),
                "cdc.error": str(exc)[:1000],
                "cdc.topic": self.ch.id,
                "cdc.messageId": ",".join(map(str, k)),
            },
            partition_key=msg.partition_key() or None,
        )
        log.warning("%s quarantined to %s: %s", where, options.quarantine_topic, exc)

    def close(self) -> None:
        if self._quarantine is not None:
            self._quarantine.flush()
            self._quarantine.close()


def _metadata(schema: pa.Schema, msgs: list[Any], mids: list[Any], channel: str) -> list[pa.Array]:
    """``__key``, ``__topic``, ``__messageId``, ``__publishTime``, ``__eventTime``, ``__properties``."""
    n = len(msgs)
    publish = pa.array([m.publish_timestamp() for m in msgs], type=pa.int64())
    event = pa.array([m.event_timestamp() for m in msgs], type=pa.int64())
    props = [m.properties() for m in msgs]
    props_type = schema.field(PROPERTIES).type
    if any(props):
        props_array = pa.array([list(p.items()) for p in props], type=props_type)
    else:  # the common case: build the empty maps without converting n Python lists
        props_array = pa.MapArray.from_arrays(
            pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
        )
    return [
        pa.array([m.partition_key() or None for m in msgs], type=pa.string()),
        pa.repeat(pa.scalar(channel, pa.string()), n),
        pa.array([mid.serialize() for mid in mids], type=pa.binary()),
        pc.multiply(publish, 1000).cast(TS),
        # event time 0 means "not set" in Pulsar
        pc.if_else(pc.equal(event, 0), None, pc.multiply(event, 1000)).cast(TS),
        props_array,
    ]


class PulsarBackend(Backend):
    """Topic partitions of one Pulsar cluster as channels."""

    name = "pulsar"
    options_model = PulsarOptions
    options: PulsarOptions

    def __init__(self, options: PulsarOptions) -> None:
        super().__init__(options)
        self._admin = AdminClient(options.admin_url, _token(options)) if options.admin_url else None
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
        self._decoder = Decoder(options.value_format, options.value_schema, options.change_keys)
        self._client: Any = None
        self._indexes: dict[str, TopicIndex] = {}
        self._channels: dict[str, Channel] = {}
        self._consumers: dict[str, Any] = {}
        # reader.topic=partition: the broker serves each partition as a topic, so the driver asks it for each
        # partition's last message id (getLastMessageId) instead of reading every id (see _head).
        self._probe = options.reader_topic == "partition"
        self._heads: dict[str, Key | None] = {}  # this planning round's answers (None: ask the index)
        self._stale: set[str] = set()  # topics whose index has not caught up this round
        self._partitions: dict[str, list[Channel]] = {}
        self._verified: set[str] = set()  # topics whose partitions were checked to be served as topics
        self._warned_no_admin = False

    def __repr__(self) -> str:
        return f"PulsarBackend({self.options.service_url!r}, topics={self._topics_hint()})"

    def _topics_hint(self) -> str:
        return self.options.topics_pattern or ",".join(self.options.topic_list())

    def _new_client(self) -> Any:
        return open_client(self.options.service_url, _token(self.options), self.options.operation_timeout_s)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._new_client()
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
                starting_time_ms=self.options.starting_time_ms,
                receiver_queue_size=self.options.receiver_queue_size,
                catch_up_ms=self.options.catch_up_ms,
            )
            self._stale.add(topic)
        if topic in self._stale:
            chans = self._partitions.get(topic) or partitions_of(self.client, topic)
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
            chans = self._partitions[topic] = partitions_of(self.client, topic)
            if self._probe and topic not in self._verified:
                self._check_partition_topics(chans)
                self._verified.add(topic)
            for ch in chans:
                self._channels[ch.id] = ch
                out.append(ChannelInfo(ch.id))
        self._stale.update(topics)
        self._heads.clear()
        if not self._probe:
            for topic in topics:
                self._index(topic)
        return out

    def _check_partition_topics(self, chans: Sequence[Channel]) -> None:
        """reader.topic=partition needs a broker that serves a partition as a topic of its own (Apache Pulsar
        does; pulsar-lite only when it auto-creates non-partitioned topics, else it makes a new partitioned
        topic of that name): fail clearly instead of reading an empty look-alike."""
        if not chans or chans[0].partition < 0:
            return
        names = self.client.get_topic_partitions(chans[0].id)
        if list(names) != [chans[0].id]:
            raise OptionError(
                f"option 'reader.topic': 'partition' needs a broker that serves each partition as a topic, but it "
                f"answers {chans[0].id} as a partitioned topic of its own ({len(names)} partitions; pulsar-lite "
                "does that when it auto-creates partitioned topics); accepted values: parent, partition",
                "reader.topic",
            )

    def _channel(self, channel: str) -> Channel:
        return self._channels.get(channel) or Channel.parse(channel)

    def earliest(self, channel: str) -> Position:
        ch = self._channel(channel)
        if self._probe and ch.topic not in self._indexes:
            return START  # an executor's Reader from the earliest message the broker holds
        first = self._index(ch.topic).first(ch.partition)
        return START if first is None else before(first)

    def latest(self, channel: str) -> Position:
        ch = self._channel(channel)
        head = self._head(ch) if self._probe else None
        if head is not None:
            return list(head)
        return list(self._index(ch.topic).ids(ch.partition).last)

    def parse_position(self, channel: str, value: Any) -> Position:
        return list(to_key(value, channel))

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        ch = self._channel(channel)
        s = to_key(start, channel)
        u = None if until is None else to_key(until, channel)
        if self._probe and max_records is None:
            head = self._head(ch)
            if head is not None:
                # Without a record budget nothing needs counting: the range ends at the partition's last
                # message (or the bound). ``records`` is then a lower bound (the contract allows it).
                last = head if u is None else min(head, u)
                return PlannedRange(list(last), 1) if last > s else PlannedRange(list(start), 0)
        index = self._index(ch.topic)
        if not index.covers(ch.partition, s):
            log.info("re-reading the ids of %s: planning from %s, before what the index still holds", ch.topic, s)
            index.close()
            del self._indexes[ch.topic]
            index = self._index(ch.topic)
        keys = index.ids(ch.partition).keys
        i, j = count_between(keys, s, u, max_records)
        end = list(keys[j - 1]) if j > i else list(start)
        index.trim(ch.partition, s)
        return PlannedRange(end, j - i)

    # ------------------------------------------------------------------ partition heads (reader.topic=partition)
    def _head(self, ch: Channel) -> Key | None:
        """The id of the partition's last message, without reading the partition: ``getLastMessageId`` on the
        partition's topic, then, when the broker leaves out the batch index (pulsar-lite does), the messages
        of that one entry. ``None`` when the broker does not answer: planning then reads ids (the index)."""
        if ch.id in self._heads:
            return self._heads[ch.id]
        head: Key | None
        try:
            k = self._last_message_id(ch)
            if k[0] < 0:
                head = (-1, -1, -1)  # an empty partition
            elif k[1] < 0:
                head = None  # (ledger, -1): no entry named (a new, empty ledger); the index knows the last id
            elif k[2] < 0:
                head = self._last_of_entry(ch, k[0], k[1])
            else:
                head = k
        except Exception as exc:  # noqa: BLE001 - the C++ core raises its own types (an empty topic, on pulsar-lite)
            log.debug("getLastMessageId on %s failed (%s); planning reads its message ids", ch.id, exc)
            head = None
        self._heads[ch.id] = head
        return head

    def _last_message_id(self, ch: Channel) -> Key:
        """``getLastMessageId`` of one partition: through the admin API when ``admin.url`` is given (no
        subscription involved), else through a consumer on a short-lived subscription of its own (only
        consumers can ask; the query's durable subscription may be in use by another query: Exclusive),
        removed at once."""
        if self._admin is not None:
            return self._admin.last_message_id(ch.id)
        import pulsar

        if not self._warned_no_admin:
            self._warned_no_admin = True
            log.warning(
                "reader.topic=partition without admin.url: each planning round asks every partition's last message "
                "id through a subscription made and removed for it (a metadata update on the broker per partition); "
                "give admin.url to ask the admin API instead"
            )
        name = f"{self.options.subscription()}-head-{uuid.uuid4().hex[:12]}"
        consumer = self.client.subscribe(
            ch.id,
            name,
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Latest,
            receiver_queue_size=1,
        )
        try:
            mid = consumer.get_last_message_id()
            return (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        finally:
            try:
                consumer.unsubscribe()
            except Exception:  # noqa: BLE001 - the C++ core raises its own types
                log.warning("could not remove the subscription %s of %s; remove it by hand", name, ch.id, exc_info=True)
                consumer.close()

    def _last_of_entry(self, ch: Channel, ledger: int, entry: int) -> Key | None:
        """The last message id of entry (ledger, entry): the entry itself when its message is not batched,
        else its last batch index (a batch arrives whole, so reading stops at the first silence)."""
        import pulsar

        reader = self.client.create_reader(
            ch.id,
            pulsar.MessageId(ch.partition, ledger, entry, -1),
            receiver_queue_size=self.options.receiver_queue_size,
            start_message_id_inclusive=True,
        )
        try:
            raw = getattr(reader, "_reader", reader)
            mid = raw.read_next(self.options.poll_timeout_ms).message_id()
            last = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            if last[:2] != (ledger, entry):
                return None  # not the entry the broker named: leave it to the index
            while last[2] >= 0:
                try:
                    mid = raw.read_next(5).message_id()
                except pulsar.Timeout:
                    break
                k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                if k[:2] != (ledger, entry):
                    break
                last = max(last, k)
            return last
        finally:
            reader.close()

    def reader(self) -> RangeReader:
        return PulsarRangeReader(self.options)

    def average_record_bytes(self) -> float | None:
        """Payload bytes per message over every message the driver has indexed (the index reads each
        message's size along with its id; metadata and the decoded columns are not counted). A topic
        without an index yet gets one first (with reader.topic=partition indexes exist only for record
        budgets, which is what this estimate is for); existing ones are not caught up again here: the
        planning round that follows does that, and an estimate may lag it."""
        if not self._partitions:
            self.list_channels()
        for topic in self._partitions:
            if topic not in self._indexes:
                self._index(topic)
        count = sum(index.indexed for index in self._indexes.values())
        return sum(index.indexed_bytes for index in self._indexes.values()) / count if count else 0.0

    # ------------------------------------------------------------------ acknowledgement
    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        """Advance the query's durable subscription (``subscription.name``) to the committed positions.

        A position inside a batch acknowledges up to the entry before it (an entry is acknowledged whole),
        so the backlog may show one batch more than was processed, never less.
        """
        if not self.options.acknowledge:
            return
        import _pulsar  # type: ignore[import-not-found]

        for channel, position in positions.items():
            ch = self._channel(channel)
            ledger, entry, batch = to_key(position, channel)
            if batch != -1:
                entry -= 1
            if ledger < 0 or entry < 0:
                continue
            consumer = self._subscription_consumer(ch)
            mid = _pulsar.MessageId(max(ch.partition, -1), ledger, entry, -1)
            mid.topic_name(ch.id)
            consumer.acknowledge_cumulative(mid)
        log.debug("acknowledged %s on subscription %s", dict(positions), self.options.subscription())

    def _subscription_consumer(self, ch: Channel) -> Any:
        """The query's durable subscription, on the (parent) topic."""
        import pulsar

        name = ch.topic
        consumer = self._consumers.get(name)
        if consumer is None:
            consumer = self._consumers[name] = self.client.subscribe(
                name,
                self.options.subscription(),
                consumer_type=pulsar.ConsumerType.Exclusive,
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=1,
            )
        return consumer

    def close(self) -> None:
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()
        for consumer in self._consumers.values():
            try:
                consumer.close()
            except Exception:  # noqa: BLE001
                log.debug("closing the subscription consumer failed", exc_info=True)
        self._consumers.clear()
        if self._client is not None:
            self._client.close()
            self._client = None


def drop_subscription(options: PulsarOptions) -> list[str]:
    """Remove the query's durable subscription from every topic it reads; returns the topics."""
    backend = PulsarBackend(options)
    try:
        done = []
        for topic in backend.topics():
            consumer = backend.client.subscribe(topic, options.subscription(), receiver_queue_size=1)
            consumer.unsubscribe()
            done.append(topic)
        return done
    finally:
        backend.close()
