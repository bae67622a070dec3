"""Options of ``backend=pulsar``, reads and writes (names follow StreamNative's pulsar-spark connector where
it has one)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import PositiveInt, PrivateAttr, ValidationInfo, field_validator, model_validator

from cdc.formats.debezium import DEFAULT_PLACEHOLDER, placeholder_octets
from cdc.options import BackendOptions, Field, SecretStr

ValueFormat = Literal["bytes", "json", "avro", "debezium"]
OnMalformed = Literal["fail", "quarantine"]
OnTruncate = Literal["fail", "apply"]
ReaderTopic = Literal["auto", "parent", "partition"]
Compression = Literal["none", "lz4", "zlib", "zstd", "snappy"]


# pulsar-spark's names (and pulsar-client's keywords) for what has an option of its own here, so that
# ``pulsar.client.tlsTrustCertsFilePath`` from a pulsar-spark job keeps working; compared lower-cased, without _.
_CLIENT_ALIASES = {
    "tlstrustcertsfilepath": "tls.trustCertsFilePath",
    "tlsallowinsecureconnection": "tls.allowInsecureConnection",
    "tlshostnameverificationenable": "tls.hostnameVerification",
    "tlsvalidatehostname": "tls.hostnameVerification",
}


class ConnectionOptions(BackendOptions):
    """Where the cluster is and how to authenticate and trust it (reads and writes)."""

    passthrough: ClassVar[Mapping[str, str]] = {"pulsar.client.": "client_settings"}

    service_url: str = Field(
        alias="service.url", description="Broker URL, e.g. pulsar://localhost:6650 (pulsar+ssl://host:6651: TLS)."
    )
    auth_token: SecretStr | None = Field(
        None,
        alias="auth.token",
        description="JWT for token authentication (broker and admin API); default: $PULSAR_AUTH_TOKEN.",
    )
    oauth2_issuer_url: str | None = Field(
        None,
        alias="auth.oauth2.issuerUrl",
        description="OAuth2 client credentials (pulsar-client's AuthenticationOauth2): the issuer, whose "
        "/.well-known/openid-configuration names the token endpoint. Not with auth.token.",
    )
    oauth2_private_key: str | None = Field(
        None,
        alias="auth.oauth2.privateKey",
        description="OAuth2: the credentials file (JSON with client_id, client_secret), a path or a file:// or "
        "data: URL; it must exist where the driver and the executors run.",
    )
    oauth2_audience: str | None = Field(None, alias="auth.oauth2.audience", description="OAuth2: the audience.")
    tls_trust_certs_file_path: str | None = Field(
        None,
        alias="tls.trustCertsFilePath",
        description="PEM file of the CAs trusted for pulsar+ssl:// and https:// (default: the system's); "
        "pulsar-spark: pulsar.client.tlsTrustCertsFilePath.",
    )
    tls_allow_insecure_connection: bool = Field(
        False,
        alias="tls.allowInsecureConnection",
        description="Accept a certificate that does not verify (tests only); pulsar-spark: "
        "pulsar.client.tlsAllowInsecureConnection.",
    )
    tls_hostname_verification: bool = Field(
        True,
        alias="tls.hostnameVerification",
        description="Check that the broker's and the admin API's certificates name the host of the URL; "
        "pulsar-spark: pulsar.client.tlsHostnameVerificationEnable.",
    )
    client_settings: dict[str, Any] = Field(
        {},  # pydantic copies it per model
        alias="pulsar.client.*",
        description="pulsar.client.<name>: keyword <name> of pulsar-client's Client(...), e.g. "
        "pulsar.client.operation_timeout_seconds (camelCase works too); these win over the options above.",
    )

    @model_validator(mode="before")
    @classmethod
    def _pulsar_spark_names(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("pulsar.client.*"), Mapping):
            return data
        data, rest = dict(data), {}
        for key, value in data["pulsar.client.*"].items():
            own = _CLIENT_ALIASES.get(key.replace("_", "").lower())
            if own is None:
                rest[key] = value
            elif own in data and str(data[own]).lower() != str(value).lower():
                raise ValueError(f"options 'pulsar.client.{key}' and {own!r} disagree; give one")
            else:
                data[own] = value
        data["pulsar.client.*"] = rest
        return data

    @field_validator("client_settings", mode="before")
    @classmethod
    def _client_settings(cls, v: Any) -> Any:
        from cdc.backends.pulsar.connection import settings

        return settings("client", v) if isinstance(v, Mapping) else v

    @model_validator(mode="after")
    def _one_credential(self) -> ConnectionOptions:
        if self.auth_token and self.oauth2_issuer_url:
            raise ValueError("options 'auth.token' and 'auth.oauth2.issuerUrl' exclude each other; give one")
        oauth = {"auth.oauth2.issuerUrl": self.oauth2_issuer_url, "auth.oauth2.privateKey": self.oauth2_private_key}
        if any(oauth.values()) and not all(oauth.values()):
            missing = next(k for k, v in oauth.items() if not v)
            raise ValueError(f"option {missing!r} is required with OAuth2 (auth.oauth2.issuerUrl, auth.oauth2.privateKey)")
        if self.oauth2_audience and not self.oauth2_issuer_url:
            raise ValueError("option 'auth.oauth2.audience' needs option 'auth.oauth2.issuerUrl'")
        return self


class PulsarOptions(ConnectionOptions):
    """``spark.readStream.format("cdc").option("backend", "pulsar")...``"""

    passthrough: ClassVar[Mapping[str, str]] = {
        "pulsar.client.": "client_settings", "pulsar.reader.": "reader_settings"
    }
    # pulsar-spark's name, kept for queries written before startingTimestamp covered every backend.
    renamed: ClassVar[Mapping[str, str]] = {"startingtime": "startingTimestamp"}

    admin_url: str | None = Field(
        None,
        alias="admin.url",
        description="Admin REST URL (http://host:8080); needed for topicsPattern, and used to read "
        "valueSchema from the schema registry when that option is not given.",
    )
    topic: str | None = Field(None, alias="topic", description="One topic.")
    topics: str | None = Field(None, alias="topics", description="Comma-separated topics.")
    topics_pattern: str | None = Field(
        None,
        alias="topicsPattern",
        description="Regex over the topics of one namespace (listed through admin.url), e.g. "
        "persistent://public/default/orders-.*.",
    )
    value_format: ValueFormat = Field(
        "bytes",
        alias="valueFormat",
        description="`bytes`: the payload as `value`; `json`: decode JSON with valueSchema into columns; "
        "`avro`: decode Avro binary records (Pulsar's AVRO schema encoding) with valueSchema into columns; "
        "`debezium`: decode a Debezium JSON change envelope (also inside a Pulsar KeyValue) into the change model.",
    )
    value_schema: str | None = Field(
        None,
        alias="valueSchema",
        description="Avro record schema JSON (what Pulsar's JSON/AVRO schemas hold) for valueFormat json, "
        "avro or debezium. For json and avro it may be left out when admin.url is given: it is then read "
        "once per query from the schema registry (GET /admin/v2/schemas/<tenant>/<namespace>/<topic>/schema; "
        "every topic of the query must have the same schema, of type JSON for json and AVRO for avro). For "
        "debezium it may be left out when the envelopes carry their schema (schemas.enable=true): it is then "
        "read from the first message when the query is defined; or, with admin.url, when the registry holds the "
        "envelopes' Avro schema (Pulsar IO Debezium sources with Avro converters: KEY_VALUE with an AVRO value), "
        "from its 'after' record.",
    )
    change_keys: str | None = Field(
        None, alias="changeKeys", description="valueFormat=debezium: comma-separated primary-key columns."
    )
    on_malformed: OnMalformed = Field(
        "fail",
        alias="onMalformed",
        description="A message that cannot be decoded: `fail` the query naming it, or `quarantine` it to "
        "quarantineTopic (raw payload, properties cdc.error / cdc.topic / cdc.messageId) and go on.",
    )
    debezium_truncate: OnTruncate = Field(
        "fail",
        alias="debezium.truncate",
        description="valueFormat=debezium, a truncate (op t): `fail` the query naming the table and message, or "
        "`apply` it: it becomes a change record with _op `truncate` (its other columns mean nothing), which "
        "DeltaUpsertSink applies by emptying the table before the batch's later changes.",
    )
    debezium_transaction_topic: str | None = Field(
        None,
        alias="debezium.transactionTopic",
        description="valueFormat=debezium: Debezium's transaction topic (provide.transaction.metadata=true; "
        "`<topic.prefix>.transaction`). Batches then never end inside a source transaction, over every partition "
        "and topic of the query: a budget (maxRecordsPerTrigger) ending inside one takes the rest of it, a "
        "transaction whose END event or events have not all arrived waits. Planning then reads every message "
        "on the driver (see From Debezium for the cost).",
    )
    debezium_unavailable_value_placeholder: str = Field(
        DEFAULT_PLACEHOLDER,
        alias="debezium.unavailableValuePlaceholder",
        description="valueFormat=debezium: the connector's unavailable.value.placeholder (Debezium's default "
        f"`{DEFAULT_PLACEHOLDER}` when not given; `hex:` followed by hexadecimal octets, as Debezium reads it). "
        "A text or bytes column of a create or update holding it was not sent by the database (PostgreSQL: an "
        "unchanged TOASTed value): it becomes an unchanged column (_unchanged), taken from the event's before "
        "image when that holds it (REPLICA IDENTITY FULL), never a value.",
    )
    quarantine_topic: str | None = Field(
        None, alias="quarantineTopic", description="Where onMalformed=quarantine sends undecodable messages."
    )
    poll_timeout_ms: PositiveInt = Field(
        120_000,
        alias="pollTimeoutMs",
        description="A read that gets no message for this long while the planned end is not reached fails "
        "with a stall error.",
    )
    reopen_after_ms: PositiveInt = Field(
        10_000,
        alias="reopenAfterMs",
        description="A read that gets no message for this long short of its planned end reopens its Reader "
        "after the last message delivered (new Reader, not seek): a guard against a broker that stops "
        "dispatching to a reader (pulsar-lite does).",
    )
    catch_up_ms: PositiveInt = Field(
        200,
        alias="catchUpMs",
        description="Planning with a record budget (or on a broker that does not answer a partition's last "
        "message id): when the broker cannot confirm the head, how long the driver waits for more messages "
        "before taking what it has seen as the head of each partition (4x that right after new messages).",
    )
    receiver_queue_size: PositiveInt = Field(
        1000,
        alias="receiverQueueSize",
        description="Reader prefetch (messages; pulsar-client's default). Memory is about receiverQueueSize x "
        "message size per reader. On pulsar-lite, 20000 avoids most of its redeliveries (duplicates are "
        "dropped by id either way).",
    )
    reader_topic: ReaderTopic = Field(
        "auto",
        alias="reader.topic",
        description="`auto` (default): `partition` when the broker serves each partition as a topic of its own "
        "(Apache Pulsar always; detected once per query through the binary protocol's partition metadata), "
        "else `parent`. `partition`: each executor reads its partition as the topic `<topic>-partition-N`, and "
        "a batch without a record budget ends at each partition's last message id (getLastMessageId: through "
        "admin.url, else through the consumer of the query's durable subscription on that partition, which the "
        "driver keeps open), so the driver reads no message. `parent` (for pulsar-lite's auto-created "
        "partitioned topics): executors read the partitioned topic and drop other partitions' messages, and "
        "the driver reads every message id to end batches.",
    )
    subscription_name: str | None = Field(
        None,
        alias="subscription.name",
        description="Durable subscription advanced on each commit; default: cdc-<hash of url and topics>. "
        "Give each query its own name.",
    )
    acknowledge: bool = Field(True, alias="acknowledge", description="Advance the subscription on commit.")
    operation_timeout_s: PositiveInt = Field(
        30,
        alias="operationTimeoutSeconds",
        description="Seconds pulsar-client waits for a broker operation (lookups, creating readers and consumers); "
        "a broker refusing credentials shows up as this timeout.",
    )
    reader_settings: dict[str, Any] = Field(
        {},  # pydantic copies it per model
        alias="pulsar.reader.*",
        description="pulsar.reader.<name>: keyword <name> of pulsar-client's create_reader(...) for the executors' "
        "readers, e.g. pulsar.reader.receiver_queue_size (wins over receiverQueueSize).",
    )

    @field_validator("reader_settings", mode="before")
    @classmethod
    def _reader_settings(cls, v: Any) -> Any:
        from cdc.backends.pulsar.connection import settings

        return settings("reader", v) if isinstance(v, Mapping) else v

    # Set by the backend when valueFormat=debezium read valueSchema from the topic's first envelope: the
    # executors then check every envelope's schema against it. Not an option.
    _schema_from_events: bool = PrivateAttr(False)
    # Set by the backend when the schema registry says the Debezium envelopes are Avro (their schema). Not
    # an option.
    _envelope_avro: str | None = PrivateAttr(None)

    @property
    def schema_from_events(self) -> bool:
        return self._schema_from_events

    @property
    def envelope_avro(self) -> str | None:
        return self._envelope_avro

    @model_validator(mode="after")
    def _check(self) -> PulsarOptions:
        given = [n for n, v in (("topic", self.topic), ("topics", self.topics), ("topicsPattern", self.topics_pattern)) if v]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of options 'topic', 'topics', 'topicsPattern' is required (got {given or 'none'})"
            )
        if self.topics_pattern and not self.admin_url:
            raise ValueError("option 'topicsPattern' needs option 'admin.url' (topics are listed via the admin API)")
        if self.value_format in ("json", "avro") and not self.value_schema and not self.admin_url:
            raise ValueError(
                f"option 'valueSchema' is required with valueFormat={self.value_format} "
                "(or give option 'admin.url' to read it from the topic's schema in the schema registry)"
            )
        if self.value_format == "debezium" and not self.change_keys:
            raise ValueError("option 'changeKeys' is required with valueFormat=debezium")
        if self.value_schema:
            try:
                json.loads(self.value_schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"option 'valueSchema' is not JSON: {exc}") from None
        if self.on_malformed == "quarantine" and not self.quarantine_topic:
            raise ValueError("option 'quarantineTopic' is required with onMalformed=quarantine")
        return self

    @field_validator("debezium_unavailable_value_placeholder")
    @classmethod
    def _placeholder(cls, v: str) -> str:
        try:
            octets = placeholder_octets(v)
        except ValueError:
            raise ValueError(f"accepted values: text, or hex: followed by hexadecimal octets; got {v!r}") from None
        if not octets:
            raise ValueError("accepted values: a non-empty text, or hex: followed by hexadecimal octets; got an empty one")
        return v

    @field_validator("debezium_transaction_topic")
    @classmethod
    def _transaction_topic(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        if info.data.get("value_format") != "debezium":
            raise ValueError(f"needs valueFormat=debezium (got valueFormat={info.data.get('value_format')})")
        if not v:
            raise ValueError("accepted values: a topic name (<name>, <tenant>/<namespace>/<name> or "
                             "persistent://...), Debezium's <topic.prefix>.transaction; got an empty one")
        full = normalize_topic(v)
        read = info.data.get("topic") or info.data.get("topics") or ""
        if full in [normalize_topic(t) for t in read.split(",") if t.strip()]:
            raise ValueError("is one of the topics the query reads; accepted values: Debezium's transaction topic "
                             "(<topic.prefix>.transaction), not a data topic")
        return full

    def topic_list(self) -> list[str]:
        raw = self.topic or self.topics or ""
        return [normalize_topic(t) for t in raw.split(",") if t.strip()]

    def default_subscription(self) -> str:
        what = json.dumps([self.service_url, sorted(self.topic_list()), self.topics_pattern])
        return "cdc-" + hashlib.sha256(what.encode()).hexdigest()[:16]

    def subscription(self) -> str:
        return self.subscription_name or self.default_subscription()


class PulsarSinkOptions(ConnectionOptions):
    """Writes: ``df.write.format("cdc").option("backend", "pulsar")...`` (or format ``cdc-pulsar``)."""

    scope: ClassVar[str] = "write"

    topic: str | None = Field(None, alias="topic", description="Target topic when the rows have no topic column.")
    admin_url: str | None = Field(
        None,
        alias="admin.url",
        description="Admin REST URL (http://host:8080), optional: a broker refuses a wrong credential with a "
        "timeout, and the admin API's answer then makes the error name the credential option for certain.",
    )
    value_format: Literal["bytes", "json"] = Field(
        "bytes",
        alias="valueFormat",
        description="`bytes`: the `value` column (binary or string) is the payload; `json`: the columns other than "
        "topic, key, properties and event time, as one JSON object.",
    )
    max_message_size: PositiveInt = Field(
        5 * 1024 * 1024,
        alias="maxMessageSize",
        description="The broker's limit (Pulsar's default 5 MiB); a larger payload fails naming the row's key.",
    )
    batching: bool = Field(True, alias="producer.batching", description="Group messages into batches.")
    batching_max_messages: PositiveInt = Field(
        1000, alias="producer.batchingMaxMessages", description="Most messages in one batch."
    )
    batching_max_delay_ms: PositiveInt = Field(
        10, alias="producer.batchingMaxPublishDelayMs", description="Longest a message waits for its batch to fill."
    )
    compression: Compression = Field("none", alias="producer.compression", description="Compression of batches.")
    max_pending: PositiveInt = Field(
        10_000,
        alias="producer.maxPendingMessages",
        description="Messages sent but not yet acknowledged by the broker, at most; the writer waits beyond it.",
    )
    send_timeout_ms: PositiveInt = Field(
        30_000,
        alias="producer.sendTimeoutMs",
        description="A message the broker has not acknowledged after this long fails the write (SendError).",
    )
    operation_timeout_s: PositiveInt = Field(
        30, alias="operationTimeoutSeconds", description="Seconds pulsar-client waits for a broker operation."
    )
    checkpoint_location: str | None = Field(None, alias="checkpointLocation", description="Spark's; ignored.")
    path: str | None = Field(None, alias="path", description="Same as topic (df.write...save(topic)).")

    @model_validator(mode="after")
    def _topic_from_path(self) -> PulsarSinkOptions:
        if self.topic is None and self.path:
            object.__setattr__(self, "topic", self.path)
        return self


def normalize_topic(name: str) -> str:
    """``orders`` -> ``persistent://public/default/orders`` (Pulsar's short-name rule)."""
    t = name.strip()
    if "://" in t:
        return t
    parts = t.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{t}"
    if len(parts) == 3:
        return f"persistent://{t}"
    raise ValueError(f"topic {name!r}: expected <name>, <tenant>/<namespace>/<name> or a full persistent:// name")

