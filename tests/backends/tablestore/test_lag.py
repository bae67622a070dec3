"""Lag per channel on the Tablestore backend against the local server: records behind a known backlog, the
commit times from the records' sequence info, and the tunnel's RPO, which the server computes from the
channel's checkpoint (the SDKs show ``now - channel_rpo``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from cdc.planner import Planner
from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World


def test_heads_count_the_backlog_and_the_rpo_follows_the_checkpoint(
    tablestore_server: TablestoreProcess,
) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    before = datetime.now(UTC)
    w.put_many([(i, "a") for i in range(25)])
    backend = w.backend()
    (channel,) = [c.id for c in backend.list_channels()]
    planner = Planner(backend)
    start = planner.initial("earliest")
    end = planner.next(start, 10)
    pos = end["channels"][channel]["pos"]

    head = backend.heads({channel: pos})[channel]
    assert head.behind == 15
    assert head.head_time is not None and head.position_time is not None
    assert before - (head.head_time - before) <= head.position_time <= head.head_time <= datetime.now(UTC)
    # nothing checkpointed yet: the consumption point is before the first change, so the RPO is its age
    time.sleep(0.3)
    rpo = backend.heads({channel: pos})[channel].measures["rpoMs"]
    assert rpo >= 300
    described = w.client.describe_tunnel(w.table, w.tunnel)
    assert described.tunnel_rpo == described.channels[0].channel_rpo > 0

    # read and checkpointed everything: nothing behind, the consumption point is now
    final = planner.next(end, None)
    backend.acknowledge({channel: final["channels"][channel]["pos"]})
    caught_up = backend.heads({channel: final["channels"][channel]["pos"]})[channel]
    assert caught_up.behind == 0 and caught_up.measures["rpoMs"] < 300
    backend.close()


def test_starting_timestamp_skips_the_changes_committed_before_it(
    tablestore_server: TablestoreProcess,
) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(i, "early") for i in range(12)])
    time.sleep(0.05)
    cut = datetime.now(UTC)
    time.sleep(0.05)
    w.put_many([(i, "late") for i in range(12, 20)])
    backend = w.backend()
    planner = Planner(backend)
    start = planner.initial("earliest", cut)
    (channel,) = start["channels"]
    assert start["channels"][channel]["pos"]["n"] == 12
    end = planner.next(start, None)
    rows = [
        r
        for t in backend.reader().read(
            channel, start["channels"][channel]["pos"], end["channels"][channel]["pos"]
        )
        for r in t.to_pylist()
    ]
    assert sorted(r["id"] for r in rows) == list(range(12, 20)) and {r["v"] for r in rows} == {"late"}
    # before every change: the channel's beginning; after every change: its head
    assert backend.position_at(channel, cut - timedelta(hours=1))["n"] == 0
    assert backend.position_at(channel, cut + timedelta(hours=1))["n"] == 20
    backend.close()
