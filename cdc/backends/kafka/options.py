"""Options of ``backend=kafka`` (names follow Spark's own Kafka source where it has one).

Client settings pass through as ``kafka.<name>`` to the consumer (librdkafka, confluent-kafka's core), as
Spark hands ``kafka.<name>`` to the Java consumer: ``kafka.bootstrap.servers`` is required,
``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.username``, ``kafka.sasl.password``,
``kafka.ssl.ca.location``, ``kafka.isolation.level``... A Java client's ``kafka.sasl.jaas.config`` with the
PLAIN or SCRAM login module is read into librdkafka's username and password. Secret settings (passwords,
secrets, JAAS configs, PEM keys) are held as ``SecretStr``: never in reprs, logs or errors.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import PositiveInt, SecretStr, field_validator, model_validator

from cdc.formats.debezium import DEFAULT_PLACEHOLDER, PLACEHOLDER_DESCRIPTION, checked_placeholder
from cdc.options import BackendOptions, Field

ValueFormat = Literal["bytes", "debezium"]
OnMalformed = Literal["fail", "quarantine"]
OnTruncate = Literal["fail", "apply"]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_SECRET = re.compile(r"password|secret|jaas|(^|\.)key\.pem$|token", re.IGNORECASE)
"""librdkafka settings whose values are credentials (``sasl.password``, ``ssl.key.password``,
``sasl.oauthbearer.client.secret``, ``ssl.key.pem``, a JAAS config...)."""

# Java client settings Spark jobs carry that librdkafka names otherwise: refused with the name to use.
_JAVA_ONLY = {
    "ssl.truststore.location": "kafka.ssl.ca.location (a PEM file of the CAs to trust)",
    "ssl.truststore.password": "kafka.ssl.ca.location (a PEM file needs no password)",
    "ssl.truststore.type": "kafka.ssl.ca.location (PEM)",
    "ssl.keystore.type": "kafka.ssl.certificate.location and kafka.ssl.key.location (PEM files)",
    "key.deserializer": "nothing: keys are read as bytes",
    "value.deserializer": "nothing: values are read as bytes (valueFormat decodes them)",
    "enable.auto.commit": "nothing: offsets live in Spark's checkpoint; option commitOffsets commits them to the "
                          "consumer group after each batch",
    "auto.offset.reset": "startingOffsets",
}
_JAAS = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def client_settings(raw: Mapping[str, Any]) -> dict[str, str | SecretStr]:
    """The ``kafka.*`` settings as librdkafka takes them: values as strings, credentials as ``SecretStr``,
    a Java JAAS config of the PLAIN or SCRAM login module read into ``sasl.username``/``sasl.password``."""
    out: dict[str, str | SecretStr] = {}
    for key, value in raw.items():
        name = key.strip()
        if name.lower() in _JAVA_ONLY:
            raise ValueError(f"'kafka.{name}' is a Java client setting; use {_JAVA_ONLY[name.lower()]}")
        if name.lower() == "sasl.jaas.config":
            out.update(_from_jaas(value.get_secret_value() if isinstance(value, SecretStr) else str(value)))
            continue
        if isinstance(value, SecretStr):
            out[name] = value
        elif isinstance(value, (str, int, float, bool)):
            text = str(value).lower() if isinstance(value, bool) else str(value)
            out[name] = SecretStr(text) if _SECRET.search(name) else text
        else:
            raise ValueError(f"'kafka.{name}' takes a string, not {type(value).__name__}")
    return out


def _from_jaas(text: str) -> dict[str, str | SecretStr]:
    module = text.strip().split(None, 1)[0] if text.strip() else ""
    if module not in _JAAS_MODULES:
        raise ValueError(
            "'kafka.sasl.jaas.config' is read only for the PLAIN and SCRAM login modules (username and password); "
            "for other mechanisms use librdkafka's own settings (kafka.sasl.oauthbearer.*, kafka.sasl.kerberos.*)"
        )
    values = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS.findall(text)}
    if "username" not in values or "password" not in values:
        raise ValueError("'kafka.sasl.jaas.config' names no username and password")
    return {"sasl.username": values["username"], "sasl.password": SecretStr(values["password"])}


class KafkaOptions(BackendOptions):
    """``spark.readStream.format("cdc").option("backend", "kafka")...``"""

    passthrough: ClassVar[Mapping[str, str]] = {"kafka.": "client_settings"}
    # Spark's Kafka source names for the source's own budget options: taken as they are, without a warning.
    aliases: ClassVar[Mapping[str, str]] = {
        "maxoffsetspertrigger": "maxRecordsPerTrigger",
        "minoffsetspertrigger": "minRecordsPerTrigger",
    }

    client_settings: dict[str, str | SecretStr] = Field(
        {},  # pydantic copies it per model
        alias="kafka.*",
        description="kafka.<name>: setting <name> of the consumer (librdkafka's names, as Spark hands kafka.<name> "
        "to the Java consumer): kafka.bootstrap.servers (required), kafka.security.protocol, kafka.sasl.mechanism, "
        "kafka.sasl.username, kafka.sasl.password, kafka.ssl.ca.location, kafka.isolation.level (default "
        "read_committed: aborted transactions and control records are never delivered)... A Java "
        "kafka.sasl.jaas.config of the PLAIN or SCRAM login module is read into the username and password. "
        "Passwords, secrets and keys are never logged.",
    )
    subscribe: str | None = Field(None, alias="subscribe", description="Comma-separated topics.")
    subscribe_pattern: str | None = Field(
        None, alias="subscribePattern",
        description="A regular expression (Python's re, matched whole) over the cluster's topic names, listed "
        "again at every batch: a topic created later joins the query.",
    )
    assign: str | None = Field(
        None, alias="assign", description='Topic partitions as JSON, Spark\'s form: {"orders": [0, 1]}.'
    )
    value_format: ValueFormat = Field(
        "bytes",
        alias="valueFormat",
        description="`bytes`: Spark's Kafka columns (key, value, topic, partition, offset, timestamp, timestampType, "
        "and headers with includeHeaders); `debezium`: decode Debezium change events (JSON with or without schemas, "
        "or Avro in the Confluent wire format with schema.registry.url) into the change model.",
    )
    include_headers: bool = Field(
        False, alias="includeHeaders", description="valueFormat=bytes: a headers column (Spark's)."
    )
    value_schema: str | None = Field(
        None,
        alias="valueSchema",
        description="valueFormat=debezium: the row's Avro-style record schema. Without it, the query reads it when "
        "it is defined: from the first event of the topics (JSON converter with schemas.enable=true), or from the "
        "schema registry (Avro: the envelope's 'after' record).",
    )
    change_keys: str | None = Field(
        None, alias="changeKeys", description="valueFormat=debezium: comma-separated primary-key columns."
    )
    schema_registry_url: str | None = Field(
        None,
        alias="schema.registry.url",
        description="A Confluent-compatible schema registry (Confluent Schema Registry, Apicurio's ccompat API, "
        "Karapace, Redpanda): Avro values in the Confluent wire format (magic byte 0, a 4-byte schema id) are "
        "decoded with the schema of their id, fetched once per id (GET /schemas/ids/<id>).",
    )
    schema_registry_auth: SecretStr | None = Field(
        None,
        alias="schema.registry.basic.auth.user.info",
        description="`user:password` for the registry's HTTP basic authentication (Confluent's name).",
    )
    schema_registry_ca: str | None = Field(
        None, alias="schema.registry.ssl.ca.location", description="PEM file of the CAs trusted for an https registry."
    )
    on_malformed: OnMalformed = Field(
        "fail",
        alias="onMalformed",
        description="A message that cannot be decoded: `fail` the query naming its topic, partition and offset, or "
        "`quarantine` it to quarantineTopic (its key and value as they were, headers cdc.error, cdc.topic, "
        "cdc.partition, cdc.offset) and go on.",
    )
    quarantine_topic: str | None = Field(
        None, alias="quarantineTopic", description="Where onMalformed=quarantine sends undecodable messages."
    )
    debezium_truncate: OnTruncate = Field(
        "fail",
        alias="debezium.truncate",
        description="valueFormat=debezium, a truncate (op t): `fail` the query naming the table and message, or "
        "`apply` it: it becomes a change record with _op `truncate`, which DeltaUpsertSink applies in order with the "
        "changes of its partition (Debezium writes a table to one partition unless told otherwise).",
    )
    debezium_transaction_topic: str | None = Field(
        None,
        alias="debezium.transactionTopic",
        description="valueFormat=debezium: Debezium's transaction topic (provide.transaction.metadata=true; "
        "`<topic.prefix>.transaction`, one partition). Batches then never end inside a source transaction, over "
        "every partition and topic of the query: a budget (maxRecordsPerTrigger, then counted in messages) ending "
        "inside one takes the rest of it, a transaction whose END event or events have not all arrived waits. "
        "Planning then reads every message once more on the driver (see From Debezium for the cost).",
    )
    debezium_unavailable_value_placeholder: str = Field(
        DEFAULT_PLACEHOLDER, alias="debezium.unavailableValuePlaceholder", description=PLACEHOLDER_DESCRIPTION
    )
    poll_timeout_ms: PositiveInt = Field(
        120_000,
        alias="kafkaConsumer.pollTimeoutMs",
        description="An executor's read that gets nothing from the broker for this long short of its planned end "
        "fails, naming the partition and offsets (Spark's name).",
    )
    group_id_prefix: str = Field(
        "cdc",
        alias="groupIdPrefix",
        description="The consumer group the driver commits the query's offsets to (commitOffsets) is "
        "<groupIdPrefix>-<hash of the servers and topics>, unless kafka.group.id names it. Executors never "
        "join a group: they read assigned partitions.",
    )
    commit_offsets: bool = Field(
        True,
        alias="commitOffsets",
        description="After each batch commits, commit its end offsets to the consumer group, so that lag tools "
        "(kafka-consumer-groups, Burrow, a monitoring system) see the query. Best effort: the offsets in Spark's "
        "checkpoint are the source of truth; a failed commit is logged and retried at the next batch.",
    )
    metadata_timeout_ms: PositiveInt = Field(
        30_000,
        alias="metadataTimeoutMs",
        description="How long the driver waits for the broker to answer a metadata, offset or commit request.",
    )

    @field_validator("client_settings", mode="before")
    @classmethod
    def _client_settings(cls, v: Any) -> Any:
        return client_settings(v) if isinstance(v, Mapping) else v

    @field_validator("debezium_unavailable_value_placeholder")
    @classmethod
    def _placeholder(cls, v: str) -> str:
        return checked_placeholder(v)

    @model_validator(mode="after")
    def _check(self) -> KafkaOptions:
        given = [n for n, v in (("subscribe", self.subscribe), ("subscribePattern", self.subscribe_pattern),
                                ("assign", self.assign)) if v]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of options 'subscribe', 'subscribePattern', 'assign' is required (got {given or 'none'})"
            )
        if not self.setting("bootstrap.servers"):
            raise ValueError("option 'kafka.bootstrap.servers' is required (host:port[,host:port...])")
        if self.subscribe_pattern:
            try:
                re.compile(self.subscribe_pattern)
            except re.error as exc:
                raise ValueError(f"option 'subscribePattern' is not a regular expression: {exc}") from None
        if self.assign:
            self.assignment()  # raises naming the option
        if self.value_format == "debezium" and not self.change_keys:
            raise ValueError("option 'changeKeys' is required with valueFormat=debezium")
        if self.value_schema:
            try:
                json.loads(self.value_schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"option 'valueSchema' is not JSON: {exc}") from None
        if self.on_malformed == "quarantine" and not self.quarantine_topic:
            raise ValueError("option 'quarantineTopic' is required with onMalformed=quarantine")
        if self.debezium_transaction_topic is not None:
            self._check_transaction_topic(self.debezium_transaction_topic)
        if self.include_headers and self.value_format != "bytes":
            raise ValueError("option 'includeHeaders' applies to valueFormat=bytes")
        level = str(self.setting("isolation.level") or "read_committed")
        if level not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"option 'kafka.isolation.level': accepted values: read_committed, read_uncommitted "
                             f"(got {level!r})")
        return self

    def _check_transaction_topic(self, topic: str) -> None:
        what = "option 'debezium.transactionTopic'"
        if self.value_format != "debezium":
            raise ValueError(f"{what} needs valueFormat=debezium (got valueFormat={self.value_format})")
        if not _TOPIC_NAME.fullmatch(topic):
            raise ValueError(f"{what}: accepted values: a Kafka topic name (letters, digits, '.', '_', '-'; at most "
                             f"249), Debezium's <topic.prefix>.transaction; got {topic!r}")
        read = set(self.topic_list()) | set(self.assignment() if self.assign else ())
        if topic in read or (self.subscribe_pattern and re.fullmatch(self.subscribe_pattern, topic)):
            raise ValueError(f"{what}: {topic!r} is one of the topics the query reads; accepted values: Debezium's "
                             "transaction topic (<topic.prefix>.transaction), not a data topic")

    def setting(self, name: str) -> str | None:
        """A ``kafka.*`` setting's value (a secret's too: for the client only)."""
        value = self.client_settings.get(name)
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    @property
    def read_committed(self) -> bool:
        return (self.setting("isolation.level") or "read_committed") == "read_committed"

    def topic_list(self) -> list[str]:
        """The topics of ``subscribe`` (``subscribePattern``'s are listed by the backend)."""
        return [t.strip() for t in (self.subscribe or "").split(",") if t.strip()]

    def assignment(self) -> dict[str, list[int]]:
        """``assign`` as {topic: [partitions]}."""
        try:
            value = json.loads(self.assign or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"option 'assign' is not JSON: {exc}") from None
        if not isinstance(value, dict) or not all(
            isinstance(t, str) and isinstance(ps, list) and all(isinstance(p, int) and p >= 0 for p in ps)
            for t, ps in value.items()
        ) or not value:
            raise ValueError('option \'assign\': accepted values: JSON {"<topic>": [<partition>, ...], ...}')
        return {t: sorted(set(ps)) for t, ps in value.items()}

    def group_id(self) -> str:
        """The consumer group offsets are committed to: ``kafka.group.id``, else one named after the query's
        servers and topics."""
        given = self.setting("group.id")
        if given:
            return given
        what = json.dumps([self.setting("bootstrap.servers"), self.subscribe, self.subscribe_pattern, self.assign])
        return f"{self.group_id_prefix}-{hashlib.sha256(what.encode()).hexdigest()[:16]}"
