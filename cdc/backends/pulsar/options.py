"""Options of ``backend=pulsar``, reads and writes (names follow StreamNative's pulsar-spark connector where
it has one)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Literal

from pydantic import PositiveInt, PrivateAttr, field_validator, model_validator

from cdc.options import BackendOptions, Field, SecretStr

ValueFormat = Literal["bytes", "json", "avro", "debezium"]
OnMalformed = Literal["fail", "quarantine"]
ReaderTopic = Literal["parent", "partition"]
Compression = Literal["none", "lz4", "zlib", "zstd", "snappy"]


class PulsarOptions(BackendOptions):
    """``spark.readStream.format("cdc").option("backend", "pulsar")...``"""

    service_url: str = Field(alias="service.url", description="Broker URL, e.g. pulsar://localhost:6650.")
    admin_url: str | None = Field(
        None,
        alias="admin.url",
        description="Admin REST URL (http://host:8080); needed for topicsPattern, and used to read "
        "valueSchema from the schema registry when that option is not given.",
    )
    auth_token: SecretStr | None = Field(
        None,
        alias="auth.token",
        description="JWT for token authentication (broker and admin API); default: $PULSAR_AUTH_TOKEN.",
    )
    topic: str | None = Field(None, alias="topic", description="One topic.")
    topics: str | None = Field(None, alias="topics", description="Comma-separated topics.")
    topics_pattern: str | None = Field(
        None,
        alias="topicsPattern",
        description="Regex over the topics of one namespace (listed through admin.url), e.g. "
        "persistent://public/default/orders-.*.",
    )
    starting_time: str | None = Field(
        None,
        alias="startingTime",
        description="Publish-time start: epoch milliseconds or an ISO-8601 time with zone. Messages "
        "published earlier are not part of the query (as if beyond retention).",
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
        500,
        alias="reopenAfterMs",
        description="A read that gets no message for this long short of its planned end reopens its Reader "
        "after the last message delivered (new Reader, not seek).",
    )
    catch_up_ms: PositiveInt = Field(
        200,
        alias="catchUpMs",
        description="Planning: when the broker cannot confirm the head (a partition without messages yet, "
        "or right after a stalled reader was replaced), how long the driver waits for more messages "
        "before taking what it has seen as the head of each partition (4x that right after new messages).",
    )
    receiver_queue_size: PositiveInt = Field(
        20_000,
        alias="receiverQueueSize",
        description="Reader prefetch (messages). On pulsar-lite, 20000 read 300k messages without a "
        "redelivery or stall in every run we measured, while 1000 made the broker redeliver up to 5x and "
        "30000+ stalled more often; duplicates are dropped by id either way. Lower it for large messages "
        "(memory is about receiverQueueSize x message size per reader).",
    )
    reader_topic: ReaderTopic = Field(
        "parent",
        alias="reader.topic",
        description="`partition` (recommended on Apache Pulsar): each executor reads its partition as the topic "
        "`<topic>-partition-N`, and a batch without a record budget ends at each partition's last message id "
        "(getLastMessageId: through admin.url, else a short-lived subscription), so the driver reads no message; "
        "needs a broker that serves partitions as topics (Pulsar; pulsar-lite when it auto-creates "
        "non-partitioned topics). `parent` (default; any broker): executors read the partitioned topic and drop "
        "other partitions' messages, and the driver reads every message id to end batches.",
    )
    subscription_name: str | None = Field(
        None,
        alias="subscription.name",
        description="Durable subscription advanced on each commit; default: cdc-<hash of url and topics>. "
        "Give each query its own name.",
    )
    acknowledge: bool = Field(True, alias="acknowledge", description="Advance the subscription on commit.")
    operation_timeout_s: PositiveInt = Field(30, alias="operationTimeoutSeconds")
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

    @field_validator("starting_time")
    @classmethod
    def _check_time(cls, v: str | None) -> str | None:
        if v is not None:
            parse_time_ms(v)
        return v

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

    @property
    def starting_time_ms(self) -> int | None:
        return None if self.starting_time is None else parse_time_ms(self.starting_time)

    def topic_list(self) -> list[str]:
        raw = self.topic or self.topics or ""
        return [normalize_topic(t) for t in raw.split(",") if t.strip()]

    def default_subscription(self) -> str:
        what = json.dumps([self.service_url, sorted(self.topic_list()), self.topics_pattern])
        return "cdc-" + hashlib.sha256(what.encode()).hexdigest()[:16]

    def subscription(self) -> str:
        return self.subscription_name or self.default_subscription()


class PulsarSinkOptions(BackendOptions):
    """Writes: ``df.write.format("cdc").option("backend", "pulsar")...`` (or format ``cdc-pulsar``)."""

    service_url: str = Field(alias="service.url")
    auth_token: SecretStr | None = Field(None, alias="auth.token")
    topic: str | None = Field(None, alias="topic", description="Target topic when the rows have no topic column.")
    value_format: Literal["bytes", "json"] = Field("bytes", alias="valueFormat")
    max_message_size: PositiveInt = Field(
        5 * 1024 * 1024,
        alias="maxMessageSize",
        description="The broker's limit (Pulsar's default 5 MiB); a larger payload fails naming the row's key.",
    )
    batching: bool = Field(True, alias="producer.batching")
    batching_max_messages: PositiveInt = Field(1000, alias="producer.batchingMaxMessages")
    batching_max_delay_ms: PositiveInt = Field(10, alias="producer.batchingMaxPublishDelayMs")
    compression: Compression = Field("none", alias="producer.compression")
    max_pending: PositiveInt = Field(10_000, alias="producer.maxPendingMessages")
    send_timeout_ms: PositiveInt = Field(30_000, alias="producer.sendTimeoutMs")
    operation_timeout_s: PositiveInt = Field(30, alias="operationTimeoutSeconds")
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


def parse_time_ms(value: str) -> int:
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"expected epoch milliseconds or an ISO-8601 time with a zone, got {value!r}"
        ) from None
    if t.tzinfo is None:
        raise ValueError(f"time {value!r} has no zone; add one (e.g. 2026-01-01T00:00:00Z)")
    return int(t.astimezone(UTC).timestamp() * 1000)
