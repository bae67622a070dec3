"""The planner's rules, one by one, on the local backend (no Spark)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from cdc.backend import ChannelInfo, SnapshotInfo
from cdc.backends.local import LocalBackend, LocalLog, LocalOptions
from cdc.errors import DataLossError, OptionError
from cdc.planner import Planner, positions


def make(tmp_path: Path, channels: int = 2) -> tuple[LocalLog, Planner]:
    log = LocalLog.create(tmp_path / "log", [("k", pa.int64()), ("v", pa.string())], ["k"], channels=channels)
    return log, planner_for(log)


def planner_for(log: LocalLog, **kw: object) -> Planner:
    return Planner(LocalBackend(LocalOptions.model_validate({"path": str(log.path)})), **kw)  # type: ignore[arg-type]


def rows(n: int, start: int = 0) -> list[dict[str, object]]:
    return [{"k": i, "v": str(i)} for i in range(start, start + n)]


def total(planner: Planner, start: dict, end: dict) -> int:
    return sum(r.end - r.start for r in planner.ranges(start, end))


def test_nothing_new_returns_start_unchanged(tmp_path: Path) -> None:
    log, planner = make(tmp_path)
    start = planner.initial("earliest")
    assert planner.next(start) is start
    log.append(rows(3))
    end = planner.next(start)
    assert planner.next(end) == end


def test_limit_is_shared_across_channels_and_leftover_goes_to_the_rest(tmp_path: Path) -> None:
    log, planner = make(tmp_path)
    log.append(rows(2), channel="c0")
    log.append(rows(50, 100), channel="c1")
    start = planner.initial("earliest")
    end = planner.next(start, max_records=20)
    assert positions(end) == {"c0": 2, "c1": 18}
    assert total(planner, start, end) == 20


def test_per_channel_cap(tmp_path: Path) -> None:
    log, _ = make(tmp_path)
    planner = planner_for(log, max_records_per_channel=5)
    log.append(rows(40))
    start = planner.initial("earliest")
    end = planner.next(start)
    assert all(v <= 5 for v in positions(end).values())
    end2 = planner.next(start, max_records=100)
    assert all(v <= 5 for v in positions(end2).values())


def test_child_waits_until_parent_done_in_an_earlier_batch(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=1)
    log.append(rows(10))
    start = planner.initial("earliest")
    a, b = log.split("c0")
    log.append(rows(10, 10))
    end1 = planner.next(start)
    assert {r.channel for r in planner.ranges(start, end1)} == {"c0"}
    assert end1["channels"]["c0"]["done"] is True
    end2 = planner.next(end1)
    assert {r.channel for r in planner.ranges(end1, end2)} <= {a, b}
    assert total(planner, end1, end2) == 10


def test_merge_child_waits_for_every_parent(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=2)
    log.append(rows(4), channel="c0")
    log.append(rows(30, 100), channel="c1")
    child = log.merge(["c0", "c1"])
    log.append(rows(5, 200))
    start = planner.initial("earliest")
    end1 = planner.next(start, max_records=10)  # c0 finishes, c1 does not
    assert end1["channels"]["c0"].get("done") and not end1["channels"]["c1"].get("done")
    end2 = planner.next(end1, max_records=10)
    assert child not in {r.channel for r in planner.ranges(end1, end2)}
    cur = end2
    seen_child = False
    for _ in range(10):
        nxt = planner.next(cur, max_records=10)
        if nxt == cur:
            break
        chans = {r.channel for r in planner.ranges(cur, nxt)}
        if child in chans:
            assert cur["channels"]["c1"].get("done"), "child read before its parent was done"
            seen_child = True
        cur = nxt
    assert seen_child


def test_first_batch_replays_exactly_even_if_latest_moved(tmp_path: Path) -> None:
    """Spark re-asks initialOffset when it replays batch 0; the range must not move."""
    log, planner = make(tmp_path, channels=1)
    log.append(rows(5))
    start = planner.initial("latest")
    log.append(rows(3, 5))
    end = planner.next(start)
    original = planner.ranges(start, end)
    log.append(rows(4, 8))  # the driver crashes; more data arrives; Spark asks again
    replay_start = planner_for(log).initial("latest")
    assert replay_start != start
    assert planner.ranges(replay_start, end) == original
    assert sum(r.end - r.start for r in original) == 3


def test_new_channels_are_registered_in_the_offset_before_they_are_read(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=1)
    start = planner.initial("earliest")
    log.append(rows(2))
    s1 = planner.next(start)
    kids = log.split("c0")
    s2 = planner.next(s1)  # c0 done; children registered at their earliest position
    assert s2["channels"]["c0"]["done"] is True
    assert all(s2["channels"][k] == {"pos": 0} for k in kids)
    log.append(rows(6, 50))
    s3 = planner.next(s2)
    ranges = planner.ranges(s2, s3)
    assert {r.channel for r in ranges} <= set(kids) and all(r.start == 0 for r in ranges)
    assert sum(r.end - r.start for r in ranges) == 6
    assert json.loads(json.dumps(s3)) == s3  # JSON-safe


def test_data_loss_fails_by_default_and_skips_when_allowed(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=1)
    for i in range(4):
        log.append(rows(5, i * 5))
    start = planner.initial("earliest")
    log.truncate("c0", 10)
    with pytest.raises(DataLossError, match="no longer held"):
        planner.next(start)
    lenient = planner_for(log, fail_on_data_loss=False)
    end = lenient.next(start)
    (r,) = lenient.ranges(start, end)
    assert (r.start, r.end) == (10, 20)


def test_starting_offsets_json_and_errors(tmp_path: Path) -> None:
    log, planner = make(tmp_path)
    log.append(rows(10), channel="c0")
    start = planner.initial('{"c0": 4}')
    assert positions(start) == {"c0": 4, "c1": 0}
    assert positions(planner.initial('{"c0": "latest"}'))["c0"] == 10
    with pytest.raises(OptionError, match="unknown channels"):
        planner.initial('{"nope": 1}')
    with pytest.raises(OptionError, match="startingOffsets"):
        planner.initial("newest")
    with pytest.raises(Exception, match="past the head"):
        planner.initial('{"c0": 99}')


def test_until_bounds_the_batch(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=1)
    log.append(rows(10))
    start = planner.initial("earliest")
    target = planner.until("latest")
    log.append(rows(10, 10))
    end = planner.next(start, None, target)
    assert positions(end) == {"c0": 10}
    kids = log.split("c0")
    log.append(rows(5, 100))
    end2 = planner.next(end, None, target)
    assert not set(kids) & set(end2["channels"])  # channels born after the target are not read


def test_snapshot_then_changes_with_concurrent_writers(tmp_path: Path) -> None:
    import threading

    log, planner = make(tmp_path, channels=2)
    log.append([{"k": i, "v": "a"} for i in range(100)])
    log.append([{"k": i, "v": None, "_op": "update"} for i in range(0, 100, 3)])  # null wins over "a"
    log.append([{"k": i, "_op": "delete"} for i in range(0, 100, 5)])
    log.split("c0")
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set() or n < 50:
            log.append([{"k": 1000 + n, "v": "late", "_op": "insert"}])
            n += 1

    t = threading.Thread(target=writer)
    t.start()
    start = planner.initial("snapshot")
    stop.set()
    t.join()
    snapshot_ids = [c for c, e in start["channels"].items() if e.get("snapshot")]
    assert snapshot_ids
    batches = []
    cur = start
    for _ in range(50):
        end = planner.next(cur, max_records=40)
        if end == cur:
            break
        recs = [
            r
            for rng in planner.ranges(cur, end)
            for b in planner.backend.reader().read(rng.channel, rng.start, rng.end)
            for r in pa.Table.from_batches([b]).to_pylist()
        ]
        batches.append(recs)
        cur = end
    flat = [r for b in batches for r in b]
    snap = [r for r in flat if r["_op"] == "snapshot"]
    changes = [r for r in flat if r["_op"] != "snapshot"]
    # the full data first: no change is delivered in a batch before the last snapshot batch ends
    last_snap_batch = max(i for i, b in enumerate(batches) if any(r["_op"] == "snapshot" for r in b))
    first_change_batch = min(i for i, b in enumerate(batches) if any(r["_op"] != "snapshot" for r in b))
    assert first_change_batch > last_snap_batch
    # snapshot rows + later changes == everything; nothing twice, nothing lost
    cut = {c: e["pos"] for c, e in start["channels"].items() if not e.get("snapshot")}
    history = log.read_all().to_pylist()
    before = [r for r in history if r["_position"] < cut.get(r["_channel"], 0)]
    cut_seq = max(r["_seq"] for r in before)
    assert all(r["_seq"] <= cut_seq for r in snap)
    assert all(r["_seq"] > cut_seq for r in changes)
    expected: dict[int, object] = {}
    for r in sorted(before, key=lambda r: r["_seq"]):
        if r["_op"] == "delete":
            expected.pop(r["k"], None)
        else:
            expected[r["k"]] = r["v"]
    assert {r["k"]: r["v"] for r in snap} == expected
    assert len(snap) == len(expected)
    all_changes_after = [r for r in history if r["_seq"] > cut_seq]
    assert sorted(r["_seq"] for r in changes) == sorted(r["_seq"] for r in all_changes_after)


def test_snapshot_is_refused_by_backends_without_one_and_after_truncation(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=1)
    log.append(rows(3))
    log.append(rows(3, 3))
    log.truncate("c0", 3)
    with pytest.raises(DataLossError, match="whole history"):
        planner.initial("snapshot")


def test_an_unchanged_offset_has_no_ranges(tmp_path: Path) -> None:
    """``next`` returns its start when nothing happened; that start may carry ``from`` marks of the batch
    that produced it, which must not turn into a second reading of that batch."""
    log, planner = make(tmp_path, channels=1)
    start = planner.initial("earliest")
    log.append(rows(3))
    first = planner.next(start)
    assert "from" in first["channels"]["c0"]
    again = planner.next(first)
    assert again == first
    assert planner.ranges(first, again) == []


def test_a_budget_smaller_than_the_channel_count_starves_no_channel(tmp_path: Path) -> None:
    log, planner = make(tmp_path, channels=4)
    for c in ("c0", "c1", "c2", "c3"):
        log.append(rows(50, 1000 * int(c[1:])), channel=c)
    cur = planner.initial("earliest")
    served: set[str] = set()
    for _ in range(12):
        end = planner.next(cur, max_records=1)
        served |= {r.channel for r in planner.ranges(cur, end)}
        assert total(planner, cur, end) == 1
        cur = end
    assert served == {"c0", "c1", "c2", "c3"}


# Offsets as the planner wrote them before it was cut into steps (recorded from commit 4cee05e): Spark keeps
# them in users' checkpoints and compares them as text, so the same history must give the same bytes.
GOLDEN_OFFSETS = [
    '{"channels": {"c0": {"pos": 0}, "c1": {"pos": 0}}, "initial": true}',
    '{"channels": {"c0": {"pos": 2, "from": 0}, "c1": {"pos": 2, "from": 0}}, "turn": 1}',
    '{"channels": {"c0": {"pos": 3}, "c1": {"pos": 5}}, "turn": 2}',
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 9}, "c2": {"pos": 0}, "c3": '
        '{"pos": 0}}}'
    ),
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 9}, "c2": {"pos": 1}, "c3": '
        '{"pos": 1}}}'
    ),
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 9}, "c2": {"pos": 1}, "c3": '
        '{"pos": 1}}}'
    ),
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 11}, "c2": {"pos": 1, "done": '
        'true}, "c3": {"pos": 1, "done": true}, "c4": {"pos": 0}}, "turn": 1}'
    ),
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 11}, "c2": {"pos": 1, "done": '
        'true}, "c3": {"pos": 1, "done": true}, "c4": {"pos": 2}}, "turn": 2}'
    ),
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 11}, "c2": {"pos": 1, "done": '
        'true}, "c3": {"pos": 1, "done": true}, "c4": {"pos": 2}}, "turn": 2}'
    ),
    (
        '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 11}, "c2": {"pos": 1, "done": '
        'true}, "c3": {"pos": 1, "done": true}, "c4": {"pos": 2}}, "initial": true}'
    ),
    (
        '{"channels": {"c0": {"pos": 0}, "c1": {"pos": 2}, "c2": {"pos": 0}, "c3": {"pos": 0}, '
        '"c4": {"pos": 0}}, "initial": true}'
    ),
    '{"channels": {"c0": {"pos": 15, "from": 5}}}',
    (
        '{"channels": {"snap-ID-0": {"pos": 0, "snapshot": true}, "snap-ID-1": {"pos": 0, '
        '"snapshot": true}, "snap-ID-2": {"pos": 0, "snapshot": true}, "c0": {"pos": 3}, "c1": '
        '{"pos": 4}}, "initial": true}'
    ),
    (
        '{"channels": {"snap-ID-0": {"pos": 2, "snapshot": true, "from": 0}, "snap-ID-1": {"pos": '
        '1, "snapshot": true, "from": 0}, "snap-ID-2": {"pos": 1, "snapshot": true, "done": true, '
        '"from": 0}, "c0": {"pos": 3, "from": 3}, "c1": {"pos": 4, "from": 4}}, "turn": 1}'
    ),
    (
        '{"channels": {"snap-ID-0": {"pos": 3, "snapshot": true, "done": true}, "snap-ID-1": '
        '{"pos": 3, "snapshot": true, "done": true}, "snap-ID-2": {"pos": 1, "snapshot": true, '
        '"done": true}, "c0": {"pos": 3}, "c1": {"pos": 4}}, "turn": 2}'
    ),
    (
        '{"channels": {"snap-ID-0": {"pos": 3, "snapshot": true, "done": true}, "snap-ID-1": '
        '{"pos": 3, "snapshot": true, "done": true}, "snap-ID-2": {"pos": 1, "snapshot": true, '
        '"done": true}, "c0": {"pos": 5}, "c1": {"pos": 4}}, "turn": 3}'
    ),
]


def test_the_planner_writes_the_same_offset_json_as_before(tmp_path: Path) -> None:
    import re

    got = []
    log, _ = make(tmp_path)
    planner = planner_for(log, fail_on_data_loss=False)
    log.append(rows(3), channel="c0")
    cur = planner.initial("earliest")
    got.append(cur)
    log.append(rows(5, 10), channel="c1")
    for _ in range(2):
        cur = planner.next(cur, max_records=4)
        got.append(cur)
    kids = log.split("c0")
    log.append(rows(6, 100))
    for _ in range(3):
        cur = planner.next(cur)
        got.append(cur)
    log.merge(list(kids))
    log.append(rows(4, 200))
    for _ in range(3):
        cur = planner.next(cur, max_records=3)
        got.append(cur)
    got += [planner.initial("latest"), planner.initial('{"c1": 2}')]
    lossy = LocalLog.create(tmp_path / "lossy", [("k", pa.int64()), ("v", pa.string())], ["k"], channels=1)
    for i in range(3):
        lossy.append(rows(5, 5 * i))
    skipping = planner_for(lossy, fail_on_data_loss=False)
    start = skipping.initial("earliest")
    lossy.truncate("c0", 5)
    got.append(skipping.next(start))
    snap = LocalLog.create(tmp_path / "snap", [("k", pa.int64()), ("v", pa.string())], ["k"], channels=2)
    snapping = Planner(LocalBackend(LocalOptions.model_validate({"path": str(snap.path), "snapshotChunkRows": 3})))
    snap.append(rows(7))
    cur = snapping.initial("snapshot")
    got.append(cur)
    snap.append(rows(2, 50))
    for _ in range(3):
        cur = snapping.next(cur, max_records=4)
        got.append(cur)
    assert [re.sub(r"snap-[0-9a-f]+-", "snap-ID-", json.dumps(o)) for o in got] == GOLDEN_OFFSETS


def test_a_batch_end_before_its_start_is_refused_naming_both(tmp_path: Path) -> None:
    log, planner = make(tmp_path)
    log.append(rows(10), channel="c0")
    log.append(rows(10, 100), channel="c1")
    start = planner.initial('{"c0": 6, "c1": 2}')
    assert positions(planner.batch_end(start, '{"c0": 6, "c1": 5}')) == {"c0": 6, "c1": 5}
    assert planner.ranges(start, planner.batch_end(start, '{"c0": 6}')) != []  # c1 runs to latest
    with pytest.raises(OptionError, match=r"channel 'c0': endingOffsets position 3 is before its startingOffsets "
                                          r"position 6") as e:
        planner.batch_end(start, '{"c0": 3, "c1": 5}')
    assert e.value.option == "endingOffsets" and "'c1'" not in str(e.value)
    log.truncate("c0", 5)  # an ending position no longer held lies before any start the log still holds
    with pytest.raises(OptionError, match="endingOffsets position 1 is before"):
        planner.batch_end(planner.initial('{"c0": 6}'), '{"c0": 1}')


class _Recording(LocalBackend):
    """The local backend, recording which of the calls a start depends on it receives, in order."""

    calls: list[str]

    def prepare_start(self) -> None:
        self.calls.append("prepare_start")

    def list_channels(self) -> Sequence[ChannelInfo]:
        self.calls.append("list_channels")
        return super().list_channels()

    def snapshot(self) -> SnapshotInfo:
        self.calls.append("snapshot")
        return super().snapshot()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("snapshot", ["snapshot"]), ("earliest", ["prepare_start", "list_channels"]),
     ("latest", ["prepare_start", "list_channels"]), ('{"c0": 0}', ["prepare_start", "list_channels"])],
)
def test_a_start_prepares_the_backend_first_and_a_snapshot_start_asks_nothing_before_the_snapshot(
    tmp_path: Path, spec: str, expected: list[str]
) -> None:
    # A backend that must create state for a query's start (PostgreSQL's slot) creates it in prepare_start, or
    # in snapshot() with the snapshot's export: a call before snapshot() that created it would waste a creation.
    log, _ = make(tmp_path)
    log.append(rows(4))
    backend = _Recording(LocalOptions.model_validate({"path": str(log.path)}))
    backend.calls = []
    Planner(backend).initial(spec)
    assert backend.calls == expected
