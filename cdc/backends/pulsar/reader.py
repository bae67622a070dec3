"""The executor side of ``backend=pulsar``: reading one partition's planned range into Arrow batches.

Each range gets a new Reader from the stored start id (never ``seek``) and a loop that does per message only
what decides membership (``message_id``, drop ids not greater than the last delivered: brokers may
redeliver; stop at the planned end); the Arrow columns are built per batch of 8192 kept messages, one pass
per column (:class:`_Columns`). A read that gets no message for ``reopenAfterMs`` short of its end opens a
new Reader after the last delivered message; one that gets nothing for ``pollTimeoutMs`` fails with
:class:`~cdc.backends.pulsar.errors.StallError`. A large receiver queue (20000) avoids most of pulsar-lite's
redeliveries.

Malformed messages (``onMalformed``) fail the read naming the message, or go to ``quarantineTopic``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.backend import Position, RangeReader
from cdc.backends.pulsar.connection import Channel, connect, reader_settings
from cdc.backends.pulsar.errors import StallError
from cdc.backends.pulsar.options import PulsarOptions
from cdc.backends.pulsar.positions import Key, is_start, to_key
from cdc.backends.pulsar.records import PROPERTIES, TS, Decoder, Malformed, sequence_of
from cdc.errors import (
    BackendUnavailableError,
    DataLossError,
    MalformedRecordError,
    SchemaChangedError,
    TruncateError,
)
from cdc.formats.debezium import TruncateEvent
from cdc.model import METADATA_COLUMNS, Op

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192


class PulsarRangeReader(RangeReader):
    """Reads one partition's planned range on an executor; opens its own client there."""

    def __init__(self, options: PulsarOptions) -> None:
        self.options = options

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        s, e = to_key(start, channel), to_key(end, channel)
        if e <= s:
            return
        client = connect(self.options)
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
            start_message_id_inclusive=inclusive,
            **reader_settings(options, receiver_queue_size=options.receiver_queue_size),
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
    reader, check_first = _open_reader(client, options, ch, start)
    opened_at = start
    poll_ms = min(250, options.poll_timeout_ms, options.reopen_after_ms)
    last = start
    # A Reader on the parent topic also delivers other partitions (see cdc.backends.pulsar.index).
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
    if columns.change:
        log.info(
            "channel %s: read (%s, %s]: %d changes, %d tombstones skipped",
            ch.id, list(start), list(last), columns.kept, columns.tombstones,
        )


class _Columns:
    """Builds one Arrow batch from a list of kept messages, column by column (one pass per column, no
    per-row Python objects besides what decoding needs), and sets malformed messages aside."""

    def __init__(self, client: Any, options: PulsarOptions, ch: Channel) -> None:
        self.client, self.options, self.ch = client, options, ch
        self.decoder = Decoder(
            options.value_format,
            options.value_schema,
            options.change_keys,
            options.schema_from_events,
            options.envelope_avro,
            options.debezium_unavailable_value_placeholder,
        )
        self.tombstones = 0  # Debezium's empty values after deletes: skipped, counted in the range's log line
        self.kept = 0
        self.schema = self.decoder.schema()
        self.change = self.decoder.change is not None
        self._quarantine: Any = None
        # A truncate record's table columns mean nothing; its key columns are not null in the schema, so they
        # carry a value of their type rather than a null Spark would not expect there.
        self._truncate_values = [
            None if f.nullable else _placeholder(f.type) for f in self.schema if f.name not in METADATA_COLUMNS
        ]

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
                    decoded = decoder.decode_change(msg.data(), msg.publish_timestamp())
                    if decoded is None:
                        self.tombstones += 1
                        continue
                    rows.append([decoded.op, seq, decoded.commit, ch, seq, decoded.unchanged, decoded.old_key,
                                 *decoded.values])
                else:
                    rows.append(decoder.decode_value(msg.data()))
                kept.append(i)
            except Malformed as exc:
                self._malformed(msg, mids[i], exc)
            except TruncateEvent as t:
                if self.options.debezium_truncate == "apply" and t.commit is not None:
                    rows.append([Op.TRUNCATE.value, seq, t.commit, ch, seq, *self._truncate_values])
                    kept.append(i)
                    continue
                raise TruncateError(
                    f"{self._where(msg, mids[i])} is a Debezium truncate of table {t.table}: the rows it "
                    "removes are not in the change log, so the target cannot follow; empty the target and "
                    "restart the query from after this message (startingOffsets), or set option "
                    "debezium.truncate=apply to empty the target in order"
                ) from None
            except SchemaChangedError as exc:
                raise SchemaChangedError(f"{self._where(msg, mids[i])}: {exc}") from None
        self.kept += len(kept)
        if len(kept) < len(msgs):
            msgs, mids = [msgs[i] for i in kept], [mids[i] for i in kept]
        try:
            return msgs, mids, self._arrays(rows)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            # A value its decoder let through and its column cannot hold: fail or quarantine that message (by
            # id, like any malformed one), not the whole batch with an error that names no message.
            rows, msgs, mids = self._buildable(rows, msgs, mids)
            return msgs, mids, self._arrays(rows)

    def _arrays(self, rows: list[list[Any]]) -> list[pa.Array]:
        types = [f.type for f in self.schema]
        return [pa.array(col, type=types[j]) for j, col in enumerate(zip(*rows, strict=True))] if rows else []

    def _buildable(
        self, rows: list[list[Any]], msgs: list[Any], mids: list[Any]
    ) -> tuple[list[list[Any]], list[Any], list[Any]]:
        """The rows whose every value converts to its column; the others go through onMalformed."""
        kept: list[int] = []
        for i, row in enumerate(rows):
            for field, value in zip(self.schema, row, strict=False):
                try:
                    pa.array([value], type=field.type)
                except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                    reason = f"column {field.name!r} cannot hold {str(value)[:80]!r}: {type(exc).__name__} {exc}"
                    self._malformed(msgs[i], mids[i], Malformed(reason[:500]))
                    break
            else:
                kept.append(i)
        return [rows[i] for i in kept], [msgs[i] for i in kept], [mids[i] for i in kept]

    def _where(self, msg: Any, mid: Any) -> str:
        k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        return f"channel {self.ch.id!r} message {list(k)} (key {msg.partition_key() or None!r})"

    def _malformed(self, msg: Any, mid: Any, exc: Malformed) -> None:
        options = self.options
        k = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        where = self._where(msg, mid)
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


def _placeholder(t: pa.DataType) -> Any:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_boolean(t):
        return False
    if pa.types.is_timestamp(t):
        return datetime(1970, 1, 1, tzinfo=UTC)
    if pa.types.is_date(t):
        return date(1970, 1, 1)
    if pa.types.is_decimal(t):
        return Decimal(0)
    return 0
