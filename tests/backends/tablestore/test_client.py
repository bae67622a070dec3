"""The tunnel client against the local Tablestore server: every call, typed errors, retries under faults."""

from __future__ import annotations

import pickle
import time

import pytest

from cdc.backends.tablestore import errors as E
from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.connection import RetrySettings, TunnelClient
from cdc.backends.tablestore.plainbuffer import decode_row
from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World


def client(server: TablestoreProcess, **kw: object) -> TunnelClient:
    return TunnelClient(
        server.endpoint, server.instance, server.access_key_id, server.access_key_secret, **kw
    )  # type: ignore[arg-type]


def test_tunnel_lifecycle(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="BaseAndStream")
    w.put_many([(i, f"v{i}") for i in range(5)])
    c = w.client
    tunnel_id = c.create_tunnel(w.table, "t1", "BaseAndStream")
    with pytest.raises(E.TunnelExistError):
        c.create_tunnel(w.table, "t1", "Stream")
    stream_id = c.create_tunnel(w.table, "t2", "Stream")
    assert {t.tunnel_name for t in c.list_tunnels(w.table)} == {"t1", "t2"}

    d = c.describe_tunnel(w.table, "t1")
    assert d.tunnel.tunnel_id == tunnel_id and d.tunnel.tunnel_type == "BaseAndStream"
    assert d.tunnel.stage == "ProcessBaseData"
    kinds = {ch.channel_type: ch for ch in d.channels}
    assert set(kinds) == {"BaseData", "Stream"}
    base, stream = kinds["BaseData"], kinds["Stream"]
    assert base.sealed and not stream.sealed and base.start_token
    assert list(stream.parent_channel_ids) == [base.channel_id]  # the lineage extension
    assert stream.channel_status == "WAIT"

    c.delete_tunnel(w.table, "t2", stream_id)
    assert {t.tunnel_name for t in c.list_tunnels(w.table)} == {"t1"}
    with pytest.raises(E.TablestoreServiceError):
        c.describe_tunnel(w.table, "t2")


def test_read_records_and_checkpoint_sequence_numbers(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    tunnel_id = w.create_tunnel()
    w.put_many([(i, f"v{i}") for i in range(250)])  # > one read (the fixture's server reads 100 at most)
    c = w.client
    client_id = c.connect(tunnel_id, timeout_s=30)
    held = c.heartbeat(tunnel_id, client_id)
    (channel,) = [ch.channel_id for ch in held]
    assert held[0].status == pb.OPEN

    token, seq = c.get_checkpoint(tunnel_id, client_id, channel)
    assert seq == 0
    keys = []
    while True:
        page = c.read_records(tunnel_id, client_id, channel, token)
        keys += [decode_row(r.record).primary_key[0][1] for r in page.records]
        assert all(r.action_type == pb.PUT_ROW for r in page.records)
        if not page.records:
            break
        seq += 1
        c.checkpoint(tunnel_id, client_id, channel, page.next_token, seq)
        token = page.next_token
    assert keys == list(range(250))
    assert c.get_checkpoint(tunnel_id, client_id, channel) == (token, seq)
    with pytest.raises(E.SequenceNumberMismatchError):
        c.checkpoint(tunnel_id, client_id, channel, token, seq)  # not last + 1
    # the same token reads the same records
    again = c.read_records(tunnel_id, client_id, channel, token)
    assert again.records == [] and again.next_token == token and not again.finished
    c.shutdown(tunnel_id, client_id)
    with pytest.raises(E.ResourceGoneError):
        c.heartbeat(tunnel_id, client_id)


def test_wrong_secret_is_auth_failed_and_not_retried(tablestore_server: TablestoreProcess) -> None:
    bad = TunnelClient(
        tablestore_server.endpoint,
        tablestore_server.instance,
        tablestore_server.access_key_id,
        "wrong-secret",
    )
    t0 = time.monotonic()
    with pytest.raises(E.AuthFailedError) as info:
        bad.list_tunnels()
    assert time.monotonic() - t0 < 2
    assert "wrong-secret" not in str(info.value) and "wrong-secret" not in repr(bad)


def test_expired_client_is_resource_gone(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server)
    tunnel_id = w.create_tunnel()
    cid = w.client.connect(tunnel_id)
    tablestore_server.expire_client(cid)
    with pytest.raises(E.ResourceGoneError):
        w.client.heartbeat(tunnel_id, cid)


def test_unavailable_and_dropped_connections_are_retried(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server)
    w.create_tunnel()
    c = client(tablestore_server, retry=RetrySettings(attempts=4, initial=0.01, maximum=0.05))
    tablestore_server.fault("unavailable", count=3, path_prefix="/tunnel/")
    assert len(c.list_tunnels(w.table)) == 1  # three 503s, then success
    tablestore_server.fault("drop", count=2, path_prefix="/tunnel/")
    assert len(c.list_tunnels(w.table)) == 1
    tablestore_server.fault("unavailable", count=-1, path_prefix="/tunnel/")
    with pytest.raises(E.TablestoreTransientError):
        c.list_tunnels(w.table)
    tablestore_server.clear_faults()
    assert len(c.list_tunnels(w.table)) == 1


def test_slow_responses_time_out_and_are_retried(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server)
    w.create_tunnel()
    c = client(
        tablestore_server, socket_timeout=0.3, retry=RetrySettings(attempts=3, initial=0.01, maximum=0.05)
    )
    tablestore_server.fault("delay", count=1, seconds=1.0, path_prefix="/tunnel/")
    assert len(c.list_tunnels(w.table)) == 1  # the first try times out
    tablestore_server.fault("delay", count=-1, seconds=1.0, path_prefix="/tunnel/")
    with pytest.raises(E.ConnectionFailedError):
        c.list_tunnels(w.table)
    tablestore_server.clear_faults()


def test_client_pickles_without_its_pool(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server)
    w.create_tunnel()
    c = w.client
    c.list_tunnels(w.table)
    back = pickle.loads(pickle.dumps(c))
    assert back._pool is None and len(back.list_tunnels(w.table)) == 1
