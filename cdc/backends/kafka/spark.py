"""Spark's own Kafka source, decoded into the change model: for users who keep ``spark.readStream.format("kafka")``
(its JVM reader) and want our Debezium decoding and :class:`sinks.delta.DeltaUpsertSink`.

:func:`spark_kafka_changes` takes the DataFrame that source gives (columns ``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``...) and returns change records with the change model's columns, decoded
by the same code as ``backend=kafka`` with ``valueFormat=debezium`` (:class:`cdc.formats.debezium.ChangeDecoder`;
Avro in the Confluent wire format through a Confluent-compatible registry). ``_channel`` is ``<topic>:<partition>``,
``_seq`` and ``_position`` the offset: the sink orders a key's changes by them, as it does ours. ::

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
           .option("subscribe", "pg.public.orders").load())
    changes = spark_kafka_changes(raw, change_keys="id", value_schema=schema)
    changes.writeStream.foreachBatch(DeltaUpsertSink("/lake/orders", keys=["id"])).start()

What Spark's source does not give, this cannot add: batches may end anywhere (no transaction boundaries,
no stop before a truncate), and lag per partition comes from Spark's own progress metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from cdc.backends.kafka.records import ChangeValues, change_row
from cdc.backends.kafka.registry import SchemaRegistry
from cdc.errors import MalformedRecordError, SchemaChangedError, TruncateError
from cdc.formats.debezium import DEFAULT_PLACEHOLDER, ChangeDecoder, TruncateEvent, checked_placeholder
from cdc.formats.rows import Malformed, type_default
from cdc.model import METADATA_COLUMNS

__all__ = ["spark_kafka_changes"]


def spark_kafka_changes(
    df: Any,
    *,
    change_keys: str,
    value_schema: str,
    schema_registry_url: str | None = None,
    truncate: str = "fail",
    placeholder: str = DEFAULT_PLACEHOLDER,
) -> Any:
    """The change records of a Spark Kafka source DataFrame of Debezium events (see the module).

    ``change_keys``: comma-separated key columns; ``value_schema``: the row's record schema (JSON text, as
    option ``valueSchema`` takes it); ``schema_registry_url``: for Avro values in the Confluent wire format;
    ``truncate``: ``fail`` (a truncate fails the query naming it) or ``apply`` (a ``truncate`` record, which
    DeltaUpsertSink applies); ``placeholder``: the connector's ``unavailable.value.placeholder`` (as option
    ``debezium.unavailableValuePlaceholder`` takes it: a column holding it is an unchanged column). Tombstones
    are skipped; an undecodable value fails the query naming its topic, partition and offset. A key change's
    create carries ``_old_key`` when its delete is in the same micro-batch (Spark's source may end a batch
    between them).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    if truncate not in ("fail", "apply"):
        raise ValueError(f"truncate: accepted values: fail, apply (got {truncate!r})")
    schema = ChangeDecoder(value_schema, change_keys, placeholder=checked_placeholder(placeholder)).change.arrow()
    decode = _Decode(value_schema, change_keys, schema_registry_url, truncate == "apply", placeholder)
    return df.select("key", "value", "topic", "partition", "offset", "timestamp").mapInArrow(
        decode, from_arrow_schema(schema))


class _Decode:
    """The function ``mapInArrow`` runs on executors: one decoder per topic partition, in offset order."""

    def __init__(self, value_schema: str, change_keys: str, registry_url: str | None, apply_truncates: bool,
                 placeholder: str) -> None:
        self.value_schema, self.change_keys, self.placeholder = value_schema, change_keys, placeholder
        self.registry_url, self.apply_truncates = registry_url, apply_truncates

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        registry = SchemaRegistry(self.registry_url) if self.registry_url else None
        decoders: dict[str, ChangeValues] = {}
        schema: pa.Schema | None = None
        for batch in batches:
            rows: list[list[Any]] = []
            columns = batch.to_pydict()
            for value, topic, partition, offset, ts in zip(columns["value"], columns["topic"], columns["partition"],
                                                           columns["offset"], columns["timestamp"], strict=True):
                channel = f"{topic}:{partition}"
                values = decoders.get(channel)
                if values is None:
                    values = decoders[channel] = ChangeValues(
                        ChangeDecoder(self.value_schema, self.change_keys, placeholder=self.placeholder), registry)
                    schema = values.decoder.change.arrow()
                where = f"topic {topic!r} partition {partition} offset {offset}"
                millis = int(ts.timestamp() * 1000) if ts is not None else 0
                try:
                    decoded = values.decode(value, millis)
                except Malformed as exc:
                    raise MalformedRecordError(f"{where} does not decode as a Debezium event: {exc}") from None
                except SchemaChangedError as exc:
                    raise SchemaChangedError(f"{where}: {exc}") from None
                except TruncateEvent as t:
                    if not self.apply_truncates or t.commit is None:
                        raise TruncateError(f"{where} is a Debezium truncate of table {t.table}; pass "
                                            "truncate='apply' to empty the target in order") from None
                    assert schema is not None
                    table_values = [None if f.nullable else type_default(f.type)
                                    for f in schema if f.name not in METADATA_COLUMNS]
                    rows.append(["truncate", offset, t.commit, channel, offset, *table_values])
                    continue
                if decoded is None:
                    continue  # a tombstone
                rows.append(change_row(decoded, channel, offset))
            if rows and schema is not None:
                arrays = [pa.array(col, type=f.type) for f, col in zip(schema, zip(*rows, strict=True), strict=True)]
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
