"""Crash hand-over: a driver process holding the tunnel's channels is killed (SIGKILL) right after a
partition split; the restarted run must deliver the split's children without waiting for the dead
client's heartbeat to expire (tunnel.client.timeoutSeconds), and must never shut down a live client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.backends.tablestore import handover
from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World, drain

TIMEOUT_S = 30  # the tunnel client's expiry: what a restart would wait without the hand-over

# A driver without Spark: plans and "commits" (acknowledges) batches like the source does, prints its
# end offset and tunnel client id, then keeps its heartbeat going until killed.
DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from cdc.backends.tablestore import TablestoreBackend
    from cdc.backends.tablestore.options import TablestoreOptions
    from cdc.options import parse
    from cdc.planner import Planner
    backend = TablestoreBackend(parse(TablestoreOptions, json.loads(sys.argv[1]), what="x"))
    planner = Planner(backend)
    offset = planner.initial("earliest")
    while True:
        end = planner.next(offset, 7)
        if end == offset:
            break
        backend.acknowledge({c: e["pos"] for c, e in end["channels"].items()})
        offset = end
    print(json.dumps({"offset": offset, "client": backend.session.client_id}), flush=True)
    time.sleep(3600)
    """
)


def start_driver(w: World, tmp_path: Path, **options: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(w.options(**options))],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the driver died"
    return proc, json.loads(line)


def kill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def restart_and_time(
    w: World, offset: dict[str, Any], expected: int, **options: str
) -> tuple[float, list[Any]]:
    """Run a fresh backend from ``offset`` until ``expected`` more records arrived; seconds it took."""
    backend = w.backend(**options)
    got: list[Any] = []
    began = time.monotonic()
    try:
        while len(got) < expected:
            assert time.monotonic() - began < TIMEOUT_S + 30, f"only {len(got)} of {expected} records"
            for end, table in drain(backend, offset):
                got += table.to_pylist()
                backend.acknowledge({c: e["pos"] for c, e in end["channels"].items()})
                offset = end
            if len(got) < expected:
                time.sleep(0.2)
        return time.monotonic() - began, got
    finally:
        backend.close()


def crash_after_split(w: World, tmp_path: Path, **options: str) -> tuple[dict[str, Any], str]:
    """The driver reads 30 rows and holds the channel; the shard splits; 20 rows go to the children;
    the driver is killed."""
    w.create_tunnel()
    w.put_many([(k, "a") for k in range(30)])
    proc, state = start_driver(w, tmp_path, **options)
    try:
        assert state["client"].startswith("cdc:")
        w.split()
        w.put_many([(k, "b") for k in range(0, 1000, 50)])
    finally:
        kill(proc)
    return state["offset"], state["client"]


def test_restart_after_kill_9_takes_over_without_waiting(
    tablestore_server: TablestoreProcess, tmp_path: Path
) -> None:
    w = World(tablestore_server, tunnel_type="Stream", key_range=(0, 1000))
    opts = {"tunnel.client.timeoutSeconds": str(TIMEOUT_S)}
    offset, dead = crash_after_split(w, tmp_path, **opts)
    took, got = restart_and_time(w, offset, 20, **opts)
    assert sorted(r["id"] for r in got) == list(range(0, 1000, 50)) and {r["v"] for r in got} == {"b"}
    print(f"hand-over: children delivered {took:.2f}s after the restart (client timeout {TIMEOUT_S}s)")
    assert took < TIMEOUT_S / 3, f"the restart waited {took:.1f}s: the dead client was not taken over"
    owners = {c.client_id for c in w.client.describe_tunnel(w.table, w.tunnel).channels}
    assert dead not in owners


@pytest.mark.slow
def test_without_hand_over_the_restart_waits_for_the_client_timeout(
    tablestore_server: TablestoreProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference: the same crash, with the hand-over disabled, waits for the dead client to expire."""
    w = World(tablestore_server, tunnel_type="Stream", key_range=(0, 1000))
    opts = {"tunnel.client.timeoutSeconds": "8"}
    offset, _ = crash_after_split(w, tmp_path, **opts)
    killed = time.monotonic()
    monkeypatch.setattr(handover, "is_stale", lambda client_id, me: None)
    took, got = restart_and_time(w, offset, 20, **opts)
    assert len(got) == 20
    print(f"no hand-over: children delivered {took:.2f}s after the restart (client timeout 8s)")
    assert time.monotonic() - killed >= 8 - 1


def test_a_live_client_of_another_process_is_left_alone(
    tablestore_server: TablestoreProcess, tmp_path: Path
) -> None:
    w = World(tablestore_server, tunnel_type="Stream", key_range=(0, 1000))
    w.create_tunnel()
    w.put_many([(k, "a") for k in range(10)])
    proc, state = start_driver(w, tmp_path)
    try:
        backend = w.backend()
        try:
            list(drain(backend))
            assert backend._take_over_stale_clients() == []
            owners = {c.client_id for c in w.client.describe_tunnel(w.table, w.tunnel).channels}
            assert state["client"] in owners  # the live driver still holds its channel
        finally:
            backend.close()
    finally:
        kill(proc)


def test_the_query_tag_takes_over_a_client_of_another_host(
    tablestore_server: TablestoreProcess, tmp_path: Path
) -> None:
    """With tunnel.client.tag, a client of another process of the same query is a leftover, even when its
    liveness cannot be checked (here: a live driver posing as one on another host)."""
    w = World(tablestore_server, tunnel_type="Stream", key_range=(0, 1000))
    w.create_tunnel()
    w.put_many([(k, "a") for k in range(10)])
    proc, state = start_driver(w, tmp_path, **{"tunnel.client.tag": "orders-etl"})
    try:
        me = handover.this_process("orders-etl")
        elsewhere = handover.ProcessId("orders-etl", "another-host", "1", 4242, "7")
        assert handover.is_stale(elsewhere.tag() + "x1", me) is not None
        assert (
            handover.is_stale(handover.ProcessId("", "another-host", "1", 4242, "7").tag() + "x", me) is None
        )
        assert handover.is_stale(me.tag() + "x2", me) is None  # never this very process
        assert handover.is_stale("myhost-0123abcd", me) is None  # a client of another kind
        backend = w.backend(**{"tunnel.client.tag": "orders-etl"})
        try:
            list(drain(backend))
            owners = {c.client_id for c in w.client.describe_tunnel(w.table, w.tunnel).channels}
            assert state["client"] not in owners
        finally:
            backend.close()
    finally:
        kill(proc)
