"""examples/kafka_debezium_to_delta.py end to end (short), on the session's Kafka, Kafka Connect and PostgreSQL
(the example starts its own without the flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.examples_run import run_example


@pytest.mark.slow
def test_kafka_debezium_example_ends_with_the_delta_table_equal_to_the_source(
    tmp_path: Path, kafka_connect: Any, postgres_server: Any
) -> None:
    dsn = str(postgres_server.create_database("kafka_example"))
    run_example("kafka_debezium_to_delta.py", "--dir", str(tmp_path / "kafka"), "--seconds", "6",
                "--bootstrap", kafka_connect.kafka.bootstrap, "--connect", kafka_connect.url, "--postgres", dsn,
                result="the Delta table equals SELECT * of the PostgreSQL table")
