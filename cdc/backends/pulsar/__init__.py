"""``backend=pulsar``: Apache Pulsar topic partitions as channels, message ids as positions; writes too.

Files: :mod:`.options` (read and write options), :mod:`.backend` (the driver: channels, planning),
:mod:`.reader` (the executor side), :mod:`.positions` (message ids as positions), :mod:`.index` (the
driver's message-id index), :mod:`.heads` (partition heads, ``reader.topic=partition``),
:mod:`.acknowledge` (the durable subscription), :mod:`.connection` (clients, partitions), :mod:`.admin`
(admin REST calls), :mod:`.records` (payloads to rows: JSON, Avro, Debezium envelopes read by :mod:`cdc.formats.debezium`), :mod:`.writer` (the sink),
:mod:`.errors`, :mod:`.cli` (``cdc pulsar``).

The names below are imported on first use (PEP 562), so that importing, say, :mod:`.records` or
:mod:`.positions` loads neither pydantic, pyspark nor pulsar-client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backends.pulsar.backend import PulsarBackend, drop_subscription
    from cdc.backends.pulsar.errors import SchemaMismatchError, StallError
    from cdc.backends.pulsar.options import PulsarOptions, PulsarSinkOptions
    from cdc.backends.pulsar.reader import PulsarRangeReader

__all__ = [
    "PulsarBackend",
    "PulsarOptions",
    "PulsarRangeReader",
    "PulsarSinkOptions",
    "SchemaMismatchError",
    "StallError",
    "drop_subscription",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PulsarBackend": ".backend",
        "drop_subscription": ".backend",
        "PulsarOptions": ".options",
        "PulsarSinkOptions": ".options",
        "PulsarRangeReader": ".reader",
        "SchemaMismatchError": ".errors",
        "StallError": ".errors",
    },
)
