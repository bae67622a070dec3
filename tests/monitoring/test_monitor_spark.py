"""On a live query: the lag listener (a per-channel summary logged at every progress event, the Prometheus
endpoint on 127.0.0.1 scraped over HTTP) and ``cdc status`` on its checkpoint. One query for all three: a
query costs tens of seconds on this machine."""

from __future__ import annotations

import logging
import re
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

import cdc.monitor
from cdc.backends.local import LocalLog
from cdc.cli import main
from tests import streaming

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_listener_logs_lag_per_channel_and_serves_it_to_prometheus_on_loopback(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = LocalLog.create(tmp_path / "log", [("id", pa.int64())], ["id"], channels=1)
    log.append([{"id": i} for i in range(30)])
    monitor = cdc.monitor.attach(spark, prometheus_port=0)
    caplog.set_level(logging.INFO, logger="cdc.monitor")
    try:
        assert monitor._server is not None and monitor._server.server_address[0] == "127.0.0.1"
        reader = (
            spark.readStream.format("cdc").option("backend", "local").option("path", str(log.path)).option("maxRecordsPerTrigger", "10")
        )
        q = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .queryName("orders_lag")
            .trigger(processingTime="60 seconds")
            .start()
        )
        try:
            streaming.wait_for(lambda: bool(monitor.queries()), 60, "a progress event")
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor.port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            # cdc status on the live query's checkpoint: its first batch read 10 of 30
            status = CliRunner().invoke(
                main,
                ["status", str(tmp_path / "ck"), "-o", f"path={log.path}", "-o", "maxRecordsPerTrigger=10"],
                env={"COLUMNS": "160"},
            )
        finally:
            q.stop()
        assert status.exit_code == 0, status.output
        # the last batch in the offset log: the first, or the second already planned on a slow machine
        batch = int(re.search(r"· batch (\d+) ", status.output).group(1))  # type: ignore[union-attr]
        pos = 10 * (batch + 1)
        assert re.search(rf"c0\s+│ reading\s+│\s+{pos} │\s+30 │\s+{30 - pos} │", status.output), status.output
        # the first batch took 10 of 30 records: 20 behind, and the query is late by their age
        assert 'cdc_records_behind{channel="c0",query="orders_lag",source="0"} 20.0' in text, text
        assert 'cdc_time_behind_seconds{channel="c0",query="orders_lag",source="0"}' in text
        assert 'cdc_input_rows_per_second{query="orders_lag"}' in text
        assert "query 'orders_lag' batch 0: c0 20 behind (" in caplog.text
    finally:
        monitor.close()
        spark.streams.removeListener(monitor)
