"""Lag per channel against a known backlog: the local backend's heads, and the source's report of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from cdc.backends.local import LocalBackend, LocalLog
from cdc.backends.local.options import LocalOptions
from cdc.lag import from_report
from cdc.source import CdcStreamReader, _Config

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def new_log(tmp_path: Path) -> LocalLog:
    return LocalLog.create(tmp_path / "log", [("id", pa.int64())], ["id"], channels=2)


def test_local_heads_count_records_behind_and_carry_commit_times(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append([{"id": i} for i in range(5)], channel="c0", commit_ts=T0)
    log.append([{"id": i} for i in range(5, 12)], channel="c0", commit_ts=T0 + timedelta(seconds=30))
    log.append([{"id": 100}], channel="c1", commit_ts=T0)
    backend = LocalBackend(LocalOptions(path=str(log.path)))
    heads = backend.heads({"c0": 3, "c1": 1})
    assert (heads["c0"].head, heads["c0"].behind) == (12, 9)
    assert heads["c0"].head_time == T0 + timedelta(seconds=30)
    assert heads["c0"].position_time == T0  # the third record, the last one delivered
    assert (heads["c1"].head, heads["c1"].behind, heads["c1"].head_time) == (1, 0, T0)
    assert backend.heads({"c1": 0})["c1"].position_time is None  # nothing delivered yet


def test_the_source_reports_heads_and_lag_of_the_planned_batch(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append([{"id": i} for i in range(10)], channel="c0", commit_ts=T0)
    log.append([{"id": i} for i in range(10, 14)], channel="c0", commit_ts=T0 + timedelta(minutes=1))
    config = _Config({"backend": "local", "path": str(log.path), "maxRecordsPerTrigger": "6"})
    reader = CdcStreamReader(config, from_arrow_schema(log.arrow_schema))
    assert from_report(reader.reportLatestOffset())[0].behind is None  # before any plan: heads only
    start = reader.initialOffset()
    reader.latestOffset(start, reader.getDefaultReadLimit())
    report = reader.reportLatestOffset()
    lags = {lag.channel: lag for lag in from_report(report)}
    assert lags["c0"].head == 14 and lags["c0"].behind == 8
    assert lags["c0"].head_time == T0 + timedelta(minutes=1)
    assert lags["c0"].delivered_time == T0
    assert lags["c0"].time_behind_ms is not None and lags["c0"].time_behind_ms > 60_000  # T0 is long past
    assert lags["c1"].behind == 0 and lags["c1"].time_behind_ms == 0  # empty and read: not late
