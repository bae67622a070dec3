"""The local log writer: routing, lineage operations, concurrency, validation."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pyarrow as pa
import pytest

from cdc.backends.local import LocalLog
from cdc.errors import DataLossError, PositionError


def new_log(tmp_path: Path, channels: int = 2) -> LocalLog:
    return LocalLog.create(tmp_path / "log", [("k", pa.int64()), ("v", pa.string())], ["k"], channels=channels)


def test_a_key_always_lands_in_the_channel_owning_its_hash(tmp_path: Path) -> None:
    log = new_log(tmp_path, channels=3)
    log.append([{"k": i % 10, "v": "a"} for i in range(100)])
    owner: dict[int, str] = {}
    for r in log.read_all().to_pylist():
        assert owner.setdefault(r["k"], r["_channel"]) == r["_channel"]
    assert len(set(owner.values())) > 1


def test_split_hands_the_range_to_children_and_sequences_grow(tmp_path: Path) -> None:
    log = new_log(tmp_path, channels=1)
    log.append([{"k": i, "v": "a"} for i in range(50)])
    kids = log.split("c0", parts=3)
    log.append([{"k": i, "v": "b", "_op": "update"} for i in range(50)])
    table = log.read_all().to_pylist()
    parent_max = max(r["_seq"] for r in table if r["_channel"] == "c0")
    assert all(r["_seq"] > parent_max for r in table if r["_channel"] in kids)
    assert {r["_channel"] for r in table if r["v"] == "b"} <= set(kids)
    assert [c.parents for c in log.channels() if c.id in kids] == [("c0",)] * 3
    with pytest.raises(PositionError, match="already finished"):
        log.split("c0")
    with pytest.raises(PositionError, match="not open"):
        log.append([{"k": 1, "v": "x"}], channel="c0")


def test_merge_needs_adjacent_open_channels(tmp_path: Path) -> None:
    log = new_log(tmp_path, channels=3)
    with pytest.raises(ValueError, match="non-adjacent"):
        log.merge(["c0", "c2"])
    child = log.merge(["c1", "c2"])
    assert log.channel(child).parents == ("c1", "c2")
    assert log.channel(child).hash_range == (log.channel("c1").hash_range[0], log.channel("c2").hash_range[1])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"k": None, "v": "x"}], "key column 'k' has nulls"),
        ([{"k": 1, "v": "x", "_op": "upsert"}], "invalid operations"),
        ([{"k": 1, "color": "red"}], "unknown columns"),
    ],
)
def test_bad_rows_are_rejected_whole(tmp_path: Path, rows: list, message: str) -> None:
    log = new_log(tmp_path)
    with pytest.raises(ValueError, match=message):
        log.append(rows)
    assert log.read_all().num_rows == 0


def test_truncation_is_data_loss_for_readers(tmp_path: Path) -> None:
    log = new_log(tmp_path, channels=1)
    for i in range(3):
        log.append([{"k": i, "v": "a"}])
    assert log.truncate("c0", 2) == 2
    with pytest.raises(DataLossError):
        list(log.read("c0", 0, 3))
    assert [b.num_rows for b in log.read("c0", 2, 3)] == [1]
    assert log.truncate("c0", 10) == 2  # an open channel keeps its last segment (its head)


def _writer(path: str, worker: int, n: int) -> None:
    log = LocalLog(path)
    for i in range(n):
        log.append([{"k": worker * 1000 + i, "v": f"w{worker}"}])


def test_concurrent_appends_from_processes_lose_nothing(tmp_path: Path) -> None:
    log = new_log(tmp_path, channels=2)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(log.path), w, 40)) for w in range(3)]
    for p in procs:
        p.start()
    seen_heads = []
    while any(p.is_alive() for p in procs):  # read while they write: always a consistent prefix
        for c in log.channels():
            got = sum(b.num_rows for b in log.read(c.id, 0, c.head))
            assert got == c.head
        seen_heads.append(sum(c.head for c in log.channels()))
    for p in procs:
        p.join()
        assert p.exitcode == 0
    table = log.read_all()
    assert table.num_rows == 120
    assert sorted(table.column("_seq").to_pylist()) == list(range(1, 121))
    for c in log.channels():
        assert table.filter(pa.compute.equal(table.column("_channel"), c.id)).column("_position").to_pylist() == list(
            range(c.head)
        )


def test_average_record_bytes_follows_the_segment_files(tmp_path: Path) -> None:
    log = LocalLog.create(tmp_path / "log", [("k", pa.int64()), ("note", pa.string())], ["k"], channels=2)
    assert log.average_record_bytes() == 0.0
    log.append([{"k": i, "note": "x" * 10} for i in range(200)])
    small = log.average_record_bytes()
    files = [s.path for c in log.channels() for s in c.segments]
    assert small == pytest.approx(sum(f.stat().st_size for f in files) / 200)
    for _ in range(20):  # the estimate follows the recent segments
        log.append([{"k": i, "note": "y" * 1000} for i in range(200)])
    assert log.average_record_bytes() > 1000 > small
