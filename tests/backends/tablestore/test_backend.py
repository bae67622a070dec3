"""The Tablestore backend against the local server: base data then changes, lineage, the tunnel's
checkpoints, determinism when the server cuts responses differently, restarts of the reader and the
server, faults."""

from __future__ import annotations

import pickle
import time
from typing import Any

import pyarrow as pa
import pytest

from cdc.backends.tablestore import TablestoreBackend
from cdc.backends.tablestore.errors import TunnelExpiredError
from cdc.backends.tablestore.options import TablestoreOptions
from cdc.errors import DataLossError, OptionError
from cdc.options import parse
from cdc.planner import Planner
from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World, drain


def rows(tables: list[pa.Table]) -> list[dict[str, Any]]:
    return [r for t in tables for r in t.to_pylist()]


def test_base_data_then_changes_in_order_with_checkpoints(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="BaseAndStream")
    w.put_many([(i, f"v{i}") for i in range(30)])
    backend = TablestoreBackend(
        parse(
            TablestoreOptions,
            w.options(createTunnelIfMissing="true", **{"tunnel.type": "BaseAndStream"}),
            what="x",
        )
    )
    w.tunnel_id = backend.tunnel_id
    w.update(3, "u3")
    w.delete(4)
    w.put(100, "new", 7)

    planner = Planner(backend)
    offset = planner.initial("earliest")
    delivered: list[dict[str, Any]] = []
    for end, table in drain(backend, offset, limit=8):
        delivered += table.to_pylist()
        backend.acknowledge({c: e["pos"] for c, e in end["channels"].items()})
        offset = end
    ops = [r["_op"] for r in delivered]
    assert ops == ["snapshot"] * 30 + ["update", "delete", "insert"]
    # maxBytesPerTrigger's estimate: the PlainBuffer bytes of the records planning read, per record
    assert 10 < backend.average_record_bytes() < 200  # type: ignore[operator]
    assert [r["id"] for r in delivered[:30]] == list(range(30))
    assert delivered[30]["v"] == "u3" and delivered[30]["__ots_column_type_n"] == "DELETE_ALL_VERSION"
    assert delivered[30]["__ots_record_type__"] == "UPDATE"
    assert delivered[32]["n"] == 7 and delivered[32]["__ots_column_type_v"] == "PUT"
    seqs = [r["_seq"] for r in delivered[30:]]
    assert seqs == sorted(seqs) and seqs[0] > 30  # changes sort after the snapshot

    # the tunnel's own view: every channel checkpointed at the committed token, sequence numbers in order
    d = w.client.describe_tunnel(w.table, w.tunnel)
    assert d.tunnel.stage == "ProcessStream"
    cid = w.client.connect(backend.tunnel_id)
    for ch in d.channels:
        token, seq = w.client.get_checkpoint(backend.tunnel_id, cid, ch.channel_id)
        assert token == offset["channels"][ch.channel_id]["pos"]["token"]
        assert seq >= 1
    backend.close()


def test_split_and_merge_children_follow_their_parents(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(i, "a") for i in range(0, 1000, 10)])
    left, right = w.split()
    w.put_many([(i, "b") for i in range(0, 1000, 10)])
    child = w.merge([left, right])
    w.put_many([(i, "c") for i in range(0, 1000, 10)])
    backend = w.backend()
    infos = {c.id: c for c in backend.list_channels()}
    assert set(infos[child].parents) == {left, right}
    assert infos[left].finished and infos[right].finished and not infos[child].finished

    delivered = rows([t for _, t in drain(backend, limit=37)])
    assert len(delivered) == 300
    per_key: dict[int, list[str]] = {}
    for r in delivered:
        per_key.setdefault(r["id"], []).append(r["v"])
    assert all(v == ["a", "b", "c"] for v in per_key.values())
    backend.close()


def test_ranges_survive_a_server_that_cuts_responses_differently(
    tablestore_server: TablestoreProcess,
) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(i, f"v{i}") for i in range(150)])
    backend = w.backend()
    (ch,) = [c.id for c in backend.list_channels()]
    start = backend.earliest(ch)
    mid = backend.plan(ch, start, max_records=130).end  # planned with reads of 100
    reader = pickle.loads(pickle.dumps(backend.reader()))
    first = pa.Table.from_batches(list(reader.read(ch, start, mid)))
    w.put_many([(i, "later") for i in range(150, 160)])

    tablestore_server.max_records_per_read = 7
    tablestore_server.restart(crash=True)
    again = pa.Table.from_batches(list(reader.read(ch, start, mid)))
    assert again.equals(first) and first.num_rows == 130
    backend.close()
    later = w.backend()
    try:
        rest = later.plan(ch, mid)
    finally:
        later.close()
    assert rest.records == 30


def test_restarted_reader_continues_exactly_once(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="BaseAndStream")
    w.put_many([(i, "base") for i in range(40)])
    w.create_tunnel()
    for i in range(40):
        w.update(i, f"u{i}")
    offsets: list[dict[str, Any]] = []
    delivered: list[dict[str, Any]] = []
    backend = w.backend()
    for n, (end, table) in enumerate(drain(backend, limit=15)):
        delivered += table.to_pylist()
        offsets.append(end)
        if n == 2:
            break
    backend.close()  # the query stops; a new one resumes from the last offset in its log
    w.split()
    for i in range(40):
        w.update(i, f"w{i}")
    backend = w.backend()
    delivered += rows([t for _, t in drain(backend, offsets[-1], limit=15)])
    per_key: dict[int, list[str]] = {}
    for r in delivered:
        per_key.setdefault(r["id"], []).append(r["v"])
    assert per_key == {i: ["base", f"u{i}", f"w{i}"] for i in range(40)}
    backend.close()


def test_server_killed_mid_stream(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="Stream", extra_options={"retry.maxAttempts": "30"})
    w.create_tunnel()
    w.put_many([(i, "a") for i in range(100)])
    backend = w.backend()
    planner = Planner(backend)
    start = planner.initial("earliest")
    end = planner.next(start, 60)
    tablestore_server.kill()
    tablestore_server.start()  # the same port and data directory: nothing acknowledged is lost
    reader = pickle.loads(pickle.dumps(backend.reader()))  # its client id was persisted by the server
    got = rows(
        [
            pa.Table.from_batches(list(reader.read(r.channel, r.start, r.end)))
            for r in planner.ranges(start, end)
        ]
    )
    got += rows([t for _, t in drain(backend, end)])
    assert sorted(r["id"] for r in got) == list(range(100))
    backend.close()


def test_transient_faults_during_reads_are_retried(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(i, "a") for i in range(50)])
    backend = w.backend()
    tablestore_server.fault("unavailable", count=2, path_prefix="/tunnel/readrecords")
    tablestore_server.fault("drop", count=1, path_prefix="/tunnel/readrecords")
    assert sum(t.num_rows for _, t in drain(backend, limit=20)) == 50
    backend.close()


def test_expired_driver_client_reconnects(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(i, "a") for i in range(20)])
    backend = w.backend()
    (ch,) = [c.id for c in backend.list_channels()]
    backend.plan(ch, backend.earliest(ch), 5)
    old = backend.session.client_id
    assert old is not None
    tablestore_server.expire_client(old)
    assert backend.plan(ch, backend.earliest(ch)).records == 20
    assert backend.session.client_id != old
    backend.close()


def test_missing_tunnel_names_the_option(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server)
    with pytest.raises(OptionError, match="createTunnelIfMissing"):
        TablestoreBackend(parse(TablestoreOptions, w.options(), what="x"))
    with pytest.raises(OptionError, match="tunnel.id"):
        TablestoreBackend(
            parse(TablestoreOptions, {**w.options(), "tunnel.name": "", "tunnel.id": "nope"}, what="x")
        )


def test_available_now_bound_covers_waiting_children(tablestore_server: TablestoreProcess) -> None:
    """Trigger.AvailableNow freezes ``latest`` of every channel: a child still in WAIT (its parent not
    yet delivered) is bounded by time, so its records committed before the trigger are included and
    later ones are not."""
    w = World(tablestore_server, tunnel_type="BaseAndStream")
    w.put_many([(i, "base") for i in range(0, 1000, 50)])
    w.create_tunnel()
    w.put_many([(i, "a") for i in range(0, 1000, 25)])
    w.split()
    w.put_many([(i, "b") for i in range(0, 1000, 25)])
    backend = w.backend()
    planner = Planner(backend)
    start = planner.initial("earliest")
    until = planner.until("latest")
    w.put_many([(i, "late") for i in range(0, 1000, 25)])  # after the trigger: not in this run
    offset, got = start, []
    for _ in range(50):
        end = planner.next(offset, 7, until)
        if end == offset:
            break
        got += [
            r
            for t in [
                pa.Table.from_batches(list(backend.reader().read(r.channel, r.start, r.end)))
                for r in planner.ranges(offset, end)
            ]
            for r in t.to_pylist()
        ]
        offset = end
    assert sorted(r["v"] for r in got) == sorted(["base"] * 20 + ["a"] * 40 + ["b"] * 40)
    backend.close()


def test_tunnel_by_id_and_schema_from_describe_table(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="BaseData")
    w.put_many([(i, f"v{i}") for i in range(10)])
    tunnel_id = w.create_tunnel()
    raw = {**w.options(), "tunnel.id": tunnel_id}
    del raw["tunnel.name"]
    backend = TablestoreBackend(parse(TablestoreOptions, raw, what="x"))
    assert backend.tunnel_type == "BaseData" and backend.schema().field("id").type == pa.int64()
    assert "s3cr" not in repr(backend) and tablestore_server.access_key_secret not in repr(backend)
    got = rows([t for _, t in drain(backend)])
    assert [r["_op"] for r in got] == ["snapshot"] * 10
    assert all(c.finished for c in backend.list_channels())
    with pytest.raises(OptionError, match=r"catalog.*'id'.*primary-key"):
        TablestoreBackend(
            parse(TablestoreOptions, {**raw, "catalog": '{"columns": {"id": {"type": "string"}}}'}, what="x")
        )
    backend.close()


def test_missing_table_names_the_option(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server)
    raw = {**w.options(), "table.name": "no_such_table"}
    for extra in ({}, {"createTunnelIfMissing": "true"}):
        with pytest.raises(OptionError, match=r"table\.name|no_such_table"):
            TablestoreBackend(parse(TablestoreOptions, {**raw, **extra}, what="x"))


def _read(backend: TablestoreBackend, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[Any, ...]]:
    reader = pickle.loads(pickle.dumps(backend.reader()))
    rows: list[tuple[Any, ...]] = []
    for r in Planner.ranges(start, end):
        for batch in reader.read(r.channel, r.start, r.end):
            rows += [(x["_position"], x["id"], x["v"]) for x in batch.to_pylist()]
    return rows


def test_expired_records_are_data_loss_or_skipped(tablestore_server: TablestoreProcess) -> None:
    """The service expired records the query has not read: by default a DataLossError naming the tunnel,
    the channel and the option; with failOnDataLoss=false the batch skips to the first record still held,
    the offset records where it skipped to, and a replay (another backend, as after a restart) reads the
    very same records."""
    w = World(tablestore_server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(i, "old") for i in range(20)])
    backend = w.backend()
    (ch,) = [c.id for c in backend.list_channels()]
    planner = Planner(backend)
    first = planner.next(planner.initial("earliest"), 5)
    assert [p for p, _, _ in _read(backend, planner.initial("earliest"), first)] == [0, 1, 2, 3, 4]
    time.sleep(0.01)
    tablestore_server.trim(w.table)  # the service expired the change log
    w.put_many([(i, "new") for i in range(100, 105)])

    with pytest.raises(DataLossError) as info:
        planner.next(first)
    message = str(info.value)
    assert "OTSTrimmedDataAccess" in message and repr(ch) in message and "'cdc'" in message
    assert "failOnDataLoss=false" in message and info.value.channel == ch

    skipping = Planner(backend, fail_on_data_loss=False)
    end = skipping.next(first)
    entry = end["channels"][ch]
    assert entry["from"] == backend.earliest(ch) and entry["from"]["n"] == 5
    got = _read(backend, first, end)
    assert got == [(5 + i, 100 + i, "new") for i in range(5)]  # positions go on increasing
    backend.close()

    replay = w.backend()  # a restarted query replays the batch from its offsets alone
    try:
        assert _read(replay, first, end) == got
        assert Planner(replay).next(end) == end  # and nothing more
    finally:
        replay.close()

    # Trigger.AvailableNow: the target was taken (latest) before the skip, counting from another origin;
    # it is met by its ordering key and the end still counts on from the skip
    bounded = w.backend()
    try:
        target = {ch: bounded.latest(ch)}
        end2 = Planner(bounded, fail_on_data_loss=False).next(first, None, target)
        assert end2["channels"][ch]["pos"]["n"] == 10 and _read(bounded, first, end2) == got
    finally:
        bounded.close()


def test_expired_tunnel_is_a_clear_error(tablestore_server: TablestoreProcess) -> None:
    w = World(tablestore_server, tunnel_type="BaseAndStream")
    w.put_many([(i, "base") for i in range(10)])
    w.create_tunnel()
    backend = w.backend()
    w.put_many([(i, "change") for i in range(3)])
    time.sleep(0.01)
    tablestore_server.trim(w.table)  # the stream log expires before the base data was consumed
    with pytest.raises(TunnelExpiredError, match=r"tunnel 'cdc' .*has expired.*delete it") as info:
        Planner(backend).next(Planner(backend).initial("earliest"))
    assert not isinstance(info.value, DataLossError)  # nothing to skip to: the tunnel is gone for good
    backend.close()
    with pytest.raises(TunnelExpiredError, match=r"tunnel 'cdc' .*has expired"):
        w.backend()
