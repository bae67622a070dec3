"""``backend=pulsar``: channels are topic partitions, positions are message ids.

See :mod:`cdc.backends.pulsar.client` for what a position is and why the driver reads message ids.
Executors read a planned range ``(start, end]`` with the Reader API from the stored start id (a new Reader
each time, never ``seek``), drop any message whose id is not greater than the last one delivered (brokers
may redeliver), stop at the planned end id, and fail with a stall error when no message arrives for
``pollTimeoutMs`` before the end is reached.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cdc.backend import Backend, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.backends.pulsar.admin import AdminClient, match_topics
from cdc.backends.pulsar.client import (
    START,
    Channel,
    Key,
    TopicIndex,
    before,
    count_between,
    is_start,
    key_of,
    open_client,
    partitions_of,
    to_key,
)
from cdc.backends.pulsar.codec import PROPERTIES, TS, Decoder, Malformed, sequence_of
from cdc.backends.pulsar.options import PulsarOptions
from cdc.errors import BackendUnavailableError, DataLossError, MalformedRecordError, TransientError

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192


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
    import pulsar

    decoder = Decoder(options.value_format, options.value_schema, options.change_keys)
    schema = decoder.schema()
    change = decoder.change is not None
    since = options.starting_time_ms
    reader, check_first = _open_reader(client, options, ch, start)
    opened_at = start
    quarantine: Any = None
    poll_ms = min(1000, options.poll_timeout_ms)
    last = start
    rows: list[list[Any]] = []
    raw_bytes = decoder.value_format == "bytes"
    meta = _Meta()
    progress = opened = time.monotonic()
    try:
        while True:
            try:
                # The C++ reader directly: pulsar.Reader wraps every message in a Python object first.
                msg = getattr(reader, "_reader", reader).read_next(poll_ms)
            except pulsar.Timeout:
                now = time.monotonic()
                waited = now - progress
                if waited * 1000 >= options.poll_timeout_ms:
                    raise StallError(
                        f"channel {ch.id!r}: no message for {waited:.0f} s while reading ({list(last)}, "
                        f"{list(end)}] (option pollTimeoutMs={options.poll_timeout_ms}); is the broker up?"
                    ) from None
                if (now - opened) * 1000 >= options.reopen_after_ms:
                    # A silent reader short of the planned end: open a new one after the last delivered
                    # message (never seek; pulsar-lite's dispatcher can stall a reader for good).
                    log.info("channel %s: reader silent at %s, reopening it", ch.id, list(last))
                    reader.close()
                    reader, check_first = _open_reader(client, options, ch, last)
                    opened, opened_at = now, last
                continue
            progress = opened = time.monotonic()
            mid = msg.message_id()
            if ch.partition >= 0 and mid.partition() != ch.partition:
                continue  # a reader on the parent topic from earliest sees every partition
            k = key_of(mid)
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
            payload = msg.data()
            publish_ms = msg.publish_timestamp()
            if since is None or publish_ms >= since:
                try:
                    if change:
                        op, commit, values = decoder.decode_change(payload, publish_ms)
                        seq = sequence_of(*k)
                        rows.append([op, seq, commit, ch.id, seq, *values])
                    else:
                        if raw_bytes:
                            meta.values.append(payload)
                        else:
                            rows.append(decoder.decode_value(payload))
                        meta.add(msg, mid, publish_ms)
                except Malformed as exc:
                    where = f"channel {ch.id!r} message {list(k)} (key {msg.partition_key() or None!r})"
                    if options.on_malformed == "fail":
                        raise MalformedRecordError(
                            f"{where} does not decode as {options.value_format}: {exc}; set onMalformed=quarantine "
                            "with quarantineTopic to set such messages aside"
                        ) from None
                    if quarantine is None:
                        quarantine = client.create_producer(options.quarantine_topic, batching_enabled=False)
                    quarantine.send(
                        payload,
                        properties={
                            **msg.properties(),
                            "cdc.error": str(exc)[:1000],
                            "cdc.topic": ch.id,
                            "cdc.messageId": ",".join(map(str, k)),
                        },
                        partition_key=msg.partition_key() or None,
                    )
                    log.warning("%s quarantined to %s: %s", where, options.quarantine_topic, exc)
            if len(rows) + len(meta.ids) >= ROWS_PER_BATCH:
                yield _batch(schema, rows, meta, change, ch.id)
                rows, meta = [], _Meta()
            if k == end:
                break
        if rows or meta.ids:
            yield _batch(schema, rows, meta, change, ch.id)
    finally:
        if quarantine is not None:
            quarantine.flush()
            quarantine.close()
        reader.close()


class _Meta:
    """Column lists of the metadata columns (and of ``value`` in bytes mode) for one Arrow batch."""

    __slots__ = ("values", "keys", "ids", "publish", "event", "props", "any_props")

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.keys: list[str | None] = []
        self.ids: list[bytes] = []
        self.publish: list[int] = []
        self.event: list[int | None] = []
        self.props: list[list[tuple[str, str]]] = []
        self.any_props = False

    def add(self, msg: Any, mid: Any, publish_ms: int) -> None:
        self.keys.append(msg.partition_key() or None)
        self.ids.append(mid.serialize())
        self.publish.append(publish_ms * 1000)
        event_ms = msg.event_timestamp()
        self.event.append(event_ms * 1000 if event_ms else None)
        props = msg.properties()
        if props:
            self.any_props = True
            self.props.append(list(props.items()))
        else:
            self.props.append([])


def _batch(schema: pa.Schema, rows: list[list[Any]], meta: _Meta, change: bool, channel: str) -> pa.RecordBatch:
    if change or rows:
        columns = list(zip(*rows, strict=True))
        arrays = [pa.array(col, type=schema.field(i).type) for i, col in enumerate(columns)]
    else:
        arrays = [pa.array(meta.values, type=pa.binary())]
    if not change:
        n = len(meta.ids)
        props_type = schema.field(PROPERTIES).type
        if meta.any_props:
            props = pa.array(meta.props, type=props_type)
        else:  # the common case: build the empty maps without converting n Python lists
            props = pa.MapArray.from_arrays(
                pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
            )
        arrays += [
            pa.array(meta.keys, type=pa.string()),
            pa.array([channel] * n, type=pa.string()),
            pa.array(meta.ids, type=pa.binary()),
            pa.array(meta.publish, type=TS),
            pa.array(meta.event, type=TS),
            props,
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class PulsarBackend(Backend):
    """Topic partitions of one Pulsar cluster as channels."""

    name = "pulsar"
    options_model = PulsarOptions
    options: PulsarOptions

    def __init__(self, options: PulsarOptions) -> None:
        super().__init__(options)
        self._decoder = Decoder(options.value_format, options.value_schema, options.change_keys)
        self._client: Any = None
        self._indexes: dict[str, TopicIndex] = {}
        self._channels: dict[str, Channel] = {}
        self._consumers: dict[str, Any] = {}
        self._admin = AdminClient(options.admin_url, _token(options)) if options.admin_url else None

    def __repr__(self) -> str:
        return f"PulsarBackend({self.options.service_url!r}, topics={self._topics_hint()})"

    def _topics_hint(self) -> str:
        return self.options.topics_pattern or ",".join(self.options.topic_list())

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = open_client(self.options.service_url, _token(self.options), self.options.operation_timeout_s)
        return self._client

    def schema(self) -> pa.Schema:
        return self._decoder.schema()

    def topics(self) -> list[str]:
        if self.options.topics_pattern:
            assert self._admin is not None
            return match_topics(self._admin, self.options.topics_pattern)
        return self.options.topic_list()

    def _index(self, topic: str) -> TopicIndex:
        index = self._indexes.get(topic)
        if index is None:
            index = self._indexes[topic] = TopicIndex(
                self.client,
                topic,
                starting_time_ms=self.options.starting_time_ms,
                receiver_queue_size=self.options.receiver_queue_size,
                catch_up_ms=self.options.catch_up_ms,
            )
            index.catch_up()
        return index

    def list_channels(self) -> Sequence[ChannelInfo]:
        """Every partition of every topic; also brings the driver's id index up to the head (one
        catch-up per planning round: the planner calls this first)."""
        out = []
        for topic in self.topics():
            chans = partitions_of(self.client, topic)
            for ch in chans:
                self._channels[ch.id] = ch
                out.append(ChannelInfo(ch.id))
            fresh = topic not in self._indexes
            index = self._index(topic)
            index.partitions = [ch.partition for ch in chans]
            if not fresh:
                index.catch_up()
        return out

    def _channel(self, channel: str) -> Channel:
        return self._channels.get(channel) or Channel.parse(channel)

    def earliest(self, channel: str) -> Position:
        ch = self._channel(channel)
        first = self._index(ch.topic).first(ch.partition)
        return START if first is None else before(first)

    def latest(self, channel: str) -> Position:
        ch = self._channel(channel)
        last = self._index(ch.topic).ids(ch.partition).last
        return list(last)

    def parse_position(self, channel: str, value: Any) -> Position:
        return list(to_key(value, channel))

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        ch = self._channel(channel)
        s = to_key(start, channel)
        index = self._index(ch.topic)
        if not index.covers(ch.partition, s):
            log.info("re-reading the ids of %s: planning from %s, before what the index still holds", ch.topic, s)
            index.close()
            del self._indexes[ch.topic]
            index = self._index(ch.topic)
        keys = index.ids(ch.partition).keys
        u = None if until is None else to_key(until, channel)
        i, j = count_between(keys, s, u, max_records)
        end = list(keys[j - 1]) if j > i else list(start)
        index.trim(ch.partition, s)
        return PlannedRange(end, j - i)

    def reader(self) -> RangeReader:
        return PulsarRangeReader(self.options)

    # ------------------------------------------------------------------ acknowledgement
    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        """Advance the query's durable subscription (``subscription.name``) to the committed positions.

        A position inside a batch acknowledges up to the entry before it (an entry is acknowledged whole),
        so the backlog may show one batch more than was processed, never less.
        """
        if not self.options.acknowledge:
            return
        import _pulsar  # type: ignore[import-not-found]
        import pulsar

        for channel, position in positions.items():
            ch = self._channel(channel)
            ledger, entry, batch = to_key(position, channel)
            if batch != -1:
                entry -= 1
            if ledger < 0 or entry < 0:
                continue
            consumer = self._consumers.get(ch.topic)
            if consumer is None:
                consumer = self._consumers[ch.topic] = self.client.subscribe(
                    ch.topic,
                    self.options.subscription(),
                    consumer_type=pulsar.ConsumerType.Exclusive,
                    initial_position=pulsar.InitialPosition.Earliest,
                    receiver_queue_size=1,
                )
            mid = _pulsar.MessageId(max(ch.partition, -1), ledger, entry, -1)
            mid.topic_name(ch.id)
            consumer.acknowledge_cumulative(mid)
        log.debug("acknowledged %s on subscription %s", dict(positions), self.options.subscription())

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
