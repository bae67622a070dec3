"""The local server's command line, admin endpoints and tunnel-path faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tablestore import (
    CapacityUnit,
    Condition,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    TableMeta,
    TableOptions,
)

from cdc.backends.tablestore import tunnel_pb as pb
from cdc.servers.tablestore import AdminClient, TablestoreProcess
from tests.servers.tablestore.tunnel_client import ServiceError, tunnel_of

IGNORE = Condition(RowExistenceExpectation.IGNORE)


def _cli(server: TablestoreProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CDC_TABLESTORE_ACCESS_KEY_SECRET=server.access_key_secret)
    return subprocess.run(
        [sys.executable, "-m", "cdc.servers.tablestore", *args, "--endpoint", server.endpoint],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_splits_merges_and_lists_shards(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    client.create_table(
        TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )
    for i in range(20):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    done = _cli(tablestore_server, "split", "--table", "t", "--split-key", "[7]")
    assert done.returncode == 0, done.stderr
    children = json.loads(done.stdout)["children"]
    shards = json.loads(_cli(tablestore_server, "shards", "--table", "t").stdout)
    by_id = {s["shard_id"]: s for s in shards}
    assert by_id[children[0]]["hi"] == [7] and by_id[children[1]]["lo"] == [7]
    done = _cli(
        tablestore_server, "merge", "--table", "t", "--shard-id", children[0], "--shard-id", children[1]
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)["child"]
    assert {s["shard_id"] for s in tablestore_server.shards("t") if not s["sealed"]} == {child}
    refused = _cli(tablestore_server, "split", "--table", "t", "--shard-id", children[0])
    assert (
        refused.returncode == 1
        and "is not an open shard" in refused.stderr
        and "Traceback" not in refused.stderr
    )


def test_cli_serve_needs_a_data_dir() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cdc.servers.tablestore", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "--data-dir" in done.stderr


def test_admin_calls_need_the_secret(tablestore_server: TablestoreProcess) -> None:
    impostor = AdminClient(tablestore_server.endpoint, "not-the-secret")
    with pytest.raises(RuntimeError, match="403"):
        impostor.fault("unavailable")
    assert impostor.healthy()  # the health probe is open
    with pytest.raises(RuntimeError, match="does not exist"):
        tablestore_server.split("no-such-table")
    with pytest.raises(RuntimeError, match="expected unavailable, drop, delay or clear"):
        tablestore_server.fault("explode")


def test_tunnel_faults_and_heartbeat_release(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    client.create_table(
        TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )
    tid = tunnel.create("t", "cdc", pb.Stream)
    cid = tunnel.connect(tid)
    [held] = tunnel.heartbeat(tid, cid)
    tablestore_server.fault("unavailable", count=1, path_prefix="/tunnel/readrecords")
    with pytest.raises(ServiceError) as unavailable:
        tunnel.read(tid, cid, held.channel_id, tunnel.get_checkpoint(tid, cid, held.channel_id)[0])
    assert unavailable.value.code == "OTSTunnelServerUnavailable"
    token = tunnel.get_checkpoint(tid, cid, held.channel_id)[0]
    assert list(tunnel.read(tid, cid, held.channel_id, token).records) == []
    # a client that reports a channel CLOSE gives it back; another client's heartbeat takes it
    released = pb.Channel(channel_id=held.channel_id, version=held.version, status=pb.CLOSE)
    assert tunnel.heartbeat(tid, cid, [released]) == []
    assert tunnel.channels(tid)[held.channel_id].channel_status == "CLOSE"
    other = tunnel.connect(tid)
    [taken] = tunnel.heartbeat(tid, other)
    assert taken.channel_id == held.channel_id and taken.version > held.version and taken.status == pb.OPEN
    assert tunnel.channels(tid)[held.channel_id].client_id == other
    assert tunnel.heartbeat(tid, cid) == []  # held by a live client: not handed to another


def test_trimmed_log_gives_trimmed_data_access(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    client.create_table(
        TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )
    tid = tunnel.create("t", "cdc", pb.Stream)
    cid = tunnel.connect(tid)
    [held] = tunnel.heartbeat(tid, cid)
    for i in range(3):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    start = tunnel.get_checkpoint(tid, cid, held.channel_id)[0]
    first = tunnel.read(tid, cid, held.channel_id, start)
    assert len(first.records) == 3
    trimmed = tablestore_server.trim("t")
    assert trimmed == {held.channel_id: 3}
    client.put_row("t", Row([("id", 9)], [("v", 9)]), IGNORE)
    with pytest.raises(ServiceError) as lost:
        tunnel.read(tid, cid, held.channel_id, start)
    # as the service reports it: code OTSTunnelServerUnavailable, message starting OTSTrimmedDataAccess
    assert lost.value.code == "OTSTunnelServerUnavailable"
    assert str(lost.value).startswith(
        "OTSTunnelServerUnavailable: OTSTrimmedDataAccess Requested stream data"
    )
    after = tunnel.read(tid, cid, held.channel_id, first.next_token)  # at the trim point: still readable
    assert [r.action_type for r in after.records] == [pb.PUT_ROW]
    # the channel's start token (our extension) moved to the first record still held
    assert tunnel.channels(tid)[held.channel_id].start_token == first.next_token
    assert not tunnel.describe(tid).tunnel.expired  # a Stream tunnel does not expire: its reads fail


def test_base_and_stream_tunnel_expires_when_its_stream_log_is_trimmed_during_base_data(
    tablestore_server: TablestoreProcess,
) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    client.create_table(
        TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )
    client.put_row("t", Row([("id", 0)], [("v", 0)]), IGNORE)
    done = tunnel.create("t", "done", pb.BaseAndStream)
    tid = tunnel.create("t", "cdc", pb.BaseAndStream)
    cid = tunnel.connect(tid)
    # "done" finishes its base data: its stream stage has begun, so a trim is only data loss for it
    dcid = tunnel.connect(done)
    for ch in tunnel.channels(done).values():
        if ch.channel_type == "BaseData":
            tunnel.checkpoint(done, dcid, ch.channel_id, "finished", 1)
    assert tunnel.describe(done).tunnel.stage == "ProcessStream"
    client.put_row("t", Row([("id", 1)], [("v", 1)]), IGNORE)
    tablestore_server.trim("t")
    info = tunnel.describe(tid)
    assert info.tunnel.expired and info.tunnel.stage == "ProcessBaseData"
    for call in (lambda: tunnel.connect(tid), lambda: tunnel.heartbeat(tid, cid)):
        with pytest.raises(ServiceError) as gone:
            call()
        assert gone.value.code == "OTSTunnelExpired" and tid in str(gone.value)
    assert not tunnel.describe(done).tunnel.expired
    tunnel.call("delete", pb.DeleteTunnelRequest(table_name="t", tunnel_name="cdc"), pb.DeleteTunnelResponse)
    assert [
        t.tunnel_name
        for t in tunnel.call("list", pb.ListTunnelRequest(table_name="t"), pb.ListTunnelResponse).tunnels
    ] == ["done"]
