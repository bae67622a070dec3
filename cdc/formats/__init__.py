"""Change-event formats that several backends read (a Debezium envelope reaches Pulsar and Kafka alike).

A backend's own message decoding stays in its ``records.py``; what another system's tool writes, and more than
one backend reads, lives here.
"""
