"""``minPartitions``: a batch's channel ranges read by several Spark tasks (:mod:`cdc.partitions`).

The pure parts (how many tasks a range gets, where it is cut, what is refused) without Spark; then the local
log inside real Spark: a batch read in pieces holds exactly the unsplit read's records and ``_seq`` restores
each key's order, and a streaming batch replayed after a restart is read in the same pieces. The contract
suite (:mod:`cdc.testing.contract`) checks every backend that splits; the stream-protocol property test runs
histories with ``minPartitions`` too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.backends.local import LocalLog
from cdc.channels import ChannelRange, Position
from cdc.errors import CdcError, OptionError
from cdc.partitions import parts_per_range, pick_near, split_ranges
from cdc.source import _Config

# ---------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("sizes", "min_partitions", "parts"),
    [
        ([100], None, [1]),
        ([100], 1, [1]),
        ([100], 4, [4]),
        ([100, 100], 2, [1, 1]),  # as many ranges as tasks asked for: no cut
        ([300, 100], 8, [6, 2]),  # in proportion to size
        ([1000, 1], 4, [4, 1]),  # a small range keeps its one task
        ([5, 5, 5], 4, [1, 1, 1]),  # 4/3 each, rounded
        ([10, None], 6, [3, 3]),  # a size unknown: the ranges count alike
        ([0, 0], 6, [3, 3]),
    ],
)
def test_parts_per_range_follows_sparks_kafka_rule(
    sizes: list[int | None], min_partitions: int | None, parts: list[int]
) -> None:
    assert parts_per_range(sizes, min_partitions) == parts


@given(
    data=st.data(),
    lo=st.integers(0, 10**12),
    width=st.integers(0, 10**6),
    parts=st.integers(1, 40),
)
def test_pick_near_gives_increasing_candidates_inside_the_range(data: st.DataObject, lo: int, width: int, parts: int) -> None:
    hi = lo + width
    inside = sorted(data.draw(st.sets(st.integers(lo + 1, hi - 1), max_size=60))) if width > 1 else []
    picked = pick_near(inside, lo, hi, parts)
    assert picked == pick_near(list(inside), lo, hi, parts)  # a function of its arguments
    assert len(picked) <= parts - 1
    assert all(p in inside for p in picked)
    assert picked == sorted(set(picked))
    if 1 < parts <= width:  # every position a candidate: the cuts are the equal shares, to the nearest
        even = pick_near(range(lo + 1, hi), lo, hi, parts)
        assert len(even) == parts - 1
        assert all(2 * abs((p - lo) * parts - width * k) <= parts for k, p in enumerate(even, 1))


class _Points:
    """A backend's split answers, given by the test."""

    name = "test"

    def __init__(self, points: Sequence[Position], size: int | None = 10) -> None:
        self.points, self.size = points, size

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        return self.points

    def range_size(self, channel: str, start: Position, end: Position) -> int | None:
        return self.size


def test_ranges_are_cut_at_the_backends_points_and_left_whole_without_any(caplog: pytest.LogCaptureFixture) -> None:
    r = ChannelRange("c0", 0, 10)
    assert split_ranges([r], 3, _Points([4, 7])) == [ChannelRange("c0", 0, 4), ChannelRange("c0", 4, 7),
                                                    ChannelRange("c0", 7, 10)]
    assert split_ranges([r], None, _Points([4, 7])) == [r]
    caplog.set_level("INFO", logger="cdc.partitions")
    assert split_ranges([r], 3, _Points([])) == [r]
    assert "found no split point inside c0[0, 10)" in caplog.text


@pytest.mark.parametrize("points", [[4, 7, 8], [0], [10], [4, 4]])
def test_a_backends_bad_split_points_fail_naming_it(points: list[int]) -> None:
    with pytest.raises(CdcError, match="backend 'test' gave split points"):
        split_ranges([ChannelRange("c0", 0, 10)], 3, _Points(points))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"backend": "local", "path": "/x", "minPartitions": "0"}, "'minPartitions'"),
        ({"backend": "local", "path": "/x", "minpartitions": "two"}, "'minPartitions'"),
        (
            {"backend": "tablestore", "endpoint": "http://127.0.0.1:1", "instance.name": "i", "table.name": "t",
             "tunnel.name": "n", "minPartitions": "4"},
            "backend 'tablestore' cannot read a channel's range in several tasks: a tunnel channel's positions are tokens",
        ),
        (
            {"backend": "postgres", "dsn": "postgresql://u@127.0.0.1:1/db", "tables": "public.t", "minPartitions": "4"},
            "backend 'postgres' cannot read a channel's range in several tasks: its changes come through one replication slot",
        ),
        (
            {"backend": "pulsar", "service.url": "pulsar://127.0.0.1:1", "topic": "t", "minPartitions": "4"},
            "backend 'pulsar' cannot read .* option 'admin.url' is not given",
        ),
    ],
)
def test_min_partitions_is_refused_clearly(raw: dict[str, str], fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment) as refused:
        _Config(raw)
    assert refused.value.option == "minPartitions"


def test_min_partitions_is_accepted_where_ranges_can_be_cut() -> None:
    assert _Config({"backend": "local", "path": "/x", "minPartitions": "8"}).source.min_partitions == 8
    assert _Config({"backend": "tablestore", "endpoint": "http://127.0.0.1:1", "instance.name": "i", "table.name": "t",
                    "tunnel.name": "n", "minPartitions": "1"}).source.min_partitions == 1  # 1: never cut


# ------------------------------------------------------------------------------------- the local log in Spark
def _updates(log: LocalLog, rounds: int, keys: int) -> dict[str, float]:
    """``rounds`` appends, each updating every key (keys with quotes and backslashes): one segment each."""
    last: dict[str, float] = {}
    for n in range(rounds):
        rows = [{"id": f"k'{k}\\\"", "amount": float(n * keys + k), "_op": "insert" if n == 0 else "update"}
                for k in range(keys)]
        log.append(rows)
        last.update({r["id"]: r["amount"] for r in rows})  # type: ignore[misc]
    return last


def _new_log(tmp_path: Path) -> LocalLog:
    return LocalLog.create(tmp_path / "log", [("id", pa.string()), ("amount", pa.float64())], ["id"], channels=1)


def _pieces(df: Any) -> list[tuple[int, int, int]]:
    """(first position, last position, records) of each input partition of ``df``, in partition order; one
    Spark job."""
    from pyspark.sql import functions as F

    rows = (df.groupBy(F.spark_partition_id().alias("p"))
            .agg(F.min("_position").alias("lo"), F.max("_position").alias("hi"), F.count("*").alias("n")).collect())
    return [(r.lo, r.hi, r.n) for r in sorted(rows, key=lambda r: r.p)]


@pytest.mark.spark
def test_a_batch_read_in_pieces_holds_the_unsplit_records_and_seq_orders_each_key(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    log = _new_log(tmp_path)
    last = _updates(log, rounds=12, keys=25)
    df = (spark.read.format("cdc").option("backend", "local").option("path", str(log.path))
          .option("minPartitions", "4").load())
    rows = df.withColumn("task", F.spark_partition_id()).collect()
    tasks: dict[int, list[int]] = {}
    for r in rows:
        tasks.setdefault(r.task, []).append(r._position)
    # Four adjacent pieces of about equal size, cut at segment boundaries (one append of 25 records each).
    assert sorted((min(p), max(p) + 1, len(p)) for p in tasks.values()) == [
        (0, 75, 75), (75, 150, 75), (150, 225, 75), (225, 300, 75)]
    whole = log.read_all().to_pylist()
    assert sorted(tuple(r.asDict(recursive=True)[c] for c in ("_seq", "_position", "id", "amount", "_op"))
                  for r in rows) == sorted(tuple(r[c] for c in ("_seq", "_position", "id", "amount", "_op")) for r in whole)
    # What a foreachBatch user does: apply each key's changes in _seq order; the last one wins.
    applied: dict[str, float] = {}
    for r in sorted(rows, key=lambda r: r._seq):
        applied[r.id] = r.amount
    assert applied == last


@pytest.mark.spark
def test_a_replayed_streaming_batch_is_read_in_the_same_pieces(spark: Any, tmp_path: Path) -> None:
    """The driver stops after batch 0's output was written and before its commit (the commit file removed):
    the restarted query replays batch 0 from its logged offsets, and the records that arrived meanwhile
    change neither that batch nor its pieces."""
    log = _new_log(tmp_path)
    _updates(log, rounds=9, keys=10)
    ck = tmp_path / "ck"
    seen: list[tuple[int, list[tuple[int, int, int]]]] = []

    def run() -> None:
        q = (spark.readStream.format("cdc").option("backend", "local").option("path", str(log.path))
             .option("minPartitions", "3").load()
             .writeStream.foreachBatch(lambda df, batch_id: seen.append((batch_id, _pieces(df))))
             .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None

    run()
    assert seen == [(0, [(0, 29, 30), (30, 59, 30), (60, 89, 30)])]
    for name in ("0", ".0.crc"):
        (ck / "commits" / name).unlink(missing_ok=True)
    _updates(log, rounds=2, keys=10)
    run()
    assert seen[1] == seen[0]  # batch 0 again, cut the same way
    assert [b for b, _ in seen] == [0, 0, 1] and sum(n for _, _, n in seen[2][1]) == 20
