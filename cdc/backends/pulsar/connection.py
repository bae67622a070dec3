"""The Pulsar client: connections, and a topic's partitions as channels.

Never create a client before a fork: pulsar-client's C++ core is not fork-safe. The driver, each executor's
range reader and each writer task open their own.
"""

from __future__ import annotations

import functools
import inspect
import logging
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from cdc.backends.pulsar.auth import (
    ENV_AUTH_TOKEN,
    SecurityOptions,
    authentication,
    credential_option,
    ssl_context,
    token_of,
)
from cdc.errors import BackendUnavailableError, OptionError, requires_extra

if TYPE_CHECKING:
    import pulsar

    from cdc.backends.pulsar.admin import AdminClient

__all__ = ["ENV_AUTH_TOKEN", "Channel", "ClientOptions", "connect", "open_client", "partitions_of", "token_of"]

log = logging.getLogger(__name__)

_PARTITION_SUFFIX = "-partition-"


class ClientOptions(SecurityOptions, Protocol):
    """What a connection needs of the read or the write options."""

    @property
    def operation_timeout_s(self) -> int: ...

    @property
    def client_settings(self) -> Mapping[str, Any]: ...


def open_client(
    service_url: str, token: str | None = None, operation_timeout_s: int = 30, **settings: Any
) -> pulsar.Client:
    """A new client. Never create one before a fork: pulsar-client's C++ core is not fork-safe."""
    with requires_extra("pulsar", "backend 'pulsar'"):
        import pulsar

    kwargs: dict[str, Any] = {
        "operation_timeout_seconds": operation_timeout_s,
        "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    }
    if token:
        kwargs["authentication"] = pulsar.AuthenticationToken(token)
    kwargs.update(settings)
    try:
        return pulsar.Client(service_url, **kwargs)
    except Exception as exc:
        raise BackendUnavailableError(f"cannot create a Pulsar client for {service_url}: {exc}") from exc


def connect(options: ClientOptions) -> pulsar.Client:
    """A new client for the options' broker, credentials, TLS rules and ``pulsar.client.*`` settings (these
    last win over the backend's own, e.g. ``operation_timeout_seconds``)."""
    settings: dict[str, Any] = {
        "tls_trust_certs_file_path": options.tls_trust_certs_file_path,
        "tls_allow_insecure_connection": options.tls_allow_insecure_connection,
        "tls_validate_hostname": options.tls_hostname_verification,
    }
    auth = authentication(options)
    if auth is not None:
        settings["authentication"] = auth
    settings.update(options.client_settings)
    return open_client(options.service_url, None, options.operation_timeout_s, **settings)


def admin_client(options: ClientOptions, url: str) -> AdminClient:
    """The admin REST client with the same credentials and TLS rules as the binary client."""
    from cdc.backends.pulsar.admin import AdminClient
    from cdc.backends.pulsar.auth import OAuth2Tokens

    context = ssl_context(options) if url.lower().startswith("https:") else None
    if options.oauth2_issuer_url and options.oauth2_private_key:
        tokens = OAuth2Tokens(
            options.oauth2_issuer_url, options.oauth2_private_key, options.oauth2_audience,
            ssl_context(options),
        )
        return AdminClient(url, bearer=tokens.token, ssl_context=context, credential=credential_option(options))
    return AdminClient(url, token_of(options), ssl_context=context, credential=credential_option(options))


# Keywords of pulsar.Client(...) and Client.create_reader(...) that the pass-through does not take: objects
# rather than settings, the backend's own positioning, or settings that have an option of their own (which
# the admin API's TLS also follows).
_NOT_SETTINGS = {
    "client": {
        "self": "", "service_url": "service.url", "authentication": "auth.token or auth.oauth2.*", "logger": "",
        "tls_trust_certs_file_path": "tls.trustCertsFilePath",
        "tls_allow_insecure_connection": "tls.allowInsecureConnection",
        "tls_validate_hostname": "tls.hostnameVerification",
    },
    "reader": {
        "self": "", "topic": "topic", "start_message_id": "startingOffsets", "schema": "valueFormat",
        "reader_listener": "", "crypto_key_reader": "", "crypto_failure_action": "",
        "start_message_id_inclusive": "",
    },
}

Kind = Literal["client", "reader"]


@functools.cache
def _parameters(kind: Kind) -> dict[str, inspect.Parameter]:
    import pulsar

    function = pulsar.Client.__init__ if kind == "client" else pulsar.Client.create_reader
    return {n: p for n, p in inspect.signature(function).parameters.items() if n not in _NOT_SETTINGS[kind]}


def _squash(name: str) -> str:
    """Spark lower-cases option names: ``operationTimeoutSeconds`` and ``operation_timeout_seconds`` match."""
    return name.replace("_", "").replace("-", "").lower()


def _convert(option: str, parameter: inspect.Parameter, value: Any) -> Any:
    default = parameter.default
    text = str(value).strip()
    if isinstance(default, bool) or isinstance(value, bool):
        if isinstance(value, bool):
            return value
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ValueError(f"option {option!r}: expected true or false, got {text!r}")
    if isinstance(default, int | float) and not isinstance(value, int | float):
        try:
            return type(default)(text)
        except ValueError:
            raise ValueError(f"option {option!r}: expected {type(default).__name__}, got {text!r}") from None
    return value if isinstance(value, int | float) else text


def settings(kind: Kind, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``pulsar.<kind>.*`` options as keyword arguments of ``pulsar.Client(...)`` (``client``) or
    ``create_reader(...)`` (``reader``), checked against pulsar-client's own signature and typed by its
    defaults. An unknown name is an error naming it and the accepted names."""
    parameters = _parameters(kind)
    by_squashed = {_squash(n): n for n in parameters}
    reserved = {_squash(n): alt for n, alt in _NOT_SETTINGS[kind].items()}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        option = f"pulsar.{kind}.{key}"
        name = by_squashed.get(_squash(key))
        if name is None:
            if reserved.get(_squash(key)):
                raise ValueError(f"option {option!r}: set it with option {reserved[_squash(key)]!r} instead")
            raise ValueError(
                f"unknown option {option!r}: pulsar-client's "
                f"{'Client()' if kind == 'client' else 'create_reader()'} takes: {', '.join(sorted(parameters))}"
            )
        out[name] = _convert(option, parameters[name], value)
    return out


def reader_settings(options: Any, **ours: Any) -> dict[str, Any]:
    """Keyword arguments of ``create_reader``: the backend's, then ``pulsar.reader.*`` over them."""
    return {**ours, **getattr(options, "reader_settings", {})}


def refusal(exc: Exception, options: ClientOptions, what: str) -> Exception:
    """The error to raise for a failed call to the broker: a clear :class:`OptionError` naming the credential
    option when the broker refused the credential, else a transient error.

    Pulsar answers a wrong or missing credential by closing the connection, which pulsar-client retries
    until ``operationTimeoutSeconds`` and then reports as a timeout, like a broker that is down. When
    ``admin.url`` is known, the same credential is tried there, whose 401 is unambiguous; otherwise the
    message says what to check when the broker's port accepts connections."""
    import pulsar

    option = credential_option(options)
    if isinstance(exc, pulsar.AuthorizationError):
        return OptionError(
            f"option {option!r}: the broker at {options.service_url} accepted the credential, but its role "
            f"may not {what}: grant it consume/produce on the namespace",
            option.split(" ")[0],
        )
    if isinstance(exc, pulsar.AuthenticationError):
        return OptionError(
            f"option {option!r}: the broker at {options.service_url} refused the credential", option.split(" ")[0]
        )
    if isinstance(exc, pulsar.Timeout | pulsar.ConnectError):
        admin_url = getattr(options, "admin_url", None)
        if admin_url:
            try:
                admin_client(options, admin_url).get("/admin/v2/clusters")
            except OptionError as refused:
                return refused
            except BackendUnavailableError:
                pass
            else:  # the credential is good: a slow or restarting broker, not a refusal
                return BackendUnavailableError(f"cannot {what} on {options.service_url}: {exc}")
        if _port_open(options.service_url):
            timeout = options.client_settings.get("operation_timeout_seconds", options.operation_timeout_s)
            given = " (no credential was given)" if option == "auth.token" and not token_of(options) else ""
            tls = ""
            if options.service_url.lower().startswith("pulsar+ssl:"):
                tls = (", and options 'tls.trustCertsFilePath' and 'tls.hostnameVerification' (a certificate that "
                       "does not verify fails the same way)")
            return BackendUnavailableError(
                f"cannot {what} on {options.service_url}: {exc}. The broker accepts connections but did not "
                f"answer within {timeout} s; a broker with authentication refuses a wrong or "
                f"missing credential this way: check option {option!r}{given}{tls}"
            )
    return BackendUnavailableError(f"cannot {what} on {options.service_url}: {exc}")


def _port_open(service_url: str) -> bool:
    first = service_url.split(",")[0]
    parsed = urllib.parse.urlparse(first)
    try:
        with socket.create_connection((parsed.hostname or "localhost", parsed.port or 6650), timeout=2):
            return True
    except OSError:
        return False


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


def partitions_of(client: pulsar.Client, topic: str, options: ClientOptions | None = None) -> list[Channel]:
    """The topic's partitions; with ``options``, a refused credential fails naming its option."""
    try:
        names = client.get_topic_partitions(topic)
    except Exception as exc:  # the C++ core raises its own exception types
        if options is None:
            raise
        raise refusal(exc, options, f"look up topic {topic}") from None
    if len(names) == 1 and names[0] == topic:
        return [Channel(topic, -1)]
    return sorted((Channel.parse(n) for n in names), key=lambda c: c.partition)
