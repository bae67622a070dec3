"""``backend=kafka``: Apache Kafka topic partitions as channels, offsets as positions.

Files: :mod:`.options` (Spark's Kafka option names where they exist), :mod:`.backend` (the driver: channels,
planning, lag, committing the consumer group's offsets), :mod:`.reader` (the executor side), :mod:`.positions`
(partitions and offsets), :mod:`.connection` (confluent-kafka clients), :mod:`.records` (messages to rows:
Spark's Kafka columns, Debezium events read by :mod:`cdc.formats.debezium`), :mod:`.registry` (a
Confluent-compatible schema registry), :mod:`.spark` (Spark's own Kafka source's output decoded into the
change model), :mod:`.errors`.

The names below are imported on first use (PEP 562): importing one light module loads neither pydantic nor
confluent-kafka.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backends.kafka.backend import KafkaBackend
    from cdc.backends.kafka.errors import FetchTimeoutError
    from cdc.backends.kafka.options import KafkaOptions
    from cdc.backends.kafka.reader import KafkaRangeReader

__all__ = ["FetchTimeoutError", "KafkaBackend", "KafkaOptions", "KafkaRangeReader"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "KafkaBackend": ".backend",
        "KafkaOptions": ".options",
        "KafkaRangeReader": ".reader",
        "FetchTimeoutError": ".errors",
    },
)
