"""Apache Pulsar as a cdc-tunnel backend: topic partitions are channels, message ids are positions."""

from cdc.backends.pulsar.backend import PulsarBackend, PulsarRangeReader, StallError, drop_subscription
from cdc.backends.pulsar.options import PulsarOptions

__all__ = ["PulsarBackend", "PulsarOptions", "PulsarRangeReader", "StallError", "drop_subscription"]
