"""The embedded Pulsar broker (pulsar-lite) for development and tests: :class:`EmbeddedBroker`."""

from cdc.servers.pulsar.broker import BrokerError, EmbeddedBroker

__all__ = ["BrokerError", "EmbeddedBroker"]
