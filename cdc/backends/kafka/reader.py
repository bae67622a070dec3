"""The executor side of ``backend=kafka``: one partition's planned range ``[start, end)`` into Arrow batches.

Each range gets its own consumer, assigned the partition at ``start`` (no group: nothing to join, nothing
committed), that reads until it passes ``end``: a message at or after ``end`` is not taken, and the range is
complete when the last message before ``end`` was read, or when the broker says the partition ends at or
after ``end`` (end of partition). Offsets without a message the consumer sees (records a compaction removed,
transaction markers, aborted records under ``read_committed``) are skipped over by the same rule: a range
holds at most ``end - start`` records. A start below the partition's log start offset (retention deleted it)
fails with :class:`~cdc.errors.DataLossError`; a read that gets nothing for ``kafkaConsumer.pollTimeoutMs``
short of its end fails with :class:`~cdc.backends.kafka.errors.FetchTimeoutError` naming the partition.

Malformed messages (``onMalformed``) fail the read naming topic, partition and offset, or go to
``quarantineTopic``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from cdc.backend import Position, RangeReader
from cdc.backends.kafka.connection import client_config, consumer
from cdc.backends.kafka.errors import FetchTimeoutError
from cdc.backends.kafka.options import KafkaOptions
from cdc.backends.kafka.positions import Partition, to_offset
from cdc.backends.kafka.records import ChangeValues, bytes_schema, change_rows
from cdc.backends.kafka.registry import SchemaRegistry
from cdc.errors import DataLossError, MalformedRecordError, TruncateError
from cdc.formats.debezium import ChangeDecoder, TruncateEvent
from cdc.formats.rows import Malformed, type_default
from cdc.model import METADATA_COLUMNS

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192
POLL_S = 0.5


class KafkaRangeReader(RangeReader):
    """Reads one partition's planned range on an executor; opens its own consumer there. Picklable.

    ``value_schema`` is the row schema the driver settled on (given, or read from the events or the registry
    when the query was defined); ``events_schema`` says it was read from the events."""

    def __init__(self, options: KafkaOptions, value_schema: str | None = None, events_schema: bool = False) -> None:
        self.options = options
        self.value_schema = value_schema
        self.events_schema = events_schema

    def schema(self) -> pa.Schema:
        if self.options.value_format == "debezium":
            return self._decoder().change.arrow()
        return bytes_schema(self.options.include_headers)

    def _decoder(self) -> ChangeDecoder:
        return ChangeDecoder(self.value_schema, self.options.change_keys, self.events_schema,
                             placeholder=self.options.debezium_unavailable_value_placeholder)

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        s, e = to_offset(start, channel), to_offset(end, channel)
        if e <= s:
            return
        part = Partition.parse(channel)
        columns = _Columns(self, part)
        reader = _PartitionReader(self.options, part, s, e)
        try:
            for messages in reader.batches():
                batch = columns.batch(messages)
                if batch is not None and batch.num_rows:
                    yield batch
        finally:
            reader.close()
            columns.close()
        if columns.changes is not None:
            log.info("channel %s: read [%d, %d): %d changes, %d tombstones skipped, %d offsets without a message",
                     channel, s, e, columns.kept, columns.tombstones, reader.gaps)


class _PartitionReader:
    """The read loop: lists of messages of ``[start, end)``, in offset order."""

    def __init__(self, options: KafkaOptions, part: Partition, start: int, end: int) -> None:
        from confluent_kafka import TopicPartition

        self.options, self.part, self.start, self.end = options, part, start, end
        self.consumer = consumer(options)
        self.consumer.assign([TopicPartition(part.topic, part.partition, start)])
        self.taken = 0
        self.gaps = 0

    def batches(self) -> Iterator[list[Any]]:
        from confluent_kafka import KafkaError

        options, part, end = self.options, self.part, self.end
        expected = self.start  # the offset after the last message taken
        progress = time.monotonic()
        while True:
            messages = self._messages()
            kept: list[Any] = []
            done = False
            for m in messages:
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        done = (m.offset() or 0) >= end
                        if done:
                            break
                        continue  # the broker's end is short of the planned end for now (a replica catching up)
                    self._fail(error)
                offset = m.offset()
                assert offset is not None  # a message has an offset (only some errors have none)
                if offset >= end:
                    done = True
                    break
                if expected == self.start and offset > self.start:
                    self._check_start(offset)
                kept.append(m)
                expected = offset + 1
                if expected >= end:
                    done = True
                    break
            self.taken += len(kept)
            if kept or done:
                progress = time.monotonic()
            if kept:
                yield kept
            if done:
                self.gaps = (end - self.start) - self.taken
                return
            waited = time.monotonic() - progress
            if waited * 1000 >= options.poll_timeout_ms:
                raise FetchTimeoutError(
                    f"channel {part.id!r}: nothing from the broker for {waited:.0f} s while reading offsets "
                    f"[{expected}, {end}) (option kafkaConsumer.pollTimeoutMs={options.poll_timeout_ms}); is "
                    f"{options.setting('bootstrap.servers')} up, and does the partition still hold them?"
                )

    def _messages(self) -> list[Any]:
        """What the consumer has now, up to ``ROWS_PER_BATCH`` messages and events: waits up to ``POLL_S`` for the
        first only. (``consume(n, timeout)`` waits for ``n`` messages or the whole timeout, so a range smaller
        than ``n`` would cost the timeout every time.)"""
        first = self.consumer.poll(POLL_S)
        if first is None:
            return []
        return [first, *self.consumer.consume(ROWS_PER_BATCH - 1, 0)]

    def _check_start(self, first: int) -> None:
        """The first message is past the range's start: offsets without a message (compaction, transaction
        markers) are fine; a start the partition no longer holds (retention) is data loss."""
        from confluent_kafka import TopicPartition

        low, _ = self.consumer.get_watermark_offsets(TopicPartition(self.part.topic, self.part.partition),
                                                     timeout=self.options.metadata_timeout_ms / 1000)
        if low > self.start:
            raise DataLossError(
                f"channel {self.part.id!r}: offsets [{self.start}, {low}) are no longer held by the broker (the "
                f"partition now starts at {low}); retention removed them. Set failOnDataLoss=false to skip ahead.",
                self.part.id,
            )

    def _fail(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        code = error.code()
        if code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            raise DataLossError(
                f"channel {self.part.id!r}: offset {self.start} is out of the partition's range ({error.str()}); "
                "retention removed it. Set failOnDataLoss=false to skip ahead.",
                self.part.id,
            )
        if error.fatal() or not error.retriable():
            from cdc.errors import BackendUnavailableError

            raise BackendUnavailableError(f"channel {self.part.id!r}: reading [{self.start}, {self.end}): {error.str()}")
        log.info("channel %s: %s (retrying)", self.part.id, error.str())

    def close(self) -> None:
        self.consumer.close()


class _Columns:
    """Builds Arrow batches from lists of messages, and sets malformed messages aside."""

    def __init__(self, reader: KafkaRangeReader, part: Partition) -> None:
        options = reader.options
        self.options, self.part = options, part
        self.schema = reader.schema()
        self.changes: ChangeValues | None = None
        if options.value_format == "debezium":
            registry = None
            if options.schema_registry_url:
                registry = SchemaRegistry(options.schema_registry_url, options.schema_registry_auth,
                                          options.schema_registry_ca)
            self.changes = ChangeValues(reader._decoder(), registry)
            # A truncate record's table columns mean nothing; key columns are not null in the schema, so they
            # carry a value of their type.
            self._truncate_values = [None if f.nullable else type_default(f.type)
                                     for f in self.schema if f.name not in METADATA_COLUMNS]
        self.kept = self.tombstones = 0
        self._quarantine: Any = None

    def batch(self, messages: list[Any]) -> pa.RecordBatch | None:
        if self.changes is None:
            return self._bytes(messages)
        rows, tombstones = change_rows(self.changes, messages, self.part.id, self._malformed, self._truncate)
        self.tombstones += tombstones
        if not rows:
            return None
        self.kept += len(rows)
        types = [f.type for f in self.schema]
        try:
            arrays = [pa.array(col, type=types[j]) for j, col in enumerate(zip(*rows, strict=True))]
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            raise MalformedRecordError(f"channel {self.part.id!r}: a value its column cannot hold: {exc}") from None
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _bytes(self, messages: list[Any]) -> pa.RecordBatch:
        n = len(messages)
        times = [m.timestamp() for m in messages]
        arrays = [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.repeat(pa.scalar(self.part.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.part.partition, pa.int32()), n),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([t[1] * 1000 for t in times], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array([max(t[0] - 1, 0) if t[0] else 0 for t in times], pa.int32()),
        ]
        if self.options.include_headers:
            arrays.append(pa.array([m.headers() or [] for m in messages], self.schema.field("headers").type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _where(self, m: Any) -> str:
        key = m.key()
        return f"channel {self.part.id!r} offset {m.offset()} (key {key[:80]!r})" if key else \
            f"channel {self.part.id!r} offset {m.offset()}"

    def _truncate(self, m: Any, t: TruncateEvent) -> list[Any] | None:
        if self.options.debezium_truncate == "apply" and t.commit is not None:
            return list(self._truncate_values)
        raise TruncateError(
            f"{self._where(m)} is a Debezium truncate of table {t.table}: the rows it removes are not in the change "
            "log, so the target cannot follow; empty the target and restart the query from after this message "
            "(startingOffsets), or set option debezium.truncate=apply to empty the target in order"
        )

    def _malformed(self, m: Any, exc: Malformed) -> None:
        options = self.options
        where = self._where(m)
        if options.on_malformed == "fail":
            raise MalformedRecordError(
                f"{where} does not decode as {options.value_format}: {exc}; set onMalformed=quarantine with "
                "quarantineTopic to set such messages aside"
            ) from None
        if self._quarantine is None:
            import confluent_kafka

            self._quarantine = confluent_kafka.Producer(client_config(options, **{"enable.idempotence": True}))
        headers = list(m.headers() or []) + [
            ("cdc.error", str(exc)[:1000].encode()), ("cdc.topic", self.part.topic.encode()),
            ("cdc.partition", str(self.part.partition).encode()), ("cdc.offset", str(m.offset()).encode()),
        ]
        self._quarantine.produce(options.quarantine_topic, value=m.value(), key=m.key(), headers=headers)
        self._quarantine.poll(0)
        log.warning("%s quarantined to %s: %s", where, options.quarantine_topic, exc)

    def close(self) -> None:
        if self._quarantine is not None:
            left = self._quarantine.flush(60)
            if left:
                raise MalformedRecordError(f"channel {self.part.id!r}: {left} quarantined messages were not "
                                           f"acknowledged by {self.options.quarantine_topic}")

