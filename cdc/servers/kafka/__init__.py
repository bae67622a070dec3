"""Apache Kafka for development and tests: a KRaft broker (:class:`ApacheKafka`) and Kafka Connect standalone
with Debezium's PostgreSQL connector (:class:`KafkaConnect`), jars resolved by ``make kafka``."""

from cdc.servers.kafka.connect import KafkaConnect, postgres_connector
from cdc.servers.kafka.standalone import ApacheKafka, KafkaServerError, Tls

__all__ = ["ApacheKafka", "KafkaConnect", "KafkaServerError", "Tls", "postgres_connector"]
