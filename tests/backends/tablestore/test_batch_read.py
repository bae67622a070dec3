"""Batch reads to the head (``spark.read``): the plan leaves each channel's end to the reader instead of
walking every record on the driver (see "Batch reads" in :mod:`cdc.backends.tablestore.backend`)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.backends.tablestore import TablestoreBackend
from cdc.backends.tablestore.positions import HEAD_BOUND, TIME_BOUND
from cdc.planner import Planner
from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TablestoreProcess]:
    # One server for the module (each World has its own table and tunnel); at most 100 records per
    # ReadRecords, so every channel here is several responses long.
    proc = TablestoreProcess(
        tmp_path_factory.mktemp("ots") / "data",
        instance="batchread",
        access_key_id="batch-id",
        access_key_secret="batch-secret",
        max_records_per_read=100,
    )
    proc.start()
    yield proc
    proc.stop()


def count_reads(backend: TablestoreBackend) -> list[str]:
    """Record the channel of every ReadRecords call the driver's backend makes."""
    calls: list[str] = []
    read = backend.session.read

    def counted(channel: str, token: str) -> Any:
        calls.append(channel)
        return read(channel, token)

    backend.session.read = counted  # type: ignore[method-assign]
    return calls


def read_batch(backend: TablestoreBackend, start: Any, end: Any) -> list[dict[str, Any]]:
    """Every range of the batch ``(start, end]`` through a pickled reader, as an executor reads it."""
    reader = pickle.loads(pickle.dumps(backend.reader()))
    out: list[dict[str, Any]] = []
    for r in Planner.ranges(start, end):
        for batch in reader.read(r.channel, r.start, r.end):
            out += batch.to_pylist()
    return out


def test_plan_reads_one_response_per_channel_and_the_reader_reads_to_the_head(
    server: TablestoreProcess,
) -> None:
    w = World(server)
    w.create_tunnel()
    w.put_many([(i, f"a{i}") for i in range(600)])
    w.split()  # a finished parent and two children, each several responses long
    w.put_many([(i, f"b{i}") for i in range(600)])
    backend = w.backend()
    calls = count_reads(backend)
    planner = Planner(backend)
    start = planner.initial("earliest")
    end = planner.batch_end(start, "latest")
    channels = {r.channel for r in Planner.ranges(start, end)}
    assert len(channels) == 3
    # walking every token chain on the driver took 12 + 2 x 3 responses here
    assert len(calls) == len(channels), calls
    assert all(e["pos"]["last"][0] == HEAD_BOUND for e in end["channels"].values())

    got = read_batch(backend, start, end)
    assert sorted((r["id"], r["v"]) for r in got) == sorted(
        [(i, f"a{i}") for i in range(600)] + [(i, f"b{i}") for i in range(600)]
    )
    for cid in channels:  # positions count on from the channel's origin, in order
        assert [r["_position"] for r in got if r["_channel"] == cid] == list(
            range(sum(r["_channel"] == cid for r in got))
        )
    backend.close()


def test_a_batch_read_ends_at_what_was_committed_when_planned_and_rereads_the_same(
    server: TablestoreProcess,
) -> None:
    w = World(server)
    w.create_tunnel()
    w.put_many([(i, f"a{i}") for i in range(350)])
    backend = w.backend()
    planner = Planner(backend)
    start = planner.initial("earliest")
    end = planner.batch_end(start, "latest")
    w.put_many([(i, f"late{i}") for i in range(200)])  # after the plan: not in this batch
    first = read_batch(backend, start, end)
    assert [r["v"] for r in first] == [f"a{i}" for i in range(350)]
    assert read_batch(backend, start, end) == first  # a task retry reads the same records
    backend.close()


def test_streaming_and_budgeted_plans_still_count_their_ends(server: TablestoreProcess) -> None:
    w = World(server)
    w.create_tunnel()
    w.put_many([(i, f"a{i}") for i in range(350)])
    backend = w.backend()
    planner = Planner(backend)
    start = planner.initial("earliest")
    [channel] = start["channels"]
    # Trigger.AvailableNow: the target is latest(), the end goes into the offset log counted
    stream_end = planner.next(start, None, planner.until("latest"))
    pos = stream_end["channels"][channel]["pos"]
    assert pos["n"] == 350 and pos["last"][0] not in (HEAD_BOUND, TIME_BOUND)
    # maxRecordsPerChannel: a budget needs the count
    capped = Planner(backend, max_records_per_channel=120).batch_end(start, "latest")
    assert capped["channels"][channel]["pos"]["n"] == 120
    assert [r["v"] for r in read_batch(backend, start, capped)] == [f"a{i}" for i in range(120)]
    backend.close()


def test_base_data_channels_are_read_to_their_end(server: TablestoreProcess) -> None:
    w = World(server, tunnel_type="BaseAndStream")
    w.put_many([(i, f"base{i}") for i in range(250)])
    w.create_tunnel()
    w.put_many([(i, f"new{i}") for i in range(250, 300)])
    backend = w.backend()
    planner = Planner(backend)
    start = planner.initial("earliest")
    got = read_batch(backend, start, planner.batch_end(start, "latest"))
    snapshot = [r["id"] for r in got if r["_op"] == "snapshot"]
    assert snapshot == list(range(250))
    assert sorted(r["id"] for r in got if r["_op"] == "insert") == list(range(250, 300))
    backend.close()


@pytest.mark.slow  # a Spark job
def test_spark_batch_read_gets_every_record(spark: Any, server: TablestoreProcess) -> None:
    w = World(server)
    w.create_tunnel()
    w.put_many([(i, f"a{i}") for i in range(400)])
    w.split()
    w.put_many([(i, f"b{i}") for i in range(400)])
    reader = spark.read.format("cdc").option("backend", "tablestore")
    for k, v in w.options().items():
        reader = reader.option(k, v)
    rows = reader.load().select("_channel", "_position", "v").collect()
    assert sorted(r["v"] for r in rows) == sorted([f"a{i}" for i in range(400)] + [f"b{i}" for i in range(400)])
    assert len({(r["_channel"], r["_position"]) for r in rows}) == 800
