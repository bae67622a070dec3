"""Security against a real Apache Pulsar: TLS (binary and admin), token auth with authorization, OAuth2 client
credentials, and the ``pulsar.client.*`` / ``pulsar.reader.*`` pass-through.

One secured standalone broker for this module (TLS ports, ``authenticationEnabled``, ``authorizationEnabled``,
``AuthenticationProviderToken``), apart from the session's plain broker, with certificates and keys made here
(see ``security_world``). The OAuth2 issuer is a small server on loopback inside the test (no identity
provider runs here); the JWTs it issues are verified by the real broker like any other token.
"""

from __future__ import annotations

import json
import logging
import pickle
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cdc.backends.pulsar import PulsarBackend, PulsarOptions
from cdc.backends.pulsar.connection import admin_client, connect, reader_settings
from cdc.backends.pulsar.options import PulsarSinkOptions
from cdc.errors import BackendUnavailableError, OptionError
from cdc.options import parse, split_and_parse
from cdc.servers.pulsar.standalone import ApachePulsar
from cdc.testing import batches
from tests.backends.pulsar.security_world import (
    CLIENT_ROLE,
    OAUTH_AUDIENCE,
    SUPER_USER,
    Certificates,
    OAuthServer,
    TokenSigner,
    make_certificates,
    make_signer,
    secured_broker,
)

slow = pytest.mark.slow  # the tests that use the secured broker: a JVM of its own, ~20-40 s to start here

log = logging.getLogger(__name__)


@dataclass
class Secured:
    broker: ApachePulsar
    certs: Certificates
    signer: TokenSigner
    oauth: OAuthServer
    token: str  # the client role's
    dir: Path

    def options(self, **extra: Any) -> dict[str, Any]:
        """Read options over TLS with the client role's token (a test replaces what it tries)."""
        raw: dict[str, Any] = {
            "service.url": self.broker.tls_url,
            "admin.url": self.broker.tls_admin_url,
            "tls.trustCertsFilePath": str(self.certs.ca),
            "auth.token": self.token,
            "catchUpMs": 150,
            "pollTimeoutMs": 20000,
        }
        raw.update(extra)
        return {k: v for k, v in raw.items() if v is not None}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    d = tmp_path_factory.mktemp("secured-pulsar")
    certs, signer = make_certificates(d), make_signer(d)
    broker = secured_broker(d, certs, signer)
    with broker:
        log.warning("secured Apache Pulsar started in %.1f s", broker.last_start_s)
        broker.grant("public/default", CLIENT_ROLE, ["consume", "produce"])
        oauth = OAuthServer(signer, client_secret="s3cret-oauth")
        with oauth.running():
            yield Secured(broker, certs, signer, oauth, signer.token(CLIENT_ROLE), d)


_n = iter(range(10**6))


def _topic(partitions: int, secured: Secured) -> str:
    topic = f"persistent://public/default/sec{next(_n)}-{time.monotonic_ns() % 10**6}"
    secured.broker.create_partitioned_topic(topic, partitions)
    return topic


def _produce(raw: dict[str, Any], topic: str, n: int) -> None:
    """Through the sink's connection code (TLS + the same credential), not a privileged client."""
    sink = parse(PulsarSinkOptions, {k: v for k, v in raw.items() if k in _SINK_KEYS or k.startswith("pulsar.client.")}, what="sink")
    client = connect(sink)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send(f"m{i}".encode(), partition_key=str(i))
        producer.close()
    finally:
        client.close()


_SINK_KEYS = {"service.url", "auth.token", "tls.trustCertsFilePath", "tls.hostnameVerification",
              "auth.oauth2.issuerUrl", "auth.oauth2.privateKey", "auth.oauth2.audience"}


def _read_all(raw: dict[str, Any]) -> tuple[list[bytes], dict[str, Any], PulsarBackend]:
    backend = PulsarBackend(parse(PulsarOptions, raw, what="backend 'pulsar'"))
    try:
        values: list[bytes] = []
        offset: dict[str, Any] = {}
        for end, table in batches(backend):
            values += table.column("value").to_pylist()
            offset = end
        return values, offset, backend
    finally:
        backend.close()


@slow
def test_tls_and_token_read_everything(secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    topic = _topic(2, secured)
    raw = secured.options(topic=topic, **{"reader.topic": "partition"})
    _produce(raw, topic, 40)
    caplog.set_level(logging.DEBUG)
    values, offset, backend = _read_all(raw)
    assert sorted(values) == sorted(f"m{i}".encode() for i in range(40))
    # the token never leaves the options in clear: not in reprs, pickles sent to executors, offsets, logs
    secret = secured.token
    assert secret not in repr(backend.options) and secret not in repr(backend) and secret not in str(backend.options)
    assert secret not in json.dumps(offset)
    assert secret not in caplog.text
    # executors need the token, so the pickled reader carries it, inside its SecretStr still
    reader = pickle.loads(pickle.dumps(backend.reader()))
    assert secret not in repr(reader.options) and reader.options.auth_token.get_secret_value() == secret


@slow
def test_admin_api_over_https_with_token(secured: Secured) -> None:
    topic = _topic(3, secured)
    options = parse(PulsarOptions, secured.options(topic=topic), what="b")
    admin = admin_client(options, secured.broker.tls_admin_url)
    assert admin.partitions(topic) == 3
    assert "tok" not in repr(admin) and secured.token not in repr(admin)


@slow
def test_untrusted_certificate_refused(secured: Secured) -> None:
    (secured.dir / "other-ca").mkdir(exist_ok=True)
    other = make_certificates(secured.dir / "other-ca")
    topic = _topic(1, secured)
    raw = secured.options(topic=topic, **{"tls.trustCertsFilePath": str(other.ca), "operationTimeoutSeconds": 3})
    options = parse(PulsarOptions, raw, what="b")
    with pytest.raises(OptionError, match="tls.trustCertsFilePath") as err:
        admin_client(options, secured.broker.tls_admin_url).get("/admin/v2/clusters")
    assert err.value.option == "tls.trustCertsFilePath"
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match="tls.trustCertsFilePath"):
        PulsarBackend(parse(PulsarOptions, _without(raw, "admin.url"), what="b")).list_channels()
    assert time.monotonic() - started < 20


def _without(raw: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in keys}


@slow
def test_hostname_verification_on_by_default(secured: Secured) -> None:
    """``vm`` resolves to 127.0.0.1 here but is not in the certificate: refused unless verification is off."""
    topic = _topic(1, secured)
    url = f"pulsar+ssl://vm:{secured.broker.broker_tls_port}"
    admin = f"https://vm:{secured.broker.web_tls_port}"
    raw = secured.options(topic=topic, **{"service.url": url, "admin.url": admin, "operationTimeoutSeconds": 3})
    with pytest.raises(OptionError, match="tls.trustCertsFilePath"):
        admin_client(parse(PulsarOptions, raw, what="b"), admin).get("/admin/v2/clusters")
    with pytest.raises(BackendUnavailableError, match="tls.hostnameVerification"):
        PulsarBackend(parse(PulsarOptions, _without(raw, "admin.url"), what="b")).list_channels()
    # the pulsar-spark name of the same switch, through the pass-through prefix
    off = {**raw, "pulsar.client.tlsHostnameVerificationEnable": "false"}
    _produce(off, topic, 3)
    values, _, _ = _read_all(off)
    assert sorted(values) == [b"m0", b"m1", b"m2"]


@slow
@pytest.mark.parametrize("token", ["wrong", None])
def test_wrong_or_missing_token_refused_naming_the_option(
    secured: Secured, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PULSAR_AUTH_TOKEN", raising=False)
    topic = _topic(1, secured)
    bad = "not-a-jwt" if token == "wrong" else None
    # with the admin API known, its 401 makes the refusal certain: a terminal error naming the option
    raw = secured.options(topic=topic, **{"auth.token": bad, "pulsar.client.operation_timeout_seconds": "1"})
    started = time.monotonic()
    with pytest.raises(OptionError, match="'auth.token'.*refused the credential") as err:
        PulsarBackend(parse(PulsarOptions, raw, what="b")).list_channels()
    assert err.value.option == "auth.token"
    if bad is None:
        assert "no credential was given" in str(err.value)
    else:
        assert bad not in str(err.value)
    # the binary protocol alone cannot tell a refusal from a slow broker; it still names the option, and
    # pulsar.client.operation_timeout_seconds (not the 30 s default) bounds the wait
    with pytest.raises(BackendUnavailableError, match="check option 'auth.token'"):
        PulsarBackend(parse(PulsarOptions, _without(raw, "admin.url"), what="b")).list_channels()
    assert time.monotonic() - started < 20


@slow
def test_writer_refused_for_a_wrong_token_names_the_option(secured: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink's producer meets the same refusal as the reader: not a raw timeout but an error naming
    auth.token (an OptionError when admin.url lets the admin API's 401 confirm it)."""
    import pyarrow as pa

    from cdc.backends.pulsar.writer import sink_options, write_arrow

    monkeypatch.delenv("PULSAR_AUTH_TOKEN", raising=False)
    topic = _topic(1, secured)
    raw = {k: v for k, v in secured.options(topic=topic).items() if k in _SINK_KEYS | {"topic", "admin.url"}}
    raw.update({"auth.token": "not-a-jwt", "pulsar.client.operation_timeout_seconds": "1"})
    rows = pa.RecordBatch.from_pydict({"value": [b"a", b"b"]})
    started = time.monotonic()
    with pytest.raises(OptionError, match="'auth.token'.*refused the credential") as err:
        write_arrow(iter([rows]), sink_options(raw))
    assert err.value.option == "auth.token" and "not-a-jwt" not in str(err.value)
    with pytest.raises(BackendUnavailableError, match="check option 'auth.token'"):
        write_arrow(iter([rows]), sink_options(_without(raw, "admin.url")))
    assert time.monotonic() - started < 20


@slow
def test_token_of_a_role_without_permission(secured: Secured) -> None:
    topic = _topic(1, secured)
    raw = secured.options(topic=topic, **{"auth.token": secured.signer.token("nobody")})
    with pytest.raises(OptionError, match="'auth.token'.*grant it consume"):
        PulsarBackend(parse(PulsarOptions, _without(raw, "admin.url"), what="b")).list_channels()


@slow
def test_oauth2_client_credentials(secured: Secured) -> None:
    topic = _topic(2, secured)
    creds = secured.oauth.credentials_file(secured.dir)
    raw = secured.options(topic=topic, **{
        "auth.token": None,
        "auth.oauth2.issuerUrl": secured.oauth.url,
        "auth.oauth2.privateKey": str(creds),
        "auth.oauth2.audience": OAUTH_AUDIENCE,
        "reader.topic": "partition",
    })
    before = len(secured.oauth.grants)
    _produce(raw, topic, 10)
    values, _, _ = _read_all(raw)  # admin.url given: heads come from the admin API with an OAuth2 token
    assert sorted(values) == sorted(f"m{i}".encode() for i in range(10))
    grants = secured.oauth.grants[before:]
    assert grants and all(g["audience"] == OAUTH_AUDIENCE and g["client_id"] == "cdc-spark" for g in grants)
    admin = admin_client(parse(PulsarOptions, raw, what="b"), secured.broker.tls_admin_url)
    assert admin.partitions(topic) == 2
    # a wrong client secret: the issuer refuses it, and the error names the option
    wrong = {**raw, "auth.oauth2.privateKey": str(secured.oauth.credentials_file(secured.dir, "nope")),
             "operationTimeoutSeconds": 3}
    with pytest.raises(OptionError, match="auth.oauth2.privateKey"):
        PulsarBackend(parse(PulsarOptions, wrong, what="b")).list_channels()


@slow
def test_reader_and_client_pass_through_reach_the_broker(secured: Secured) -> None:
    topic = _topic(1, secured)
    raw = secured.options(topic=topic, **{
        "pulsar.reader.reader_name": "cdc-passthrough",
        "pulsar.reader.subscriptionRolePrefix": "cdcsec",  # camelCase as a pulsar-spark user writes it
        "pulsar.reader.receiver_queue_size": "7",
        "pulsar.client.connection_timeout_ms": "5000",
    })
    options = parse(PulsarOptions, raw, what="b")
    assert options.reader_settings == {"reader_name": "cdc-passthrough", "subscription_role_prefix": "cdcsec",
                                       "receiver_queue_size": 7}
    assert options.client_settings == {"connection_timeout_ms": 5000}
    kwargs = reader_settings(options, receiver_queue_size=options.receiver_queue_size)
    assert kwargs["receiver_queue_size"] == 7  # the pass-through wins over receiverQueueSize
    client = connect(options)
    try:
        reader = client.create_reader(topic + "-partition-0", pulsar.MessageId.earliest, **kwargs)
        request = urllib.request.Request(
            f"{secured.broker.admin_url}/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}-partition-0/stats",
            headers={"Authorization": f"Bearer {secured.signer.token(SUPER_USER)}"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            stats = json.loads(r.read())
        reader.close()
    finally:
        client.close()
    subs = stats["subscriptions"]
    assert any(name.startswith("cdcsec") for name in subs), subs.keys()
    consumers = [c for s in subs.values() for c in s.get("consumers", [])]
    assert any(c.get("consumerName") == "cdc-passthrough" for c in consumers), consumers


def test_pass_through_names_are_checked() -> None:
    base = {"service.url": "pulsar://x:6650", "topic": "t"}
    with pytest.raises(OptionError, match="pulsar.client.no_such_setting.*takes: .*operation_timeout_seconds"):
        split_and_parse({**base, "backend": "pulsar", "pulsar.client.no_such_setting": "1"}, PulsarOptions, "pulsar")
    with pytest.raises(OptionError, match="pulsar.reader.nope.*takes: .*receiver_queue_size"):
        parse(PulsarOptions, {**base, "pulsar.reader.nope": "1"}, what="b")
    with pytest.raises(OptionError, match="expected int"):
        parse(PulsarOptions, {**base, "pulsar.reader.receiver_queue_size": "many"}, what="b")
    with pytest.raises(OptionError, match="expected true or false"):
        parse(PulsarOptions, {**base, "pulsar.client.use_tls": "yes"}, what="b")
    with pytest.raises(OptionError, match="set it with option 'auth.token or auth.oauth2"):
        parse(PulsarOptions, {**base, "pulsar.client.authentication": "x"}, what="b")
    with pytest.raises(OptionError, match="set it with option 'startingOffsets'"):
        parse(PulsarOptions, {**base, "pulsar.reader.start_message_id": "x"}, what="b")
    # pulsar-spark's names for the TLS settings land on our options (which the admin API follows too)
    o = parse(PulsarOptions, {**base, "pulsar.client.tlsTrustCertsFilePath": "/ca.pem",
                              "pulsar.client.tlsAllowInsecureConnection": "true"}, what="b")
    assert (o.tls_trust_certs_file_path, o.tls_allow_insecure_connection, o.client_settings) == ("/ca.pem", True, {})
    with pytest.raises(OptionError, match="disagree"):
        parse(PulsarOptions, {**base, "tls.hostnameVerification": "true",
                              "pulsar.client.tlsHostnameVerificationEnable": "false"}, what="b")
    # the sink takes the client settings, not the reader's
    parse(PulsarSinkOptions, {"service.url": "pulsar://x", "pulsar.client.io_threads": "2"}, what="sink")
    with pytest.raises(OptionError, match="unknown option 'pulsar.reader.reader_name'"):
        parse(PulsarSinkOptions, {"service.url": "pulsar://x", "pulsar.reader.reader_name": "r"}, what="sink")


def test_credential_options_are_checked() -> None:
    base = {"service.url": "pulsar://x:6650", "topic": "t"}
    with pytest.raises(OptionError, match="exclude each other"):
        parse(PulsarOptions, {**base, "auth.token": "t", "auth.oauth2.issuerUrl": "http://i",
                              "auth.oauth2.privateKey": "/k"}, what="b")
    with pytest.raises(OptionError, match="'auth.oauth2.privateKey' is required"):
        parse(PulsarOptions, {**base, "auth.oauth2.issuerUrl": "http://i"}, what="b")
    with pytest.raises(OptionError, match="expected true or false|valid boolean") as err:
        parse(PulsarOptions, {**base, "tls.allowInsecureConnection": "perhaps"}, what="b")
    assert "tls.allowInsecureConnection" in str(err.value)
    o = parse(PulsarOptions, {**base, "auth.token": "sekrit-value"}, what="b")
    assert "sekrit-value" not in repr(o) and o.tls_hostname_verification and not o.tls_allow_insecure_connection
