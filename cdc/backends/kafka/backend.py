"""``backend=kafka``: channels are topic partitions, positions are offsets.

Planning asks the cluster for each partition's log start offset and head once per planning round (two
``ListOffsets`` requests for every partition of the query, through the admin client): the head is the last
stable offset under ``read_committed`` (the default; no record of a transaction still open is readable before
it), the high watermark under ``read_uncommitted``. A range ends at the head, at ``until``, or ``max_records``
offsets after its start: no message is read to plan. Its ``records`` are the offsets it spans, which is the
number of records it holds on a topic without gaps, and an upper bound on a compacted topic or with
transactional producers (see :mod:`cdc.backends.kafka.positions`): there the budget is a budget of offsets, as
Spark's ``maxOffsetsPerTrigger`` is, and a range may hold fewer records. A start below the log start offset
raises :class:`~cdc.errors.DataLossError` (the planner skips to the earliest offset with
``failOnDataLoss=false``).

Partitions appear while a query runs (a topic given more partitions; a topic matching ``subscribePattern``
created): each is a new channel from its first offset. A partition added to a topic takes over keys of the
older partitions, so it follows them (:attr:`cdc.backend.ChannelInfo.follows`): it starts once the query has
read the older partitions up to their heads at the moment it appeared, so a key's records stay in order
across the move.

With ``debezium.transactionTopic`` batches end between source transactions (see
:mod:`cdc.backends.kafka.transactions`): the driver then reads every message once more to index it, and a
range's ``records`` are the messages it holds (``maxRecordsPerTrigger`` counts messages, not offsets).

After a batch commits, its end offsets are committed to the query's consumer group (``commitOffsets``): lag
tools see the query; Spark's checkpoint stays the source of truth.
"""

from __future__ import annotations

import json
import logging
import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from cdc.backend import Backend, ChannelHead, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.backends.kafka.connection import Cluster
from cdc.backends.kafka.options import KafkaOptions
from cdc.backends.kafka.positions import Partition, from_spark_offsets, to_offset
from cdc.backends.kafka.reader import KafkaRangeReader
from cdc.backends.kafka.records import confluent_schema_id
from cdc.backends.kafka.registry import SchemaRegistry
from cdc.backends.kafka.transactions import TransactionIndex
from cdc.errors import CdcError, DataLossError, OptionError, requires_extra
from cdc.formats.debezium import record_schema_of, record_schema_of_avro
from cdc.formats.transactions import IndexedMessages, transaction_cut

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WATERMARKS_TTL_S = 1.0
"""How long planning reuses the offsets it asked for (within a round; a new round asks again)."""


class KafkaBackend(Backend):
    """The partitions of a Kafka cluster's topics as channels."""

    name = "kafka"
    options_model = KafkaOptions
    options: KafkaOptions

    def __init__(self, options: KafkaOptions) -> None:
        with requires_extra("kafka", "backend 'kafka'"):
            import confluent_kafka  # noqa: F401 - imported where used, by the driver and executors alike
            import fastavro  # noqa: F401
        super().__init__(options)
        self.cluster = Cluster(options)
        self._partitions: list[Partition] = []
        self._marks: dict[Partition, tuple[int, int]] = {}
        self._marks_at = 0.0
        self._value_schema = options.value_schema
        self._events_schema = False
        if options.value_format == "debezium" and not options.value_schema:
            self._value_schema, self._events_schema = self._schema_from_topics()
        self._reader = KafkaRangeReader(options, self._value_schema, self._events_schema)
        # debezium.transactionTopic: the transaction log and offset index, and this round's window of transaction
        # orders the cut may take (None: not opened yet this round). See cdc.backends.kafka.transactions.
        self._transactions: TransactionIndex | None = None
        self._window: tuple[float, float] | None = None

    def __repr__(self) -> str:
        topics = self.options.subscribe or self.options.subscribe_pattern or self.options.assign
        return f"KafkaBackend({self.options.setting('bootstrap.servers')!r}, {topics})"

    def schema(self) -> pa.Schema:
        return self._reader.schema()

    # ------------------------------------------------------------------ channels and offsets
    def list_channels(self) -> Sequence[ChannelInfo]:
        """Every partition of the query's topics; starts a planning round (offsets are asked again)."""
        self._partitions = self.cluster.partitions()
        self._marks_at = 0.0
        if self.options.debezium_transaction_topic is not None:
            # Before the data partitions: every data event of a transaction whose END is read now is then indexed
            # in this round (Debezium publishes a transaction's events before its END).
            self._transaction_index().catch_up_log()
            self._window = None
        # Partitions are added with increasing numbers: a partition follows the topic's lower-numbered ones, so
        # several partitions added between two batches take part one after another (never waiting on each other).
        by_topic: dict[str, list[Partition]] = {}
        for p in self._partitions:
            by_topic.setdefault(p.topic, []).append(p)
        return [
            ChannelInfo(p.id, follows=tuple(o.id for o in by_topic[p.topic] if o.partition < p.partition))
            for p in self._partitions
        ]

    def _watermarks(self, part: Partition) -> tuple[int, int]:
        if part not in self._marks or time.monotonic() - self._marks_at > WATERMARKS_TTL_S:
            parts = self._partitions if part in self._partitions else [*self._partitions, part]
            self._marks = self.cluster.watermarks(parts)
            self._marks_at = time.monotonic()
        return self._marks[part]

    def earliest(self, channel: str) -> Position:
        return self._watermarks(Partition.parse(channel))[0]

    def latest(self, channel: str) -> Position:
        return self._watermarks(Partition.parse(channel))[1]

    def parse_position(self, channel: str, value: Any) -> Position:
        return to_offset(value, channel)

    def channel_positions(self, given: dict[str, Any]) -> dict[str, Any]:
        return from_spark_offsets(given)

    def position_at(self, channel: str, when: datetime) -> Position:
        """The offset of the partition's first record with a timestamp at or after ``when``, else the head (taken
        first: a record produced meanwhile lies after it, not skipped)."""
        part = Partition.parse(channel)
        head = self.latest(channel)
        when_ms = -((_EPOCH - when) // timedelta(milliseconds=1))  # a time inside a millisecond: the next one
        found = self.cluster.offsets_for_time([part], when_ms)[part]
        return head if found is None else min(found, head)

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        part = Partition.parse(channel)
        s = to_offset(start, channel)
        low, head = self._watermarks(part)
        if s < low:
            raise DataLossError(
                f"channel {channel!r}: offsets [{s}, {low}) are no longer held by the broker (the partition now "
                f"starts at {low}); retention removed them",
                channel,
            )
        end = head if until is None else min(head, to_offset(until, channel))
        if self.options.debezium_transaction_topic is not None:
            return self._transaction_plan(part, s, max(end, s), max_records)
        if max_records is not None:
            end = min(end, s + max_records)
        end = max(end, s)
        return PlannedRange(end, end - s)

    def _transaction_index(self) -> TransactionIndex:
        if self._transactions is None:
            self._transactions = TransactionIndex(self.options, self.cluster)
        return self._transactions

    def _transaction_plan(self, part: Partition, s: int, bound: int, max_records: int | None) -> PlannedRange:
        """A range from ``s`` that ends at a transaction boundary consistent with the round's other partitions,
        before ``bound`` (the head, endingOffsets, an AvailableNow target); ``max_records`` counts messages
        (see :mod:`cdc.formats.transactions`)."""
        index = self._transaction_index()
        if not index.covers(part, s):
            log.info("re-reading %s: planning from %s, below what the index still holds", part.id, s)
            index.forget(part)  # its counts too; the frontier and this round's window stay
            if self._window is not None:
                index.catch_up({part: self._watermarks(part)})
        if self._window is None:
            if not self._partitions:
                self.list_channels()  # a plan before any round (a replayed batch): the transaction topic first
            parts = sorted({*self._partitions, part})
            # every partition caught up before the frontier is taken
            index.catch_up({p: self._watermarks(p) for p in parts})
            self._window = (-1.0, float(index.log.advance()))
        entries = index.entries(part)
        upto = min(bound, entries.upto)
        keys = entries.keys
        i = bisect_left(keys, s)
        limit = bisect_left(keys, upto)
        j = limit if max_records is None else min(limit, i + max_records)
        cut, self._window = transaction_cut(IndexedMessages(entries, index.log.order), i, j, limit, self._window)
        # offsets after the last message taken hold no message the range could miss (gaps) when it takes all
        end = upto if cut == limit else s if cut == i else keys[cut]
        index.trim(part, s)
        return PlannedRange(end, cut - i)

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        """Offsets that cut a partition's range into ``parts`` pieces of about equal width, as Spark's Kafka source
        cuts for ``minPartitions``: found from the range's ends alone, so a replayed batch is cut the same way.
        Each piece is read by offset like any range; one may hold fewer records than offsets (transaction
        markers, aborted or compacted records), never other ones."""
        s, e = to_offset(start, channel), to_offset(end, channel)
        width = e - s
        parts = min(parts, width)
        if parts < 2:
            return ()
        return [s + width * i // parts for i in range(1, parts)]

    def range_size(self, channel: str, start: Position, end: Position) -> int | None:
        return max(0, to_offset(end, channel) - to_offset(start, channel))

    def reader(self) -> RangeReader:
        return self._reader

    # ------------------------------------------------------------------ lag and the consumer group
    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        """Each partition's head and the offsets from the query's position to it (``behind``: what Spark's Kafka
        source reports as offsets behind latest; an upper bound of records on a compacted or transactional
        topic)."""
        self._marks_at = 0.0
        out = {}
        for cid, pos in positions.items():
            head = self.latest(cid)
            out[cid] = ChannelHead(head, max(0, int(head) - int(pos)))
        return out

    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        """Commit the batch's end offsets to the query's consumer group (``commitOffsets``), for lag tools."""
        if not self.options.commit_offsets:
            return
        offsets = {Partition.parse(c): to_offset(p, c) for c, p in positions.items()}
        try:
            self.cluster.commit(offsets)
        except Exception as exc:  # noqa: BLE001 - best effort; confluent-kafka raises KafkaException
            log.warning("committing offsets to consumer group %s failed (retried at the next batch): %s",
                        self.options.group_id(), exc)
            return
        log.debug("committed %s to consumer group %s", dict(positions), self.options.group_id())

    # ------------------------------------------------------------------ the row schema of Debezium events
    def _schema_from_topics(self) -> tuple[str, bool]:
        """``valueSchema`` from the first change event of the query's partitions: its JSON schema
        (``schemas.enable=true``), or its Avro schema from the registry (Confluent wire format)."""
        from confluent_kafka import KafkaError, TopicPartition

        consumer = self.cluster.consumer
        parts = self.cluster.partitions()
        marks = self.cluster.watermarks(parts)
        pending = {p for p in parts if marks[p][1] > marks[p][0]}
        if not pending:
            raise OptionError("option 'valueSchema' is required: the query's topics hold no Debezium event to read "
                              "the row schema from (they are empty); give option valueSchema", "valueSchema")
        consumer.assign([TopicPartition(p.topic, p.partition, marks[p][0]) for p in sorted(pending)])
        deadline = time.monotonic() + self.options.metadata_timeout_ms / 1000
        try:
            while pending and time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is None:
                    continue
                part = Partition(m.topic(), m.partition())
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(part)
                    continue
                found = self._schema_of(m.value(), part, m.offset())
                if found is not None:
                    log.info("valueSchema read from %s offset %d: %s", part.id, m.offset(), found[0])
                    return found
        finally:
            consumer.unassign()
        raise OptionError("option 'valueSchema' is required: no change event of the query's topics carries a row "
                          "schema (JSON converter with schemas.enable=false?); give option valueSchema", "valueSchema")

    def _schema_of(self, value: bytes | None, part: Partition, offset: int) -> tuple[str, bool] | None:
        if not value:
            return None  # a tombstone
        schema_id = confluent_schema_id(value)
        if schema_id is not None:
            if not self.options.schema_registry_url:
                raise OptionError(
                    f"option 'schema.registry.url' is required: {part.id} offset {offset} is an Avro value in the "
                    f"Confluent wire format (schema id {schema_id})", "schema.registry.url")
            registry = SchemaRegistry(self.options.schema_registry_url, self.options.schema_registry_auth,
                                      self.options.schema_registry_ca)
            return record_schema_of_avro(json.loads(registry.schema(schema_id))), False
        try:
            doc = json.loads(value)
            if isinstance(doc.get("payload"), dict) and doc["payload"].get("op") == "t":
                return None  # a truncate's schema has no row
            if "schema" in doc or "op" not in doc:  # else an envelope without schema: see below
                return record_schema_of(doc["schema"]), True
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise OptionError(
                f"option 'valueSchema' is required: {part.id} offset {offset} carries no row schema ({exc}); give "
                "option valueSchema, or write events with schemas (converter schemas.enable=true)", "valueSchema"
            ) from None
        raise OptionError(
            f"option 'valueSchema' is required: {part.id} offset {offset} is a Debezium event without a schema (JSON "
            "converter with schemas.enable=false), so nothing gives its columns' types; give option valueSchema, the "
            'row\'s record schema ({"type": "record", "name": ..., "fields": [{"name": ..., "type": ...}, ...]}), or '
            "write events with schemas (schemas.enable=true)", "valueSchema")

    def close(self) -> None:
        if self._transactions is not None:
            self._transactions.close()
            self._transactions = None
        try:
            self.cluster.close()
        except CdcError:  # pragma: no cover - closing never fails the caller
            pass
