"""Write DataFrames to Pulsar topics: batch and streaming, key routing, properties, producer batching.

Columns of the DataFrame (other columns are ignored unless ``valueFormat=json``):

============== ============================== ==========================================================
column         type                           use
============== ============================== ==========================================================
``value``      binary or string               the payload (``valueFormat=bytes``, the default)
``key``        string (or ``__key``)          partition key: messages with the same key go to the same
                                              partition, in order
``topic``      string (or ``__topic``)        the target topic of the row; else option ``topic``
``properties`` map<string,string>             message properties (or ``__properties``)
``eventTime``  timestamp (or ``__eventTime``) the message's event time
============== ============================== ==========================================================

With ``valueFormat=json`` every column that is not one of the above becomes a field of a JSON object
payload. Delivery is at-least-once: a retried Spark task sends its rows again.

Use it through Spark, with the ``cdc`` format (its writes dispatch on the ``backend`` option to
:meth:`PulsarBackend.writer <cdc.backends.pulsar.backend.PulsarBackend.writer>`), or the sink-only format
name ``cdc-pulsar`` (both registered by ``cdc.register(spark)``)::

    df.write.format("cdc").option("backend", "pulsar").option("service.url", url).option("topic", "orders").save()
    df.writeStream.format("cdc-pulsar").option("service.url", url).option("checkpointLocation", cp).start()

or call :func:`write` / :func:`write_arrow` directly. Options: :class:`~cdc.backends.pulsar.options.PulsarSinkOptions`.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from cdc.backends.pulsar.connection import connect, refusal
from cdc.backends.pulsar.errors import MessageTooLargeError, SendError
from cdc.backends.pulsar.options import PulsarSinkOptions, normalize_topic
from cdc.errors import OptionError, requires_extra
from cdc.options import parse

log = logging.getLogger(__name__)

__all__ = [
    "MessageTooLargeError",
    "PulsarSinkDataSource",
    "PulsarSinkOptions",
    "PulsarStreamWriter",
    "PulsarWriter",
    "SendError",
    "register",
    "write",
    "write_arrow",
]

_COLUMNS = {
    "value": ("value",),
    "key": ("key", "__key"),
    "topic": ("topic", "__topic"),
    "properties": ("properties", "__properties"),
    "event_time": ("eventTime", "__eventTime"),
}
_READ_ONLY = {"__messageId", "__publishTime"}


@dataclass
class SinkCommit(WriterCommitMessage):
    messages: int


def _sent(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.messages for m in messages if isinstance(m, SinkCommit))


def _column(schema: pa.Schema, role: str) -> str | None:
    for name in _COLUMNS[role]:
        if name in schema.names:
            return name
    return None


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


class _Sender:
    """Producers for one task; sends asynchronously, remembers the first failure with the row's key."""

    def __init__(self, options: PulsarSinkOptions) -> None:
        with requires_extra("pulsar", "writes to Pulsar"):
            import pulsar

        self.options = options
        self.client = connect(options)
        self.producers: dict[str, Any] = {}
        self.failure: str | None = None
        self.sent = 0
        self._lock = threading.Lock()
        self._compression = {
            "none": pulsar.CompressionType.NONE,
            "lz4": pulsar.CompressionType.LZ4,
            "zlib": pulsar.CompressionType.ZLib,
            "zstd": pulsar.CompressionType.ZSTD,
            "snappy": pulsar.CompressionType.SNAPPY,
        }[options.compression]

    def producer(self, topic: str) -> Any:
        p = self.producers.get(topic)
        if p is None:
            o = self.options
            try:
                p = self.client.create_producer(
                    topic,
                    batching_enabled=o.batching,
                    batching_max_messages=o.batching_max_messages,
                    batching_max_publish_delay_ms=o.batching_max_delay_ms,
                    compression_type=self._compression,
                    max_pending_messages=o.max_pending,
                    block_if_queue_full=True,
                    send_timeout_millis=o.send_timeout_ms,
                )
            except Exception as exc:  # the C++ core raises its own types
                # A broker that refuses the credential answers with a timeout: name the option to check.
                raise refusal(exc, o, f"create a producer on {topic}") from None
            self.producers[topic] = p
        return p

    def send(self, topic: str, payload: bytes, key: str | None, props: dict[str, str] | None, event_ms: int | None) -> None:
        if len(payload) > self.options.max_message_size:
            raise MessageTooLargeError(
                f"row with key {key!r} for topic {topic!r}: payload of {len(payload)} bytes exceeds the broker's "
                f"message size limit of {self.options.max_message_size} bytes (option maxMessageSize)"
            )
        if self.failure:
            raise SendError(self.failure)
        kwargs: dict[str, Any] = {}
        if key is not None:
            kwargs["partition_key"] = key
        if props:
            kwargs["properties"] = props
        if event_ms is not None:
            kwargs["event_timestamp"] = event_ms

        def done(result: Any, _mid: Any) -> None:
            import pulsar

            if result != pulsar.Result.Ok:
                with self._lock:
                    if self.failure is None:
                        self.failure = f"sending the row with key {key!r} to {topic!r} failed: {result}"

        self.producer(topic).send_async(payload, done, **kwargs)
        self.sent += 1

    def finish(self) -> int:
        try:
            for p in self.producers.values():
                p.flush()
            if self.failure:
                raise SendError(self.failure)
            return self.sent
        finally:
            self.close()

    def close(self) -> None:
        for p in self.producers.values():
            try:
                p.close()
            except Exception:  # noqa: BLE001 - already failing or closed
                log.debug("closing a producer failed", exc_info=True)
        self.client.close()


def write_arrow(batches: Iterator[pa.RecordBatch], options: PulsarSinkOptions) -> int:
    """Send the rows of ``batches``; returns how many were sent. Raises on the first failure."""
    sender: _Sender | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if sender is None:
                sender = _Sender(options)
            _send_batch(sender, batch, options)
        return sender.finish() if sender is not None else 0
    except BaseException:
        if sender is not None:
            sender.close()
        raise


def _send_batch(sender: _Sender, batch: pa.RecordBatch, options: PulsarSinkOptions) -> None:
    schema = batch.schema
    cols = {role: _column(schema, role) for role in _COLUMNS}
    n = batch.num_rows
    topics = batch.column(cols["topic"]).to_pylist() if cols["topic"] else None
    if topics is None and not options.topic:
        raise OptionError("option 'topic' is required when the rows have no 'topic' column", "topic")
    default_topic = normalize_topic(options.topic) if options.topic else None
    keys = batch.column(cols["key"]).to_pylist() if cols["key"] else [None] * n
    props = batch.column(cols["properties"]).to_pylist() if cols["properties"] else [None] * n
    if cols["event_time"]:
        ev = batch.column(cols["event_time"]).cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    else:
        ev = [None] * n
    if options.value_format == "json":
        used = {c for c in cols.values() if c} | _READ_ONLY
        rest = [name for name in schema.names if name not in used]
        records = batch.select(rest).to_pylist()
        values: list[Any] = [json.dumps(_jsonable(r), separators=(",", ":")).encode() for r in records]
    else:
        if not cols["value"]:
            raise OptionError(
                f"valueFormat=bytes needs a 'value' column (binary or string); columns: {schema.names}. "
                "Use valueFormat=json to send the other columns as a JSON object.",
                "valueFormat",
            )
        col = batch.column(cols["value"])
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            values = [None if v is None else str(v).encode() for v in col.to_pylist()]
        else:
            values = col.to_pylist()
    topic_cache: dict[str, str] = {}
    for i in range(n):
        value = values[i]
        key = keys[i]
        if value is None:
            raise SendError(f"row with key {key!r}: 'value' is null; Pulsar messages need a payload")
        if topics is not None and topics[i] is not None:
            t = topics[i]
            topic = topic_cache.get(t) or topic_cache.setdefault(t, normalize_topic(t))
        elif default_topic is not None:
            topic = default_topic
        else:
            raise SendError(f"row with key {key!r}: its 'topic' is null and option 'topic' is not set")
        p = props[i]
        sender.send(topic, value, key, dict(p) if p else None, ev[i])


def sink_options(options: Mapping[str, Any]) -> PulsarSinkOptions:
    """Parse writer options; a ``backend`` option (as ``format("cdc")`` users pass) must say ``pulsar``."""
    raw = {k: v for k, v in options.items() if k.lower() != "backend"}
    backend = next((str(v) for k, v in options.items() if k.lower() == "backend"), "pulsar")
    if backend.strip().lower() != "pulsar":
        raise OptionError(f"option 'backend': writes go to Pulsar only; accepted values: pulsar (got {backend!r})", "backend")
    return parse(PulsarSinkOptions, raw, what="the Pulsar sink")


def write(df: Any, **options: str) -> None:
    """Batch-write a DataFrame (through Spark, one task per partition): ``write(df, **{"service.url": u,
    "topic": "orders"})``."""
    writer = df.write.format("cdc-pulsar")
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("append").save()


class PulsarWriter(DataSourceArrowWriter):
    """Batch writer: each task sends its rows; at-least-once."""

    def __init__(self, options: Mapping[str, Any], schema: StructType | None = None) -> None:
        self.options = sink_options(options)
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return SinkCommit(write_arrow(iterator, self.options))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("Pulsar sink: %d messages sent", _sent(messages))


class PulsarStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer: each micro-batch's tasks send their rows; at-least-once across failures."""

    def __init__(self, options: Mapping[str, Any], schema: StructType | None = None) -> None:
        self.options = sink_options(options)
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return SinkCommit(write_arrow(iterator, self.options))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        log.info("Pulsar sink: batch %d, %d messages sent", batchId, _sent(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("Pulsar sink: batch %d aborted; the retry resends its rows (at-least-once)", batchId)


class PulsarSinkDataSource(DataSource):
    """``df.write.format("cdc-pulsar")`` / ``df.writeStream.format("cdc-pulsar")``."""

    @classmethod
    def name(cls) -> str:
        return "cdc-pulsar"

    def schema(self) -> str:
        return "value binary"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("the Pulsar sink only appends; use mode('append')", "mode")
        return PulsarWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PulsarStreamWriter(self.options, schema)


def register(spark: Any) -> None:
    spark.dataSource.register(PulsarSinkDataSource)

