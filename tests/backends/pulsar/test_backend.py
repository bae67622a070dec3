"""PulsarBackend against a real pulsar-lite broker: offsets, decoding, malformed messages, acks, stalls."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.backends.pulsar import PulsarOptions, StallError, drop_subscription
from cdc.backends.pulsar.admin import AdminClient
from cdc.backends.pulsar.connection import open_client
from cdc.backends.pulsar.errors import SequenceRangeError
from cdc.backends.pulsar.records import sequence_of
from cdc.errors import BackendUnavailableError, MalformedRecordError, OptionError, PositionError
from cdc.options import parse
from cdc.planner import Planner
from cdc.servers.pulsar import ApachePulsar, EmbeddedBroker
from tests.backends.pulsar.helpers import backend, drain, produce


# ---------------------------------------------------------------------------------------------- broker
def test_broker_kill_restart_keeps_data_and_stays_on_loopback() -> None:
    with EmbeddedBroker(partitions=0) as b:
        produce(b.url, "persist", [b"a", b"b"])
        port, pid = b.port, b.pid
        b.kill()
        assert not b.running
        b.start()
        assert b.port == port and b.pid != pid
        table, _ = drain(backend(b.url, "persist"))
        assert table.column("value").to_pylist() == [b"a", b"b"]
        config = (b.data_dir / "pulsar-lite.toml").read_text()
        assert "enabled = false" in config  # no 0.0.0.0:8080 metrics listener
        data_dir = b.data_dir
    assert not data_dir.exists()  # a temporary data dir is removed on stop


# ---------------------------------------------------------------------------------------------- options
def test_options_name_the_problem() -> None:
    with pytest.raises(OptionError, match="exactly one of options 'topic'"):
        parse(PulsarOptions, {"service.url": "pulsar://x:1"}, what="backend 'pulsar'")
    with pytest.raises(OptionError, match="topicsPattern.*admin.url"):
        parse(PulsarOptions, {"service.url": "pulsar://x:1", "topicsPattern": "a.*"}, what="backend 'pulsar'")
    with pytest.raises(OptionError, match="valueFormat"):
        parse(PulsarOptions, {"service.url": "u", "topic": "t", "valueFormat": "xml"}, what="backend 'pulsar'")
    with pytest.raises(OptionError, match="quarantineTopic"):
        parse(PulsarOptions, {"service.url": "u", "topic": "t", "onMalformed": "quarantine"}, what="b")
    o = parse(PulsarOptions, {"SERVICE.URL": "u", "topic": "t", "auth.token": "s3cret"}, what="b")
    assert "s3cret" not in repr(o)


def test_the_token_comes_from_the_environment_when_no_option_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc.backends.pulsar.connection import token_of

    monkeypatch.setenv("PULSAR_AUTH_TOKEN", "from-env")
    assert token_of(parse(PulsarOptions, {"service.url": "u", "topic": "t"}, what="b")) == "from-env"
    assert token_of(parse(PulsarOptions, {"service.url": "u", "topic": "t", "auth.token": "opt"}, what="b")) == "opt"
    monkeypatch.delenv("PULSAR_AUTH_TOKEN")
    assert token_of(parse(PulsarOptions, {"service.url": "u", "topic": "t"}, what="b")) is None


def test_positions_are_validated(broker: ApachePulsar, topic: str) -> None:
    b = backend(broker.url, topic)
    ch = b.list_channels()[0].id
    assert b.parse_position(ch, {"ledgerId": 3, "entryId": 4}) == [3, 4, -1]
    for bad in ([1, 2], "x", [1, 2, True], {"ledger": 1}, [-5, 0, 0]):
        with pytest.raises(PositionError, match=r"\[ledgerId, entryId, batchIndex\]"):
            b.parse_position(ch, bad)


# ---------------------------------------------------------------------------------------------- reading
def test_partitioned_topic_columns_and_per_partition_order(broker: ApachePulsar, topic: str) -> None:
    keys = [f"k{i % 5}" for i in range(60)]
    produce(broker.url, topic, [f"{i}".encode() for i in range(60)], keys, batching=True,
            properties={"p": "1"}, event_ms=1_700_000_000_000)
    b = backend(broker.url, topic)
    assert [c.id for c in b.list_channels()] == [f"{topic}-partition-0", f"{topic}-partition-1"]
    table, _ = drain(b, limit=7)
    assert table.num_rows == 60
    rows = table.to_pylist()
    assert rows[0]["__properties"] == [("p", "1")]
    assert rows[0]["__eventTime"] == datetime.fromtimestamp(1_700_000_000, UTC)
    assert rows[0]["__topic"].startswith(topic + "-partition-")
    assert all(isinstance(r["__messageId"], bytes) for r in rows)
    per_key: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r["__key"], []).append(int(r["value"]))
    for seq in per_key.values():  # keys route to one partition, so per-key order is kept
        assert seq == sorted(seq)


def test_starting_offsets_latest_json_and_starting_time(broker: ApachePulsar, topic: str) -> None:
    first = produce(broker.url, topic, [b"old1", b"old2"], ["a", "a"])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(broker.url, topic, [b"new1"], ["a"])
    b = backend(broker.url, topic)
    planner = Planner(b)
    # latest: only what comes after
    latest = planner.initial("latest")
    produce(broker.url, topic, [b"new2"], ["a"])
    table, _ = drain(b, latest)
    assert table.column("value").to_pylist() == [b"new2"]
    # JSON: after a given message id
    m = first[0]
    ch = f"{topic}-partition-{m.partition()}"
    start = planner.initial(json.dumps({ch: [m.ledger_id(), m.entry_id(), m.batch_index()]}))
    table, _ = drain(b, start)
    assert b"old1" not in table.column("value").to_pylist()
    assert table.column("value").to_pylist()[:1] == [b"old2"]
    # a publish time (startingTimestamp, see test_times): messages published before it are not read
    b2 = backend(broker.url, topic)
    table, _ = drain(b2, Planner(b2).initial("earliest", datetime.fromtimestamp(cut / 1000, UTC)))
    assert table.column("value").to_pylist() == [b"new1", b"new2"]


def test_empty_topic_is_no_data(broker: ApachePulsar, topic: str) -> None:
    table, offset = drain(backend(broker.url, topic))
    assert table.num_rows == 0
    assert all(e["pos"] == [-1, -1, -1] for e in offset["channels"].values())


def test_duplicates_are_dropped_by_id(broker: ApachePulsar, topic: str) -> None:
    # A tiny receiver queue makes pulsar-lite redeliver (ids go backwards); nothing may come twice.
    produce(broker.url, topic, [f"{i}".encode() for i in range(3000)], [f"k{i}" for i in range(3000)])
    table, _ = drain(backend(broker.url, topic, receiverQueueSize=10))
    values = [int(v) for v in table.column("value").to_pylist()]
    assert sorted(values) == list(range(3000))


def test_stalled_read_fails_clearly(lite_topic: str) -> None:
    """On a broker of its own that dies mid-range (pulsar-lite: it restarts in 0.1 s; the session's Apache
    Pulsar is shared by the other tests)."""
    topic = lite_topic
    with EmbeddedBroker(partitions=0) as b:
        produce(b.url, topic, [b"x"] * 9000)
        bk = backend(b.url, topic, pollTimeoutMs=1500, receiverQueueSize=100, operationTimeoutSeconds=3)
        ch = bk.list_channels()[0].id
        start = bk.earliest(ch)
        end = bk.plan(ch, start).end
        bk.close()
        batches = bk.reader().read(ch, start, end)
        assert next(batches).num_rows == 8192
        b.kill()  # the broker dies in the middle of the range
        with pytest.raises(StallError, match="pollTimeoutMs"):
            list(batches)
        with pytest.raises(BackendUnavailableError, match="cannot open a Reader"):
            list(bk.reader().read(ch, start, end))


# ---------------------------------------------------------------------------------------------- decoding
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "amount", "type": ["null", "double"]},
            {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
        ],
    }
)


def test_json_schema_decoding(broker: ApachePulsar, topic: str) -> None:
    produce(broker.url, topic, [json.dumps({"id": 1, "amount": 2.5, "at": 0}).encode(), b'{"id": 2}'], ["a", "a"])
    b = backend(broker.url, topic, valueFormat="json", valueSchema=SCHEMA)
    assert b.schema().names[:3] == ["id", "amount", "at"]
    table, _ = drain(b)
    rows = table.to_pylist()
    assert [(r["id"], r["amount"]) for r in rows] == [(1, 2.5), (2, None)]
    assert rows[0]["at"] == datetime(1970, 1, 1, tzinfo=UTC)


def test_malformed_fails_naming_the_message(broker: ApachePulsar, topic: str) -> None:
    produce(broker.url, topic, [b'{"id": "not a number"}'], ["bad-key"])
    b = backend(broker.url, topic, valueFormat="json", valueSchema=SCHEMA)
    with pytest.raises(MalformedRecordError, match=r"bad-key.*field 'id': expected an integer"):
        drain(b)


def test_malformed_quarantined_to_a_topic(broker: ApachePulsar, topic: str) -> None:
    produce(broker.url, topic, [b'{"id": 1}', b"garbage", b'{"id": 3}'], ["k", "k", "k"])
    q = topic + "-quarantine"
    b = backend(broker.url, topic, valueFormat="json", valueSchema=SCHEMA, onMalformed="quarantine", quarantineTopic=q)
    table, _ = drain(b)
    assert table.column("id").to_pylist() == [1, 3]
    client = open_client(broker.url)
    try:
        reader = client.create_reader(q, pulsar.MessageId.earliest)
        msg = reader.read_next(5000)
        assert msg.data() == b"garbage"
        assert "not JSON" in msg.properties()["cdc.error"]
        assert msg.properties()["cdc.topic"].startswith(topic)
    finally:
        client.close()


def test_debezium_envelopes_map_to_the_change_model(broker: ApachePulsar, topic: str) -> None:
    schema = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]}]})
    events = [
        {"op": "r", "after": {"id": 1, "name": "a"}, "ts_ms": 1000, "source": {"pos": 1}},
        {"op": "c", "after": {"id": 2, "name": "b"}, "ts_ms": 2000},
        {"payload": {"op": "u", "before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "a2"}, "ts_ms": 3000}},
        {"op": "d", "before": {"id": 2, "name": "b"}, "after": None, "ts_ms": 4000},
    ]
    produce(broker.url, topic, [json.dumps(e).encode() for e in events], ["same"] * 4)
    b = backend(broker.url, topic, valueFormat="debezium", valueSchema=schema, changeKeys="id")
    assert b.schema().names == ["_op", "_seq", "_commit_ts", "_channel", "_position", "_unchanged", "_old_key", "id",
                                "name"]
    table, _ = drain(b)
    rows = table.to_pylist()
    assert [(r["_op"], r["id"], r["name"]) for r in rows] == [
        ("snapshot", 1, "a"), ("insert", 2, "b"), ("update", 1, "a2"), ("delete", 2, None)]
    seqs = [r["_seq"] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert rows[3]["_commit_ts"] == datetime.fromtimestamp(4, UTC)


def test_average_record_bytes_comes_from_the_indexed_payloads(broker: ApachePulsar, topic: str) -> None:
    """maxBytesPerTrigger's estimate: the payload bytes of the messages the driver read to plan, per message
    (with no budget read yet, the sample at each partition's start, which here is every message)."""
    b = backend(broker.url, topic)
    assert b.average_record_bytes() == 0.0  # nothing indexed yet: no estimate, no limit
    produce(broker.url, topic, [b"a" * 100] * 30 + [b"b" * 400] * 10, [f"k{i}" for i in range(40)], batching=True)
    drain(b)
    assert b.average_record_bytes() == pytest.approx((30 * 100 + 10 * 400) / 40)


# ---------------------------------------------------------------------------------------------- sequences
LEDGER, ENTRY, BATCH = 2**32 - 1, 2**19 - 1, 2**12 - 3  # the largest message id a sequence can encode
message_ids = st.tuples(st.integers(0, LEDGER), st.integers(0, ENTRY), st.integers(-1, BATCH))


@settings(max_examples=500, deadline=None)
@given(message_ids, message_ids)
def test_change_sequences_order_like_message_ids(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    """``_seq`` of a Debezium change record orders a partition's messages exactly as their ids do (the sink's
    sequence guard depends on it), and fits a non-negative long."""
    sa, sb = sequence_of(*a), sequence_of(*b)
    assert (sa < sb) == (a < b) and (sa == sb) == (a == b)
    assert 0 <= sa < 2**63


def test_change_sequences_refuse_ids_they_cannot_encode() -> None:
    # Ledger ids of a long-lived cluster (BookKeeper counters) fit: the first split (23 bits) failed on them.
    assert sequence_of(3_000_000_000, 0, -1) > sequence_of(2_999_999_999, ENTRY, BATCH)
    for bad in [(LEDGER + 1, 0, -1), (0, ENTRY + 1, -1), (0, 0, BATCH + 1), (-1, 0, 0), (0, -1, 0)]:
        with pytest.raises(SequenceRangeError, match=r"does not fit.*managedLedgerMaxEntriesPerLedger"):
            sequence_of(*bad)


# ---------------------------------------------------------------------------------------------- acks
@pytest.mark.parametrize("kind", ["partitioned", "non-partitioned"])
def test_acknowledge_advances_the_subscription_and_cleanup_removes_it(
    kind: str, broker: ApachePulsar, topic: str, plain_topic: str
) -> None:
    if kind == "non-partitioned":
        topic = plain_topic
    produce(broker.url, topic, [f"{i}".encode() for i in range(20)], [f"k{i}" for i in range(20)])
    sub = "cdc-test-ack"
    b = backend(broker.url, topic, **{"subscription.name": sub})
    planner = Planner(b)
    start = planner.initial("earliest")
    end = planner.next(start, 12)  # 12 of 20 processed
    b.acknowledge({c: e["pos"] for c, e in end["channels"].items()})
    b.close()
    client = open_client(broker.url)
    try:
        consumer = client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
        left = []
        while True:
            try:
                left.append(int(consumer.receive(1500).data()))
            except pulsar.Timeout:
                break
        consumer.close()
        assert len(left) == 8  # the backlog is what was not committed
    finally:
        client.close()
    opts = PulsarOptions.model_validate({"service.url": broker.url, "topic": topic, "subscription.name": sub})
    assert drop_subscription(opts) == [topic]
    admin = AdminClient(broker.admin_url)
    channels = list(end["channels"])
    assert channels and all(sub not in admin.get(f"/admin/v2/persistent/{c.split('://', 1)[1]}/subscriptions")
                            for c in channels)  # gone from every partition


def test_module_commands_start_a_broker_and_drop_a_subscription(lite_topic: str) -> None:
    topic = lite_topic
    import socket
    import subprocess
    import sys

    from click.testing import CliRunner

    from cdc.backends.pulsar.__main__ import cli
    from cdc.servers.ports import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cdc", "server", "pulsar", "--lite", "--port", str(port),
                             "--partitions", "2"], stderr=subprocess.PIPE)
    try:
        line = proc.stderr.readline().decode() if proc.stderr else ""
        assert f"pulsar://127.0.0.1:{port}" in line
        assert proc.stderr is not None and "NOT Apache Pulsar" in proc.stderr.readline().decode()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        url = f"pulsar://127.0.0.1:{port}"
        produce(url, topic, [b"a"], ["k"])
        b = backend(url, topic, **{"subscription.name": "to-drop"})
        b.list_channels()
        b.acknowledge({c.id: b.latest(c.id) for c in b.list_channels()})
        b.close()
        result = CliRunner().invoke(cli, ["drop-subscription", "--service-url", url, "--topics", topic,
                                          "--subscription", "to-drop"])
        assert result.exit_code == 0, result.output
        assert "removed subscription to-drop" in result.output
    finally:
        proc.terminate()
        proc.wait(10)


def test_sink_options_are_checked_without_spark() -> None:
    from cdc.backends.pulsar.writer import PulsarWriter

    w = PulsarWriter({"backend": "pulsar", "service.url": "pulsar://127.0.0.1:1", "topic": "t",
                      "producer.batchingMaxMessages": "10"})
    assert w.options.batching_max_messages == 10
    with pytest.raises(OptionError, match="accepted values: pulsar"):
        PulsarWriter({"backend": "local", "service.url": "u"})
    with pytest.raises(OptionError, match="unknown option 'topik'"):
        PulsarWriter({"service.url": "u", "topik": "t"})
