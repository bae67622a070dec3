"""``minRecordsPerTrigger`` with ``maxTriggerDelay`` (Kafka's semantics) on the stream reader with a fake
clock, and starts/ends by time (``startingTimestamp``, ``endingTimestamp``) on the local backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from cdc.backends.local import LocalBackend, LocalLog
from cdc.backends.local.options import LocalOptions
from cdc.errors import OptionError
from cdc.offsets import Offset
from cdc.planner import Planner
from cdc.source import CdcBatchReader, CdcStreamReader, _Config

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new_log(tmp_path: Path, channels: int = 1) -> LocalLog:
    return LocalLog.create(tmp_path / "log", [("id", pa.int64())], ["id"], channels=channels)


def stream_reader(log: LocalLog, **options: str) -> tuple[CdcStreamReader, FakeClock]:
    reader = CdcStreamReader(_Config({"backend": "local", "path": str(log.path), **options}), from_arrow_schema(log.arrow_schema))
    clock = FakeClock()
    reader._clock = clock
    return reader, clock


def test_min_records_waits_until_the_minimum_or_the_delay(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append([{"id": i} for i in range(3)])
    reader, clock = stream_reader(
        log, minRecordsPerTrigger="10", maxRecordsPerTrigger="25", maxTriggerDelay="30s"
    )
    limit = reader.getDefaultReadLimit()
    start = reader.initialOffset()
    first = reader.latestOffset(start, limit)  # the first batch of a run never waits
    assert Offset.from_json(first).positions() == {"c0": 3}
    log.append([{"id": i} for i in range(3, 8)])
    clock.now += 10
    assert reader.latestOffset(first, limit) == first  # 5 < 10 records, 10 s < 30 s: no batch
    log.append([{"id": i} for i in range(8, 40)])
    clock.now += 1
    second = reader.latestOffset(first, limit)  # the minimum is there: a batch, capped by the maximum
    assert Offset.from_json(second).positions() == {"c0": 28}
    log.append([{"id": 99}])
    clock.now += 29.9
    third = reader.latestOffset(second, limit)  # 12 records: above the minimum again
    assert Offset.from_json(third).positions() == {"c0": 41}
    log.append([{"id": 100}])
    clock.now += 29.9
    assert reader.latestOffset(third, limit) == third  # 1 record, 29.9 s since the last batch
    clock.now += 0.1
    assert Offset.from_json(reader.latestOffset(third, limit)).positions() == {"c0": 42}  # the delay passed


def test_available_now_ignores_the_minimum(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append([{"id": i} for i in range(3)])
    reader, clock = stream_reader(log, minRecordsPerTrigger="100")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    log.append([{"id": 5}])
    reader.prepareForTriggerAvailableNow()
    clock.now += 1
    assert Offset.from_json(reader.latestOffset(first, reader.getDefaultReadLimit())).positions() == {"c0": 4}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"minRecordsPerTrigger": "10", "maxRecordsPerTrigger": "5"},
            r"'minRecordsPerTrigger' \(10\) is above",
        ),
        ({"maxTriggerDelay": "soon"}, "option 'maxTriggerDelay'.*500ms, 30s, 15m"),
        (
            {"startingTimestamp": "0", "startingOffsets": "earliest"},
            "'startingTimestamp' and 'startingOffsets'",
        ),
        ({"endingTimestamp": "0", "endingOffsets": "latest"}, "'endingTimestamp' and 'endingOffsets'"),
        ({"startingTimestamp": "2026-01-01T00:00:00"}, "option 'startingTimestamp'.*no zone"),
    ],
)
def test_bad_trigger_and_time_options_name_the_option(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        _Config({"backend": "local", "path": str(tmp_path), **options})


def timed_log(tmp_path: Path) -> LocalLog:
    log = new_log(tmp_path, channels=2)
    for minute in range(5):  # minute m: records 10m..10m+9, half in each channel
        log.append([{"id": 10 * minute + i} for i in range(10)], commit_ts=T0 + timedelta(minutes=minute))
    return log


def test_starting_timestamp_starts_each_channel_at_its_first_record_at_or_after_it(tmp_path: Path) -> None:
    log = timed_log(tmp_path)
    backend = LocalBackend(LocalOptions(path=str(log.path)))
    start = Planner(backend).initial("earliest", T0 + timedelta(minutes=2))
    for cid, pos in Offset.from_json(start).positions().items():
        before = list(log.read(cid, pos - 1, pos))[0].column("_commit_ts")[0].as_py()
        after = list(log.read(cid, pos, pos + 1))[0].column("_commit_ts")[0].as_py()
        assert before == T0 + timedelta(minutes=1) and after == T0 + timedelta(minutes=2)
    assert backend.position_at("c0", T0 + timedelta(hours=1)) == log.channel("c0").head
    assert backend.position_at("c0", T0 - timedelta(hours=1)) == 0


def test_a_batch_read_between_two_times(tmp_path: Path) -> None:
    log = timed_log(tmp_path)
    minute = 60_000
    t0 = int(T0.timestamp() * 1000)
    options = {
        "backend": "local",
        "path": str(log.path),
        "startingTimestamp": str(t0 + minute),
        "endingTimestamp": (T0 + timedelta(minutes=3)).isoformat(),
    }
    reader = CdcBatchReader(_Config(options), from_arrow_schema(log.arrow_schema))
    ids = sorted(i for p in reader.partitions() for b in reader.read(p) for i in b.column("id").to_pylist())
    assert ids == list(range(10, 30))  # minutes 1 and 2: at or after the start, before the end
    backwards = {**options, "endingTimestamp": str(t0)}
    with pytest.raises(OptionError, match="option 'endingTimestamp'"):
        CdcBatchReader(_Config(backwards), from_arrow_schema(log.arrow_schema)).partitions()
