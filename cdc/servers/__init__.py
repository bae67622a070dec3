"""Stand-in servers for development and tests, side by side: the local Tablestore server
(:mod:`cdc.servers.tablestore`) and Pulsar brokers (:mod:`cdc.servers.pulsar`: Apache Pulsar standalone, or
pulsar-lite).

They are product parts for offline work (``cdc server tablestore``, ``cdc server pulsar``), not backends:
backends (:mod:`cdc.backends`) talk to them over the wire exactly as to the real services.
"""
