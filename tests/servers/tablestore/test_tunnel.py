"""The local server's Tunnel service: stages, channels, WAIT, tokens, checkpoints, splits and merges.

Calls go over the wire with the SDK's signer and transport and raw tunnel protobuf messages (not the
project's tunnel client), and every response's signature is checked as the SDK checks table calls.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tablestore import (
    OTSClient,
    Row,
)
from tablestore.retry import NoRetryPolicy

from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.plainbuffer import DELETE_ALL_VERSION, DELETE_ONE_VERSION, decode_row
from cdc.servers.tablestore import LocalTablestore, TablestoreProcess
from tests.servers.tablestore.tunnel_client import IGNORE, ServiceError, Tunnel, create_table, tunnel_of


def _ids(records: list[Any]) -> list[int]:
    return [decode_row(r.record).primary_key[0][1] for r in records]


def test_stream_tunnel_reads_changes_after_creation(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    client.put_row("t", Row([("id", -1)], [("v", "before")]), IGNORE)
    tid = tunnel.create("t", "cdc", pb.Stream)
    [channel] = tunnel.describe(tid).channels
    assert tunnel.describe(tid).tunnel.stage == "ProcessStream"
    assert channel.channel_type == "Stream" and channel.channel_status == "CLOSE" and not channel.sealed
    cid = tunnel.connect(tid)
    [held] = tunnel.heartbeat(tid, cid)
    assert held.channel_id == channel.channel_id and held.status == pb.OPEN
    assert tunnel.channels(tid)[channel.channel_id].channel_status == "OPEN"

    for i in range(250):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    client.update_row(
        "t", Row([("id", 1)], {"PUT": [("w", "x")], "DELETE": [("v", None, 5)], "DELETE_ALL": ["z"]}), IGNORE
    )
    client.delete_row("t", Row([("id", 2)]), IGNORE)

    token, seq = tunnel.get_checkpoint(tid, cid, channel.channel_id)
    assert seq == 0 and token == channel.start_token
    first = tunnel.read(tid, cid, channel.channel_id, token)
    assert len(first.records) == 100 and first.may_more_record  # the fixture's page size
    again = tunnel.read(tid, cid, channel.channel_id, token)
    assert [r.record for r in again.records] == [
        r.record for r in first.records
    ] and again.next_token == first.next_token
    records, last = tunnel.read_all(tid, cid, channel.channel_id, token)
    assert last != pb.FINISHED_TOKEN  # a live shard never finishes
    assert _ids(records) == [*range(250), 1, 2]
    assert [r.action_type for r in records[-3:]] == [pb.PUT_ROW, pb.UPDATE_ROW, pb.DELETE_ROW]
    rows = [decode_row(r.record) for r in records]
    seqs = [(r.sequence_info.epoch, r.sequence_info.timestamp, r.sequence_info.row_index) for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    update = rows[-2]
    assert [(c.name, c.cell_type) for c in update.cells] == [
        ("w", None),
        ("v", DELETE_ONE_VERSION),
        ("z", DELETE_ALL_VERSION),
    ]
    assert update.cells[1].timestamp == 5 and update.cells[0].timestamp > 0
    assert rows[-1].delete_marker and rows[-1].cells == ()
    assert rows[0].cells[0].value == 0 and rows[0].cells[0].timestamp > 1_600_000_000_000

    empty = tunnel.read(tid, cid, channel.channel_id, last)
    assert list(empty.records) == [] and empty.next_token == last
    client.put_row("t", Row([("id", 1000)], [("v", 1)]), IGNORE)
    assert _ids(tunnel.read(tid, cid, channel.channel_id, last).records) == [1000]


def test_checkpoint_sequence_numbers(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    tid = tunnel.create("t", "cdc", pb.Stream)
    cid = tunnel.connect(tid)
    [held] = tunnel.heartbeat(tid, cid)
    ch = held.channel_id
    for i in range(5):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    token, _ = tunnel.get_checkpoint(tid, cid, ch)
    after = tunnel.read(tid, cid, ch, token).next_token
    with pytest.raises(ServiceError) as mismatch:
        tunnel.checkpoint(tid, cid, ch, after, 2)
    assert mismatch.value.code == "OTSSequenceNumberNotMatch"
    tunnel.checkpoint(tid, cid, ch, after, 1)
    assert tunnel.get_checkpoint(tid, cid, ch) == (after, 1)
    with pytest.raises(ServiceError) as again:
        tunnel.checkpoint(tid, cid, ch, after, 1)
    assert again.value.code == "OTSSequenceNumberNotMatch"
    with pytest.raises(ServiceError) as open_finished:
        tunnel.checkpoint(tid, cid, ch, pb.FINISHED_TOKEN, 2)
    assert open_finished.value.code == "OTSParameterInvalid"
    with pytest.raises(ServiceError) as bad_token:
        tunnel.checkpoint(tid, cid, ch, "bm90LWEtdG9rZW4=", 2)
    assert bad_token.value.code == "OTSParameterInvalid"
    with pytest.raises(ServiceError) as bad_read:
        tunnel.read(tid, cid, ch, "garbage!")
    assert bad_read.value.code == "OTSParameterInvalid"
    other = tunnel.connect(tid)
    with pytest.raises(ServiceError) as not_owner:
        tunnel.checkpoint(tid, other, ch, after, 2)
    assert not_owner.value.code == "OTSPermissionDenied"
    # any live client of the tunnel may read
    assert _ids(tunnel.read(tid, other, ch, token).records) == list(range(5))


def test_expired_clients_get_resource_gone(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    tid = tunnel.create("t", "cdc", pb.Stream)
    cid = tunnel.connect(tid, timeout=1)
    [held] = tunnel.heartbeat(tid, cid)
    time.sleep(1.3)
    with pytest.raises(ServiceError) as gone:
        tunnel.heartbeat(tid, cid)
    assert gone.value.code == "OTSResourceGone"
    assert tunnel.channels(tid)[held.channel_id].channel_status == "CLOSE"  # freed for other clients
    cid2 = tunnel.connect(tid)
    tablestore_server.expire_client(cid2)
    with pytest.raises(ServiceError) as expired:
        tunnel.get_checkpoint(tid, cid2, held.channel_id)
    assert expired.value.code == "OTSResourceGone"
    with pytest.raises(ServiceError) as unknown:
        tunnel.read(tid, "no-such-client", held.channel_id, "x")
    assert unknown.value.code == "OTSResourceGone"


def test_tunnel_management(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    tid = tunnel.create("t", "a", pb.BaseData)
    with pytest.raises(ServiceError) as exists:
        tunnel.create("t", "a", pb.Stream)
    assert exists.value.code == "OTSTunnelExist"
    tunnel.create("t", "b", pb.Stream)
    listed = tunnel.call("list", pb.ListTunnelRequest(table_name="t"), pb.ListTunnelResponse).tunnels
    assert [(t.tunnel_name, t.tunnel_type, t.stage) for t in listed] == [
        ("a", "BaseData", "ProcessBaseData"),
        ("b", "Stream", "ProcessStream"),
    ]
    assert all(t.instance_name == tablestore_server.instance for t in listed)
    described = tunnel.call(
        "describe", pb.DescribeTunnelRequest(table_name="t", tunnel_name="a"), pb.DescribeTunnelResponse
    )
    assert described.tunnel.tunnel_id == tid
    tunnel.call("delete", pb.DeleteTunnelRequest(table_name="t", tunnel_name="a"), pb.DeleteTunnelResponse)
    listed = tunnel.call("list", pb.ListTunnelRequest(table_name="t"), pb.ListTunnelResponse).tunnels
    assert [t.tunnel_name for t in listed] == ["b"]
    cid = tunnel.connect(listed[0].tunnel_id)
    tunnel.call(
        "shutdown", pb.ShutdownRequest(tunnel_id=listed[0].tunnel_id, client_id=cid), pb.ShutdownResponse
    )
    with pytest.raises(ServiceError) as gone:
        tunnel.heartbeat(listed[0].tunnel_id, cid)
    assert gone.value.code == "OTSResourceGone"
    wrong = Tunnel(
        tablestore_server.endpoint, tablestore_server.access_key_id, "wrong", tablestore_server.instance
    )
    with pytest.raises(ServiceError) as auth:
        wrong.call("list", pb.ListTunnelRequest(), pb.ListTunnelResponse)
    assert auth.value.code == "OTSAuthFailed"


def test_base_and_stream_hand_off(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    for i in range(30):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    tablestore_server.split("t", split_key=[15])
    tid = tunnel.create("t", "full", pb.BaseAndStream)
    client.put_row("t", Row([("id", 5)], [("v", "after")]), IGNORE)  # after creation: stream only
    client.delete_row("t", Row([("id", 20)]), IGNORE)
    described = tunnel.describe(tid)
    assert described.tunnel.stage == "ProcessBaseData"
    base = [c for c in described.channels if c.channel_type == "BaseData"]
    stream = [c for c in described.channels if c.channel_type == "Stream"]
    assert len(base) == 2 and len(stream) == 2
    assert all(c.sealed for c in base) and all(c.channel_status == "WAIT" for c in stream)
    assert all(sorted(c.parent_channel_ids) == sorted(b.channel_id for b in base) for c in stream)
    cid = tunnel.connect(tid)
    held = {c.channel_id for c in tunnel.heartbeat(tid, cid)}
    assert held == {b.channel_id for b in base}  # WAIT channels are not handed out
    with pytest.raises(ServiceError) as waiting:
        tunnel.read(tid, cid, stream[0].channel_id, stream[0].start_token)
    assert waiting.value.code == "OTSPermissionDenied"

    snapshot: dict[int, Any] = {}
    for b in base:
        records, last = tunnel.read_all(tid, cid, b.channel_id, b.start_token)
        assert last == pb.FINISHED_TOKEN and all(r.action_type == pb.PUT_ROW for r in records)
        for r in records:
            row = decode_row(r.record)
            assert row.sequence_info is None
            snapshot[row.primary_key[0][1]] = row.cells[0].value
        tunnel.checkpoint(tid, cid, b.channel_id, pb.FINISHED_TOKEN, 1)
    assert snapshot == {i: i for i in range(30)}  # the snapshot as of creation
    described = tunnel.describe(tid)
    assert described.tunnel.stage == "ProcessStream"
    statuses = {c.channel_id: c.channel_status for c in described.channels}
    assert all(statuses[b.channel_id] == "TERMINATED" for b in base)
    assert all(statuses[s.channel_id] == "CLOSE" for s in stream)
    terminated = [c for c in tunnel.heartbeat(tid, cid) if c.status == pb.TERMINATED]
    assert {c.channel_id for c in terminated} == {b.channel_id for b in base}
    changes = []
    for s in stream:
        changes.extend(tunnel.read_all(tid, cid, s.channel_id, s.start_token)[0])
    assert sorted((r.action_type, _ids([r])[0]) for r in changes) == [(pb.PUT_ROW, 5), (pb.DELETE_ROW, 20)]


def test_split_and_merge_create_child_channels(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    tid = tunnel.create("t", "cdc", pb.Stream)
    cid = tunnel.connect(tid)
    [root] = tunnel.heartbeat(tid, cid)
    for i in range(10):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    split = tablestore_server.split("t")
    assert split["parent"] == root.channel_id
    for i in range(10):
        client.put_row("t", Row([("id", i)], [("v", i + 100)]), IGNORE)
    channels = tunnel.channels(tid)
    left, right = split["children"]
    assert channels[root.channel_id].sealed
    for child in (left, right):
        assert list(channels[child].parent_channel_ids) == [root.channel_id]
        assert channels[child].channel_status == "WAIT"
    records, last = tunnel.read_all(tid, cid, root.channel_id, channels[root.channel_id].start_token)
    assert last == pb.FINISHED_TOKEN and _ids(records) == list(range(10))
    tunnel.checkpoint(tid, cid, root.channel_id, pb.FINISHED_TOKEN, 1)
    assert {c: tunnel.channels(tid)[c].channel_status for c in (left, right)} == {
        left: "CLOSE",
        right: "CLOSE",
    }
    held = {c.channel_id: c.status for c in tunnel.heartbeat(tid, cid)}
    assert held == {root.channel_id: pb.TERMINATED, left: pb.OPEN, right: pb.OPEN}
    by_child = {
        c: _ids(tunnel.read_all(tid, cid, c, tunnel.channels(tid)[c].start_token)[0]) for c in (left, right)
    }
    assert sorted(by_child[left] + by_child[right]) == list(range(10))
    assert max(by_child[left]) < min(by_child[right])  # the left child holds the lower keys

    merged = tablestore_server.merge("t", [left, right])
    child = merged["child"]
    channels = tunnel.channels(tid)
    assert sorted(channels[child].parent_channel_ids) == sorted([left, right])
    assert channels[child].channel_status == "WAIT"
    tunnel.checkpoint(tid, cid, left, pb.FINISHED_TOKEN, 1)
    assert tunnel.channels(tid)[child].channel_status == "WAIT"  # one parent left
    tunnel.checkpoint(tid, cid, right, pb.FINISHED_TOKEN, 1)
    assert tunnel.channels(tid)[child].channel_status == "CLOSE"
    client.put_row("t", Row([("id", 3)], [("v", "merged")]), IGNORE)
    assert _ids(tunnel.read_all(tid, cid, child, tunnel.channels(tid)[child].start_token)[0]) == [3]
    shards = {s["shard_id"]: s for s in tablestore_server.shards("t")}
    assert shards[child]["parents"] == [left, right] and not shards[child]["sealed"]


def test_restart_keeps_tunnels_logs_and_checkpoints(tablestore_server: TablestoreProcess) -> None:
    client, tunnel = tablestore_server.ots_client(), tunnel_of(tablestore_server)
    create_table(client)
    tid = tunnel.create("t", "cdc", pb.Stream)
    cid = tunnel.connect(tid, timeout=600)
    [held] = tunnel.heartbeat(tid, cid)
    for i in range(150):
        client.put_row("t", Row([("id", i)], [("v", i)]), IGNORE)
    token = tunnel.get_checkpoint(tid, cid, held.channel_id)[0]
    page = tunnel.read(tid, cid, held.channel_id, token)
    tunnel.checkpoint(tid, cid, held.channel_id, page.next_token, 1)
    tablestore_server.restart(crash=True)
    tunnel = tunnel_of(tablestore_server)
    assert tunnel.get_checkpoint(tid, cid, held.channel_id) == (page.next_token, 1)  # the client survived too
    again = tunnel.read(tid, cid, held.channel_id, token)
    assert [r.record for r in again.records] == [r.record for r in page.records]
    records, _ = tunnel.read_all(tid, cid, held.channel_id, page.next_token)
    assert _ids(records) == list(range(100, 150))
    tablestore_server.ots_client().put_row("t", Row([("id", 7)], [("v", 1)]), IGNORE)
    new = tunnel.read_all(tid, cid, held.channel_id, page.next_token)[0]
    new_rows = [decode_row(r.record) for r in new]
    old_rows = [decode_row(r.record) for r in records]
    assert (
        new_rows[-1].sequence_info.timestamp > old_rows[-1].sequence_info.timestamp
    )  # order survives restart


# ------------------------------------------------------------------------------------------ property

writes = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 40)),
        st.tuples(st.just("update"), st.integers(0, 40)),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(st.sampled_from(["split", "split", "merge"]), st.integers(0, 40)),
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=40)
@given(st.integers(0, 15), writes, st.sampled_from([pb.Stream, pb.BaseAndStream]))
def test_every_change_exactly_once_in_order_per_key(
    tmp_path_factory: Any, initial: int, ops: list[tuple[str, int]], kind: int
) -> None:
    """Random writes, splits and merges; reading the tunnel parents-first yields each key's changes in order."""
    with LocalTablestore(tmp_path_factory.mktemp("prop"), max_records_per_read=7) as server:
        client = OTSClient(
            server.endpoint,
            server.access_key_id,
            server.access_key_secret,
            server.instance,
            retry_policy=NoRetryPolicy(),
        )
        tunnel = tunnel_of(server)
        create_table(client)
        state: dict[int, int] = {}
        for key in range(initial):
            client.put_row("t", Row([("id", key)], [("v", -1)]), IGNORE)
            state[key] = -1
        tid = tunnel.create("t", "cdc", kind)
        expected: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        if kind == pb.BaseAndStream:
            for key, value in state.items():
                expected[key].append((pb.PUT_ROW, value))
        for n, (op, arg) in enumerate(ops):
            if op == "put":
                client.put_row("t", Row([("id", arg)], [("v", n)]), IGNORE)
                expected[arg].append((pb.PUT_ROW, n))
            elif op == "update":
                client.update_row("t", Row([("id", arg)], {"PUT": [("v", n)]}), IGNORE)
                expected[arg].append((pb.UPDATE_ROW, n))
            elif op == "delete":
                client.delete_row("t", Row([("id", arg)]), IGNORE)
                expected[arg].append((pb.DELETE_ROW, None))
            elif op == "split":
                open_shards = [s for s in server.store.shards("t") if not s["sealed"]]
                shard = open_shards[arg % len(open_shards)]
                lo = shard["lo"][0] if shard["lo"] else -1
                hi = shard["hi"][0] if shard["hi"] else 41
                if hi - lo >= 2:
                    server.store.split("t", shard["shard_id"], [(lo + hi) // 2])
            else:
                open_shards = sorted(
                    (s for s in server.store.shards("t") if not s["sealed"]), key=lambda s: s["lo"] or [-1]
                )
                if len(open_shards) >= 2:
                    i = arg % (len(open_shards) - 1)
                    server.store.merge("t", [open_shards[i]["shard_id"], open_shards[i + 1]["shard_id"]])

        shard_count = len(server.store.shards("t"))
        event(f"shards: {'1' if shard_count == 1 else '3-5' if shard_count <= 5 else '6+'}")
        # Drain like a correct consumer: a channel only once every parent is finished.
        cid = tunnel.connect(tid)
        seen: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        seqnos: dict[str, int] = defaultdict(int)
        for _ in range(200):
            channels = tunnel.channels(tid)
            ready = [c for c in channels.values() if c.channel_status in ("OPEN", "CLOSE")]
            if not ready:
                break
            progressed = False
            for c in ready:
                assert all(channels[p].channel_status == "TERMINATED" for p in c.parent_channel_ids)
                token, _ = tunnel.get_checkpoint(tid, cid, c.channel_id)
                records, last = tunnel.read_all(tid, cid, c.channel_id, token)
                for r in records:
                    row = decode_row(r.record)
                    value = row.cells[0].value if row.cells else None
                    seen[row.primary_key[0][1]].append((r.action_type, value))
                if last == pb.FINISHED_TOKEN:
                    seqnos[c.channel_id] += 1
                    tunnel.checkpoint(tid, cid, c.channel_id, last, seqnos[c.channel_id])
                    progressed = True
                elif records:
                    seqnos[c.channel_id] += 1
                    tunnel.checkpoint(tid, cid, c.channel_id, last, seqnos[c.channel_id])
            if not progressed:
                break
        assert dict(seen) == dict(expected)


def test_reads_stop_at_a_size_limit(tmp_path: Any) -> None:
    from cdc.servers.tablestore import sessions

    with LocalTablestore(tmp_path, max_records_per_read=1000) as server:
        client = OTSClient(
            server.endpoint,
            server.access_key_id,
            server.access_key_secret,
            server.instance,
            retry_policy=NoRetryPolicy(),
        )
        tunnel = tunnel_of(server)
        create_table(client)
        tid = tunnel.create("t", "cdc", pb.Stream)
        cid = tunnel.connect(tid)
        [held] = tunnel.heartbeat(tid, cid)
        blob = "x" * (sessions.MAX_BYTES_PER_READ // 4)
        for i in range(10):
            client.put_row("t", Row([("id", i)], [("v", blob)]), IGNORE)
        token = tunnel.get_checkpoint(tid, cid, held.channel_id)[0]
        first = tunnel.read(tid, cid, held.channel_id, token)
        assert len(first.records) == 3 and first.may_more_record  # ~4 MiB (records are just over 1 MiB)
        records, _ = tunnel.read_all(tid, cid, held.channel_id, token)
        assert _ids(records) == list(range(10))
