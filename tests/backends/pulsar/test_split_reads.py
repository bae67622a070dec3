"""``minPartitions`` over Pulsar: a partition's range cut before ledger entries the admin API lists.

The cut itself is pure (:class:`~cdc.backends.pulsar.ledgers.Ledgers`, over hand-made ledger lists); then on
Apache Pulsar, a partition whose messages span three ledgers is read in pieces that hold exactly the unsplit
read's messages, cut the same way after more were written; and a Spark batch read of a 2-partition topic in
six tasks delivers every message once, in order per key. The contract suite runs the unsplit/split
comparison on the ``apache-partitioned-admin`` harness, and the refusal without ``admin.url`` on the others.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.backends.pulsar.ledgers import Ledgers
from cdc.backends.pulsar.positions import Key, to_key
from cdc.partitions import split_ranges
from cdc.planner import Planner
from cdc.servers.pulsar import ApachePulsar
from cdc.testing import read_range
from tests.backends.pulsar.helpers import backend, produce


def _stats(*ledgers: tuple[int, int]) -> dict[str, Any]:
    return {"ledgers": [{"ledgerId": lid, "entries": n, "size": 0, "offloaded": False} for lid, n in ledgers]}


def test_cuts_fall_before_whole_entries_strictly_inside_the_range() -> None:
    # Ledgers 3 (10 entries), 7 (closed with none), 9 (4 entries), 12 (the open ledger: 0 listed).
    ledgers = Ledgers.from_stats(_stats((12, 0), (3, 10), (7, 0), (9, 4)))
    start, end = (3, 5, 2), (12, 3, -1)  # after message 2 of entry 5 ... up to entry 3 of the open ledger
    # Entries strictly between: 3:6..9 (4), 9:0..3 (4), 12:0..2 (3): 11 entries.
    assert ledgers.count(start, end) == 11
    # Cut nearest to 11/2 = 5.5 entries in: entry 5 of the 11 (ties go to the lower), which is 9:1.
    assert ledgers.cut_points(start, end, 2) == [[9, 1, -2]]
    assert ledgers.cut_points(start, end, 4) == [[3, 9, -2], [9, 1, -2], [12, 0, -2]]
    assert ledgers.cut_points(start, end, 1) == []
    assert ledgers.cut_points((12, 1, -1), (12, 2, -1), 4) == []  # no whole entry between the ends
    assert ledgers.cut_points([-1, -1, -1], (3, 3, 0), 3) == [[3, 1, -2], [3, 2, -2]]  # START: from entry 0


@st.composite
def _ranges(draw: st.DrawFn) -> tuple[Ledgers, Key, Key, int]:
    ids = sorted(draw(st.sets(st.integers(0, 40), min_size=1, max_size=6)))
    pairs = [(lid, draw(st.integers(0, 30))) for lid in ids[:-1]] + [(ids[-1], 0)]  # the last one open
    entries = [(lid, x) for lid, n in pairs for x in range(n)]
    keys = sorted(draw(st.lists(st.sampled_from(entries), min_size=2, max_size=2))) if entries else [(0, 0), (0, 0)]
    start = (*keys[0], draw(st.integers(-2, 3)))
    end = (*keys[1], draw(st.integers(-2, 3)))
    if end <= start:
        start, end = (-1, -1, -1), end
    return Ledgers(tuple(pairs)), start, end, draw(st.integers(1, 12))


@given(_ranges())
def test_cut_points_are_existing_entries_in_order_inside_the_range(case: tuple[Ledgers, Key, Key, int]) -> None:
    ledgers, start, end, parts = case
    cuts = ledgers.cut_points(start, end, parts)
    assert cuts == ledgers.cut_points(start, end, parts)
    assert len(cuts) <= parts - 1
    keys = [to_key(c) for c in cuts]
    assert keys == sorted(set(keys))
    closed = dict(ledgers.ledgers[:-1])
    for ledger, entry, batch in keys:
        assert batch == -2 and (start[0], start[1]) < (ledger, entry) < (end[0], end[1])
        assert entry < closed[ledger] if ledger in closed else entry < end[1]
    # every piece holds at least one whole entry: cuts are at least an entry apart, and past the start's
    firsts = [(start[0], start[1])] + [(k[0], k[1]) for k in keys]
    assert all(a < b for a, b in zip(firsts, firsts[1:], strict=False))
    if keys:
        assert ledgers.count(start, (*keys[0][:2], -2)) >= 1


# ------------------------------------------------------------------------------------- on Apache Pulsar
def test_a_range_over_three_ledgers_reads_the_same_in_pieces(broker: ApachePulsar, plain_topic: str) -> None:
    for round_ in range(3):
        produce(broker.url, plain_topic, [f"m{round_}-{i}".encode() for i in range(40)], batching=True)
        broker.unload(plain_topic)  # the next message opens a new ledger
    b = backend(broker.url, plain_topic, **{"admin.url": broker.admin_url})
    planner = Planner(b)
    start = planner.initial("earliest")
    end = planner.next(start)
    [whole_range] = planner.ranges(start, end)
    pieces = split_ranges([whole_range], 5, b)
    assert len(pieces) == 5
    assert len({p.end[0] for p in pieces[:-1]}) >= 2  # cut in more than one ledger
    whole = read_range(b, whole_range.channel, whole_range.start, whole_range.end)
    parts = [read_range(b, p.channel, p.start, p.end) for p in pieces]
    assert all(t.num_rows for t in parts) and whole.num_rows == 120
    assert pa.concat_tables(parts).equals(whole)
    produce(broker.url, plain_topic, [b"later"] * 10, batching=True)
    again = backend(broker.url, plain_topic, **{"admin.url": broker.admin_url})
    assert split_ranges(Planner.ranges(start, end), 5, again) == pieces


@pytest.mark.spark
def test_a_spark_batch_read_in_six_tasks_delivers_each_message_once_in_key_order(
    spark: Any, broker: ApachePulsar, topic: str
) -> None:
    import pulsar

    n = 600
    keys = [f"k{i % 17}" for i in range(n)]
    produce(broker.url, topic, [f"{keys[i]}:{i}".encode() for i in range(n)], keys, batching=True)
    df = (spark.read.format("cdc").option("backend", "pulsar").option("service.url", broker.url)
          .option("topic", topic).option("admin.url", broker.admin_url).option("minPartitions", "6").load())
    from pyspark.sql import functions as F

    rows = df.select(F.spark_partition_id().alias("task"), "value", F.col("__messageId").alias("mid")).collect()
    assert len({r.task for r in rows}) == 6
    values = [bytes(r.value).decode() for r in rows]
    assert sorted(values) == sorted(f"{keys[i]}:{i}" for i in range(n))
    # Per key, the message id orders the key's messages (the raw message schema has no _seq).
    by_key: dict[str, list[tuple[tuple[int, int, int], int]]] = {}
    for r, v in zip(rows, values, strict=True):
        mid = pulsar.MessageId.deserialize(bytes(r.mid))
        key, i = v.split(":")
        by_key.setdefault(key, []).append(((mid.ledger_id(), mid.entry_id(), mid.batch_index()), int(i)))
    for items in by_key.values():
        produced = [i for _, i in sorted(items)]
        assert produced == sorted(produced)

