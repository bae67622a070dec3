"""The Pulsar client: connections, and a topic's partitions as channels.

Never create a client before a fork: pulsar-client's C++ core is not fork-safe. The driver, each executor's
range reader and each writer task open their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cdc.errors import BackendUnavailableError

if TYPE_CHECKING:
    import pulsar
    from pydantic import SecretStr

_PARTITION_SUFFIX = "-partition-"


class ClientOptions(Protocol):
    """What a connection needs of the read or the write options."""

    @property
    def service_url(self) -> str: ...

    @property
    def auth_token(self) -> SecretStr | None: ...

    @property
    def operation_timeout_s(self) -> int: ...


def open_client(service_url: str, token: str | None = None, operation_timeout_s: int = 30) -> pulsar.Client:
    """A new client. Never create one before a fork: pulsar-client's C++ core is not fork-safe."""
    import pulsar

    kwargs: dict[str, Any] = {
        "operation_timeout_seconds": operation_timeout_s,
        "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    }
    if token:
        kwargs["authentication"] = pulsar.AuthenticationToken(token)
    try:
        return pulsar.Client(service_url, **kwargs)
    except Exception as exc:
        raise BackendUnavailableError(f"cannot create a Pulsar client for {service_url}: {exc}") from exc


ENV_AUTH_TOKEN = "PULSAR_AUTH_TOKEN"


def token_of(options: ClientOptions) -> str | None:
    """The token in clear, for the client only (options keep it as a secret that never prints): the
    ``auth.token`` option, else the ``PULSAR_AUTH_TOKEN`` environment variable (the way to keep it out of
    the query's code and of py4j's debug log)."""
    if options.auth_token:
        return options.auth_token.get_secret_value()
    return os.environ.get(ENV_AUTH_TOKEN) or None


def connect(options: ClientOptions) -> pulsar.Client:
    """A new client for the options' broker and credentials."""
    return open_client(options.service_url, token_of(options), options.operation_timeout_s)


@dataclass(frozen=True)
class Channel:
    """A topic partition (``partition = -1`` for a non-partitioned topic)."""

    topic: str  # the parent topic
    partition: int

    @property
    def id(self) -> str:
        return self.topic if self.partition < 0 else f"{self.topic}{_PARTITION_SUFFIX}{self.partition}"

    @staticmethod
    def parse(channel_id: str) -> Channel:
        head, sep, tail = channel_id.rpartition(_PARTITION_SUFFIX)
        if sep and tail.isdigit():
            return Channel(head, int(tail))
        return Channel(channel_id, -1)


def partitions_of(client: pulsar.Client, topic: str) -> list[Channel]:
    names = client.get_topic_partitions(topic)
    if len(names) == 1 and names[0] == topic:
        return [Channel(topic, -1)]
    return sorted((Channel.parse(n) for n in names), key=lambda c: c.partition)
