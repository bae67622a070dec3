"""examples/kafka_debezium_to_delta.py end to end (short), on the session's Kafka, Kafka Connect and PostgreSQL
(the example starts its own without the flags)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_kafka_debezium_example_ends_with_the_delta_table_equal_to_the_source(
    tmp_path: Path, kafka_connect: Any, postgres_server: Any
) -> None:
    dsn = str(postgres_server.create_database("kafka_example"))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "kafka_debezium_to_delta.py"), "--dir", str(tmp_path / "kafka"),
         "--seconds", "6", "--bootstrap", kafka_connect.kafka.bootstrap, "--connect", kafka_connect.url,
         "--postgres", dsn],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "RESULT: the Delta table equals SELECT * of the PostgreSQL table" in out.stdout
