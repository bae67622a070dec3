"""Pulsar brokers for development and tests: the embedded pulsar-lite broker (:class:`EmbeddedBroker`) and
Apache Pulsar's own standalone broker (:class:`ApachePulsar`, jars resolved by ``make pulsar-standalone``)."""

from cdc.servers.pulsar.broker import BrokerError, EmbeddedBroker
from cdc.servers.pulsar.standalone import ApachePulsar

__all__ = ["ApachePulsar", "BrokerError", "EmbeddedBroker"]
