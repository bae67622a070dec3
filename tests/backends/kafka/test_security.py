"""backend=kafka on a broker that requires SASL/SCRAM over TLS (the session broker's SASL_SSL listener, its
certificate signed by a CA made for the session): the right credentials read, a wrong password and an
untrusted CA fail naming the options to fix, and the password appears in no log, error, repr or offset."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from cdc.errors import CdcError, OptionError
from cdc.servers.kafka import ApacheKafka
from tests.backends.kafka.helpers import backend, drain, produce
from tests.conftest import KAFKA_USERS
from tests.tls import make_certificates

USER, PASSWORD = next(iter(KAFKA_USERS.items()))


def _secure(kafka: ApacheKafka, password: str = PASSWORD, ca: Path | None = None) -> dict[str, Any]:
    assert kafka.tls is not None and kafka.tls.ca is not None
    return {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.username": USER, "kafka.sasl.password": password,
            "kafka.ssl.ca.location": str(ca or kafka.tls.ca), "metadataTimeoutMs": "5000"}


def test_scram_over_tls_reads_and_the_password_stays_secret(kafka: ApacheKafka, topic: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    produce(kafka.bootstrap, topic, [b"a", b"b", b"c"], partition=0)
    caplog.set_level(logging.DEBUG)
    b = backend(kafka.secure_bootstrap, topic, **_secure(kafka))
    table, ends = drain(b)
    assert table.column("value").to_pylist() == [b"a", b"b", b"c"]
    b.acknowledge({c: e["pos"] for c, e in ends[-1]["channels"].items()})
    assert PASSWORD not in caplog.text
    assert PASSWORD not in json.dumps(ends)
    assert PASSWORD not in repr(b) and PASSWORD not in repr(b.options)
    # the executors' reader carries it (they connect too), only inside its pickled options
    assert PASSWORD.encode() not in pickle.dumps(b.schema())


def test_a_wrong_password_fails_naming_the_credential_options(kafka: ApacheKafka, topic: str) -> None:
    with pytest.raises(CdcError) as err:
        b = backend(kafka.secure_bootstrap, topic, **_secure(kafka, password="not-the-password"))
        b.list_channels()
    assert isinstance(err.value, OptionError) and "kafka.sasl" in str(err.value)
    assert "not-the-password" not in str(err.value)


def test_an_untrusted_certificate_is_refused(kafka: ApacheKafka, topic: str, tmp_path: Path) -> None:
    other = make_certificates(tmp_path)
    with pytest.raises(OptionError, match="kafka.ssl.ca.location"):
        backend(kafka.secure_bootstrap, topic, **_secure(kafka, ca=other.ca)).list_channels()
