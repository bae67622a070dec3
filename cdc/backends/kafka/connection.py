"""Connecting to Kafka with confluent-kafka (librdkafka): consumers, the admin client, and what the driver asks of
the cluster (topics, partitions, offsets).

Every client takes the query's ``kafka.*`` settings; librdkafka's own log goes to Python's ``logging`` (logger
``cdc.backends.kafka.librdkafka``), never to stderr. A setting librdkafka does not know fails with an
:class:`~cdc.errors.OptionError` naming it. Clients are created where they are used: the driver keeps one
consumer and one admin client; each executor's range reader opens its own consumer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from cdc.backends.kafka.options import KafkaOptions
from cdc.backends.kafka.positions import Partition
from cdc.errors import BackendUnavailableError, OptionError, requires_extra

if TYPE_CHECKING:
    import confluent_kafka
    from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)
client_log = logging.getLogger("cdc.backends.kafka.librdkafka")

__all__ = ["Cluster", "admin_client", "client_config", "consumer"]


def client_config(options: KafkaOptions, **own: Any) -> dict[str, Any]:
    """librdkafka's configuration: ``own`` settings first, the query's ``kafka.*`` settings win over them;
    secrets unwrapped here only, for the client."""
    config: dict[str, Any] = {"logger": client_log, "client.id": "cdc-tunnel", **own}
    for key, value in options.client_settings.items():
        config[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
    return config


def _check_config(exc: Exception) -> None:
    """A configuration librdkafka refuses, as an error naming the option (never its value: it may be secret)."""
    text = str(exc)
    m = re.search(r'(?:property|Property)[ "]+([\w.]+)', text) or re.search(r'"([\w.]+)"', text)
    name = f"kafka.{m.group(1)}" if m else "kafka.*"
    raise OptionError(f"option {name!r}: librdkafka refuses the client configuration: {_without_values(text)}",
                      name) from None


def _without_values(text: str) -> str:
    return re.sub(r"(value|Value)\s*\"[^\"]*\"", r"\1 <hidden>", text)[:300]


def consumer(options: KafkaOptions, **own: Any) -> confluent_kafka.Consumer:
    """A consumer that never commits by itself and never joins a group unless asked (``group.id`` is set all
    the same: librdkafka wants one)."""
    with requires_extra("kafka", "backend 'kafka'"):
        import confluent_kafka

    settings = {
        "group.id": options.group_id(),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
        **own,
    }
    try:
        return confluent_kafka.Consumer(client_config(options, **settings))
    except (confluent_kafka.KafkaException, ValueError, TypeError) as exc:
        _check_config(exc)
        raise  # pragma: no cover - _check_config raises


def admin_client(options: KafkaOptions) -> AdminClient:
    with requires_extra("kafka", "backend 'kafka'"):
        import confluent_kafka
        from confluent_kafka.admin import AdminClient

    # The admin client takes no consumer settings: pass only what connects and authenticates.
    consumer_only = {"isolation.level", "group.id", "fetch.min.bytes", "fetch.max.bytes", "fetch.wait.max.ms",
                     "max.partition.fetch.bytes", "queued.min.messages", "queued.max.messages.kbytes",
                     "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "group.instance.id",
                     "partition.assignment.strategy", "check.crcs", "enable.partition.eof", "auto.offset.reset",
                     "fetch.queue.backoff.ms", "group.protocol", "group.remote.assignor", "fetch.error.backoff.ms"}
    config = {k: v for k, v in client_config(options).items() if k not in consumer_only}
    try:
        return AdminClient(config)
    except (confluent_kafka.KafkaException, ValueError, TypeError) as exc:
        _check_config(exc)
        raise  # pragma: no cover


def refused(error: Any) -> None:
    """A broker that refused the client's credentials or certificate (``error``: a KafkaError, as the client's
    error callback reports it): an :class:`OptionError` naming the options to fix (librdkafka's text names
    neither the password nor the key)."""
    if error is None:
        return
    name = getattr(error, "name", lambda: "")()
    text = getattr(error, "str", lambda: str(error))()
    if name in ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "TOPIC_AUTHORIZATION_FAILED",
                "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"):
        raise OptionError(f"options 'kafka.sasl.username'/'kafka.sasl.password' (and kafka.sasl.mechanism): the "
                          f"broker refused them: {_without_values(text)}", "kafka.sasl.password") from None
    if name == "_SSL":
        raise OptionError(f"option 'kafka.ssl.ca.location': the TLS handshake failed: {_without_values(text)}",
                          "kafka.ssl.ca.location") from None


_PASSING = frozenset(("_UNKNOWN_PARTITION", "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "_NOENT",
                      "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "_TRANSPORT", "_ALL_BROKERS_DOWN",
                      "UNKNOWN_TOPIC_OR_PART"))
"""Answers that pass with fresh metadata: a partition the client's metadata does not know yet (added a moment
ago), a partition whose leader is moving or being elected (``_NOENT``: "no leaders found", right after a topic
is created or a broker restarts), leader epochs the restarted broker and the client's metadata disagree on, a
broker that is not reachable yet."""


def _passing(exc: BaseException) -> bool:
    error = exc.args[0] if exc.args else None
    return getattr(error, "name", lambda: "")() in _PASSING or bool(getattr(error, "retriable", lambda: False)())


#: librdkafka's codes for a cluster it cannot reach (yet): asked again until the metadata timeout.
_UNREACHABLE = frozenset({-195, -187})  # KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN


def _unavailable(what: str, exc: object, options: KafkaOptions) -> BackendUnavailableError:
    return BackendUnavailableError(f"{what} from {options.setting('bootstrap.servers')}: {exc}")


class Cluster:
    """What the driver asks of the cluster, through one consumer and one admin client kept for the query."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self.timeout_s = options.metadata_timeout_ms / 1000
        self._consumer: Any = None
        self._admin: AdminClient | None = None
        self.refusal: Any = None

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = consumer(self.options, error_cb=self._note)
        return self._consumer

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = admin_client(self.options)
        return self._admin

    def metadata(self, topic: str | None = None) -> Any:
        """The cluster's metadata (of ``topic``), waited for up to ``metadataTimeoutMs``: a broker that cannot be
        reached yet (restarting: the client reports a transport failure at once) is asked again meanwhile."""
        import confluent_kafka

        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self.consumer.list_topics(topic, timeout=max(deadline - time.monotonic(), 0.1))
            except confluent_kafka.KafkaException as exc:
                self.consumer.poll(0)  # serves the client's error callbacks (_note)
                refused(self.refusal)  # what the broker said, when it refused the credentials or the certificate
                error: Any = exc.args[0] if exc.args else None
                code = error.code() if hasattr(error, "code") else None
                if code in _UNREACHABLE and time.monotonic() < deadline - 1:
                    log.info("listing topics from %s: %s; asking again", self.options.setting("bootstrap.servers"),
                             error)
                    time.sleep(1)
                    continue
                raise _unavailable("listing topics", exc, self.options) from None

    def _note(self, error: Any) -> None:
        """The client's error callback: keeps the last refusal (authentication, TLS) for :meth:`metadata`."""
        if getattr(error, "name", lambda: "")() in ("_AUTHENTICATION", "_SSL", "SASL_AUTHENTICATION_FAILED"):
            self.refusal = error

    def partitions(self) -> list[Partition]:
        """The query's partitions now: ``subscribe``'s topics, ``subscribePattern``'s matches, or ``assign``'s."""
        options = self.options
        if options.assign:
            return [Partition(t, p) for t, ps in options.assignment().items() for p in ps]
        if options.subscribe_pattern:
            pattern = re.compile(options.subscribe_pattern)
            meta = self.metadata()
            topics = sorted(t for t in meta.topics if pattern.fullmatch(t) and not t.startswith("__"))
            return [Partition(t, p) for t in topics for p in sorted(meta.topics[t].partitions)]
        out = []
        for topic in options.topic_list():
            meta = self.metadata(topic)
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                if info is not None and info.error.code() == 3:  # UNKNOWN_TOPIC_OR_PART
                    raise OptionError(f"option 'subscribe': topic {topic!r} does not exist on "
                                      f"{options.setting('bootstrap.servers')}", "subscribe")
                raise _unavailable(f"the metadata of topic {topic!r}", info.error if info else "no answer", options)
            out += [Partition(topic, p) for p in sorted(info.partitions)]
        return out

    def watermarks(self, partitions: Sequence[Partition]) -> dict[Partition, tuple[int, int]]:
        """(log start offset, head) per partition: the head is the last stable offset under ``read_committed``
        (no record of an open transaction is readable before it), the high watermark otherwise."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}
        try:
            spec: Any = OffsetSpec  # its constructors carry no annotations
            low = self._list_offsets(partitions, spec.earliest(), self._level())
            high = self._list_offsets(partitions, spec.latest(), self._level())
        except KafkaException as exc:
            raise _unavailable("listing offsets", exc, self.options) from None
        return {p: (low[p], high[p]) for p in partitions}

    def _list_offsets(self, partitions: Iterable[Partition], spec: Any, level: Any) -> dict[Partition, int]:
        from confluent_kafka import KafkaException, TopicPartition

        request = {TopicPartition(p.topic, p.partition): spec for p in partitions}
        for attempt in Retrying(stop=stop_after_delay(self.timeout_s), wait=wait_exponential(0.2, max=2),
                                reraise=True, retry=retry_if_exception(_passing)):
            with attempt:
                try:
                    futures = self.admin.list_offsets(request, isolation_level=level, request_timeout=self.timeout_s)
                    return {Partition(tp.topic, tp.partition): f.result(timeout=self.timeout_s).offset
                            for tp, f in futures.items()}
                except KafkaException as exc:
                    if _passing(exc):
                        self._admin = None  # the client's metadata is behind the cluster: ask with a new one
                        log.debug("listing offsets: %s; asking again with fresh metadata", exc)
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def offsets_for_time(self, partitions: Sequence[Partition], when_ms: int) -> dict[Partition, int | None]:
        """Per partition, the offset of its first record with a timestamp at or after ``when_ms`` (``None``:
        none is)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import OffsetSpec

        try:
            spec: Any = OffsetSpec
            found = self._list_offsets(partitions, spec.for_timestamp(when_ms), self._level())
        except KafkaException as exc:
            raise _unavailable("finding offsets by time", exc, self.options) from None
        return {p: (o if o >= 0 else None) for p, o in found.items()}

    def _level(self) -> Any:
        from confluent_kafka import IsolationLevel

        return IsolationLevel.READ_COMMITTED if self.options.read_committed else IsolationLevel.READ_UNCOMMITTED

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) to the query's consumer group."""
        from confluent_kafka import TopicPartition

        if offsets:
            self.consumer.commit(offsets=[TopicPartition(p.topic, p.partition, o) for p, o in offsets.items()],
                                 asynchronous=False)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None
