"""``cdc status`` on a Kafka query: a streaming query reads a topic of the session's broker over its SASL_SSL
listener, records arrive after it stopped, and the command shows each partition's position, head and offsets
behind; the SASL password, given to the command from the environment as the docs say, appears in none of its
output, nor when it is wrong."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cdc.cli import main
from cdc.servers.kafka import ApacheKafka
from tests.backends.kafka.helpers import produce
from tests.backends.kafka.test_security import PASSWORD, USER
from tests.streaming import run_available_now

pytestmark = pytest.mark.spark


def _rows(output: str, topic: str) -> dict[str, list[str]]:
    """The status table's rows by channel (``topic:partition``)."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and cells[0].startswith(f"{topic}:"):
            out[cells[0]] = cells[1:]
    return out


def _status(kafka: ApacheKafka, ck: Path, topic: str, password: str) -> Any:
    assert kafka.tls is not None and kafka.tls.ca is not None
    options = {"backend": "kafka", "kafka.bootstrap.servers": kafka.secure_bootstrap, "subscribe": topic,
               "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
               "kafka.sasl.username": USER, "kafka.ssl.ca.location": str(kafka.tls.ca), "metadataTimeoutMs": "5000"}
    args = ["status", str(ck), *(a for k, v in options.items() for a in ("-o", f"{k}={v}")),
            "--option-from-env", "kafka.sasl.password=KAFKA_PASSWORD"]
    return CliRunner().invoke(main, args, env={"COLUMNS": "200", "KAFKA_PASSWORD": password})


def test_status_shows_each_partitions_lag_and_never_the_password(kafka: ApacheKafka, topic: str, spark: Any,
                                                                 tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    assert kafka.tls is not None and kafka.tls.ca is not None
    produce(kafka.bootstrap, topic, [b"a%d" % i for i in range(6)], partition=0)
    produce(kafka.bootstrap, topic, [b"b%d" % i for i in range(4)], partition=1)
    query = {"backend": "kafka", "kafka.bootstrap.servers": kafka.secure_bootstrap, "subscribe": topic,
             "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
             "kafka.sasl.username": USER, "kafka.sasl.password": PASSWORD, "kafka.ssl.ca.location": str(kafka.tls.ca)}
    ck = tmp_path / "ck"
    assert run_available_now(spark, query, tmp_path / "out", ck, timeout=120) is None
    # Unread by the query: 3 records on partition 0, 1 on partition 1
    produce(kafka.bootstrap, topic, [b"c%d" % i for i in range(3)], partition=0)
    produce(kafka.bootstrap, topic, [b"d0"], partition=1)

    caplog.set_level(logging.DEBUG)
    result = _status(kafka, ck, topic, PASSWORD)
    assert result.exit_code == 0, result.output
    assert "batch 0 (committed)" in result.output
    table = _rows(result.output, topic)
    # channel: state, position (the next offset to read), head, records behind
    assert {c: cells[:4] for c, cells in table.items()} == {
        f"{topic}:0": ["reading", "6", "9", "3"],
        f"{topic}:1": ["reading", "4", "5", "1"],
    }, result.output
    assert PASSWORD not in result.output and PASSWORD not in caplog.text

    wrong = "not-the-password-5e1"
    result = _status(kafka, ck, topic, wrong)
    assert result.exit_code != 0 and "kafka.sasl" in result.output, result.output
    assert wrong not in result.output and wrong not in caplog.text
