"""Debezium transaction metadata (``debezium.transactionTopic``, issue 15 item 3): batch ends fall between
source transactions, over every partition, and a transaction whose END (or one of its events) has not
arrived is not taken.

The envelopes and transaction events follow the PostgreSQL connector's output with
``provide.transaction.metadata=true`` (tests/debezium gets the same from the real engine)."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.backends.pulsar.index import PartitionIds
from cdc.backends.pulsar.options import PulsarOptions
from cdc.backends.pulsar.transactions import (
    INF,
    IndexedMessages,
    OrderList,
    transaction_cut,
    transaction_end,
    transaction_of,
)
from cdc.errors import OptionError
from cdc.options import parse
from cdc.planner import Planner, Taken, share_budget
from cdc.servers.pulsar import ApachePulsar
from cdc.testing import batches
from tests.backends.pulsar.helpers import backend, produce

ROW = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]})
SOURCE = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg", "db": "app", "schema": "public",
          "table": "items", "ts_ms": 1700000000123, "ts_us": 1700000000123456}


def event(tx: str | None, row_id: int, order: int = 1, table: str = "items") -> bytes:
    block = None if tx is None else {"id": tx, "total_order": order, "data_collection_order": order}
    return json.dumps({"before": None, "after": {"id": row_id, "name": f"r{row_id}"},
                       "source": {**SOURCE, "table": table}, "transaction": block, "op": "c",
                       "ts_ms": 1700000009999}).encode()


def end(tx: str, **counts: int) -> bytes:
    return json.dumps({"status": "END", "id": tx, "ts_ms": 1700000009999, "event_count": sum(counts.values()),
                       "data_collections": [{"data_collection": f"public.{t}", "event_count": n}
                                            for t, n in counts.items()]}).encode()


def begin(tx: str) -> bytes:
    return json.dumps({"status": "BEGIN", "id": tx, "ts_ms": 1700000009999, "event_count": None,
                       "data_collections": None}).encode()


# ------------------------------------------------------------------------------------------------ parsing
def test_the_transaction_block_and_end_events_are_read() -> None:
    assert transaction_of(event("t1", 1)) == ("t1", "app.public.items")
    # PostgreSQL: <txId>:<lsn of the event>, another LSN per event (DBZ-5329): the txId is the key
    assert transaction_of(event("571:100", 1)) == ("571", "app.public.items")
    assert transaction_of(event(None, 1)) is None
    assert transaction_of(b"") is None  # a tombstone
    with_schema = json.dumps({"schema": {"type": "struct", "fields": [{"field": "transaction"}, {"field": "source"}]},
                              "payload": json.loads(event("9:1", 2))}).encode()
    assert transaction_of(with_schema) == ("9", "app.public.items")
    # a row column named like the envelope's blocks: the whole envelope is decoded instead
    tricky = json.loads(event("9:2", 3))
    tricky["after"]["transaction"] = {"id": "not-this-one"}
    assert transaction_of(json.dumps(tricky).encode()) == ("9", "app.public.items")
    assert transaction_end(end("571:100", items=2, other=1)) == ("571:100", {"public.items": 2, "public.other": 1})
    assert transaction_end(begin("571:100")) is None


_NAME = st.text(min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(table=_NAME, schema=st.none() | _NAME, tx=st.none() | _NAME | st.from_regex("[0-9]{1,4}:[0-9]{1,6}", fullmatch=True), connector=st.sampled_from(["postgresql", "mysql"]),
       row=st.dictionaries(st.sampled_from(["id", "source", "transaction", "table"]), st.none() | _NAME | st.just({})),
       shuffle=st.randoms(use_true_random=False))
def test_the_quick_reading_of_the_blocks_agrees_with_decoding_the_envelope(
    table: str, schema: str | None, tx: str | None, connector: str, row: dict[str, Any], shuffle: Any,
) -> None:
    """Names with quotes, braces, escapes; row columns named like the blocks; fields in any order."""
    source = {**SOURCE, "connector": connector, "table": table, "schema": schema}
    fields = list({"before": None, "after": row, "source": source, "op": "c",
                   "transaction": None if tx is None else {"id": tx, "total_order": 1, "data_collection_order": 1},
                   }.items())
    shuffle.shuffle(fields)
    payload = json.dumps(dict(fields), ensure_ascii=shuffle.random() < 0.5).encode()
    key = tx.split(":")[0] if tx and connector == "postgresql" and re.fullmatch("[0-9]+:[0-9]+", tx) else tx
    expected = None if key is None else (key, ".".join(p for p in ("app", schema, table) if p))
    assert transaction_of(payload) == expected


# ------------------------------------------------------------------------------------ the cut, in isolation
def cut(orders: list[float | None], i: int, j: int, limit: int | None = None,
        window: tuple[float, float] = (-1, INF)) -> tuple[int, tuple[float, float]]:
    return transaction_cut(OrderList(orders), i, j, len(orders) if limit is None else limit, window)


def test_a_budget_ending_inside_a_transaction_takes_the_rest_of_it() -> None:
    assert cut([0, 0, 1, 1, 1, 2], 0, 3) == (5, (1, 1))


def test_a_transaction_not_yet_complete_is_not_taken() -> None:
    assert cut([0, 0, 1, 1], 0, 4, window=(-1, 0)) == (2, (0, 0))  # frontier 0: transaction 1 is incomplete
    assert cut([0, INF, INF], 0, 3, window=(-1, 0))[0] == 1  # INF: its END has not been read


def test_a_bound_inside_a_transaction_moves_the_end_back() -> None:
    assert cut([0, 1, 1, 1], 0, 2, limit=2) == (1, (0, 0))


def test_messages_outside_transactions_may_end_a_batch_anywhere() -> None:
    assert cut([None, None, None, 0, 0], 0, 1) == (1, (-1, -1))
    assert cut([0, None, 1], 0, 1) == (1, (0, 0))
    assert cut([0, None, 1], 0, 2) == (2, (0, 0))


_CHANNELS = 3


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[list[float | None]], int, int, int]:
    """Channels' messages (transaction orders, None outside any) in commit order, the frontier, a budget and
    the planner's turn."""
    channels: list[list[float | None]] = [[] for _ in range(_CHANNELS)]
    count = draw(st.integers(0, 12))
    for order in range(count):
        if draw(st.booleans()):
            channels[draw(st.integers(0, _CHANNELS - 1))].append(None)
        for _ in range(draw(st.integers(1, 4))):
            channels[draw(st.integers(0, _CHANNELS - 1))].append(order)
    for ch in channels:
        if draw(st.booleans()):
            ch.append(INF)  # a transaction whose END has not been read
    return channels, draw(st.integers(-1, count)), draw(st.integers(1, 12)), draw(st.integers(0, 5))


def indexed(orders: list[float | None]) -> IndexedMessages:
    """The same messages as the driver's index holds them: ids, transaction keys, the ids inside one."""
    ids = PartitionIds()
    for k, o in enumerate(orders):
        ids.keys.append((7, k, -1))
        ids.marks.append(None if o is None else f"x{o}")
        if o is not None:
            ids.marked.append((7, k, -1))
    return IndexedMessages(ids, {f"x{o}": int(o) for o in orders if o is not None and o != INF})


@settings(max_examples=200, deadline=None)
@given(histories())
def test_every_round_takes_whole_complete_transactions_on_every_channel(
    history: tuple[list[list[float | None]], int, int, int],
) -> None:
    channels, frontier, budget, turn = history
    starts = [0] * _CHANNELS
    for _ in range(60):  # rounds until nothing moves
        window: tuple[float, float] = (-1, frontier)
        ends = list(starts)

        def take(cid: str, want: int | None, ends: list[int] = ends) -> Taken:
            nonlocal window
            c = int(cid)
            orders = channels[c]
            j = len(orders) if want is None else min(len(orders), ends[c] + want)
            e, after = transaction_cut(OrderList(orders), ends[c], j, len(orders), window)
            # the driver's index gives the same cut (it finds messages inside transactions by bisection)
            assert transaction_cut(indexed(orders), ends[c], j, len(orders), window) == (e, after)
            window = after
            got, ends[c] = e - ends[c], e
            return Taken(got, e == len(orders))

        share_budget([str(c) for c in range(_CHANNELS)], budget, None, turn, take)
        taken = [o for c in range(_CHANNELS) for o in channels[c][starts[c]:ends[c]] if o is not None]
        left = [o for c in range(_CHANNELS) for o in channels[c][ends[c]:] if o is not None]
        assert not set(taken) & set(left), (starts, ends)  # no transaction split
        assert all(o <= frontier for o in taken)  # nothing incomplete
        takeable = [c for c in range(_CHANNELS) if starts[c] < len(channels[c])
                    and (channels[c][starts[c]] is None or (channels[c][starts[c]] or 0) <= frontier)]
        assert ends != starts or not takeable, (starts, channels)  # progress while anything can be taken
        if ends == starts:
            break
        starts, turn = ends, turn + 1


# ------------------------------------------------------------------------------------------------ options
def test_a_bad_transaction_topic_option_names_it_and_what_it_accepts() -> None:
    base = {"service.url": "pulsar://127.0.0.1:1", "topic": "pg.public.items", "valueSchema": ROW, "changeKeys": "id"}
    for bad, reason in [({"valueFormat": "json"}, "needs valueFormat=debezium"),
                        ({"valueFormat": "debezium", "debezium.transactionTopic": "pg.public.items"}, "not a data topic"),
                        ({"valueFormat": "debezium", "debezium.transactionTopic": "a/b"}, "expected <name>"),
                        ({"valueFormat": "debezium", "debezium.transactionTopic": " "}, "accepted values")]:
        raw = {"debezium.transactionTopic": "pg.transaction", **base, **bad}
        with pytest.raises(OptionError, match=reason) as err:
            parse(PulsarOptions, raw, what="backend 'pulsar'")
        assert err.value.option == "debezium.transactionTopic" and "debezium.transactionTopic" in str(err.value)


# ---------------------------------------------------------------------------------------------- on a broker
def _orders_of(table: Any, tx_of: dict[int, str]) -> list[str]:
    return [tx_of[i] for i in table.column("id").to_pylist()]


def test_batches_end_between_transactions_and_wait_for_an_end(plain_broker: ApachePulsar, plain_topic: str) -> None:
    url, data, txs = plain_broker.url, plain_topic, plain_topic + ".transaction"
    produce(url, data, [event("t1", 1, 1), event("t1", 2, 2), event("t2", 3, 1), event("t2", 4, 2),
                        event("t2", 5, 3), event(None, 6), event("t3", 7, 1), event("t3", 8, 2)])
    produce(url, txs, [begin("t1"), end("t1", items=2), begin("t2"), end("t2", items=3), begin("t3")])
    tx_of = {1: "t1", 2: "t1", 3: "t2", 4: "t2", 5: "t2", 6: "-", 7: "t3", 8: "t3"}
    b = backend(url, data, valueFormat="debezium", valueSchema=ROW, changeKeys="id",
                **{"debezium.transactionTopic": txs})
    got = [(_orders_of(t, tx_of), end_) for end_, t in batches(b, Planner(b).initial("earliest"), 1)]
    # a budget of 1 takes each transaction whole; t3's END has not arrived: it is not taken
    assert [o for o, _ in got] == [["t1", "t1"], ["t2", "t2", "t2"], ["-"]]
    produce(url, txs, [end("t3", items=2)])
    more = [_orders_of(t, tx_of) for _, t in batches(b, got[-1][1], 1)]
    assert more == [["t3", "t3"]]


def test_a_partitioned_transaction_topic_is_refused_naming_the_option(broker: ApachePulsar, topic: str,
                                                                      plain_topic: str) -> None:
    produce(broker.url, plain_topic, [event("t1", 1)])
    b = backend(broker.url, plain_topic, valueFormat="debezium", valueSchema=ROW, changeKeys="id",
                **{"debezium.transactionTopic": topic})  # 2 partitions
    with pytest.raises(OptionError, match=r"'debezium.transactionTopic': .* 2 partitions") as err:
        Planner(b).next(Planner(b).initial("earliest"), 10)
    assert err.value.option == "debezium.transactionTopic"


def test_a_truncate_inside_a_transaction_keeps_the_transaction_whole(plain_broker: ApachePulsar,
                                                                    plain_topic: str) -> None:
    """debezium.truncate=apply ends a batch right before a truncate; inside a transaction (BEGIN; INSERT;
    TRUNCATE; INSERT; COMMIT) that would split it, or, once the batch starts at the transaction, plan nothing
    forever: the transaction is taken whole, its truncate amid the batch."""
    url, data, txs = plain_broker.url, plain_topic, plain_topic + ".transaction"
    truncate = json.dumps({"before": None, "after": None, "source": SOURCE, "op": "t", "ts_ms": 1700000009999,
                           "transaction": {"id": "t2", "total_order": 2, "data_collection_order": 2}}).encode()
    produce(url, data, [event("t1", 1, 1), event("t1", 2, 2), event("t2", 3, 1), truncate, event("t2", 4, 3)])
    produce(url, txs, [begin("t1"), end("t1", items=2), begin("t2"), end("t2", items=3)])
    b = backend(url, data, valueFormat="debezium", valueSchema=ROW, changeKeys="id",
                **{"debezium.transactionTopic": txs, "debezium.truncate": "apply"})
    got = [t.column("_op").to_pylist() for _, t in batches(b, Planner(b).initial("earliest"), 1)]
    assert got == [["insert", "insert"], ["insert", "truncate", "insert"]]


def test_a_transaction_spread_over_partitions_is_taken_whole(broker: ApachePulsar, topic: str) -> None:
    """Two partitions (Debezium partitions by key): each batch holds whole transactions on both, and a
    transaction with an event still missing on one partition waits on both."""
    url, txs = broker.url, topic + "-transaction"
    tx_of: dict[int, str] = {}
    payloads, keys, ends = [], [], []
    for t in range(6):
        size = 1 + t % 3
        for k in range(size):
            row = 10 * t + k
            tx_of[row] = f"t{t}"
            payloads.append(event(f"t{t}", row, k + 1))
            keys.append(str(row))
        ends += [begin(f"t{t}"), end(f"t{t}", items=size)]
    produce(url, topic, payloads[:-1], keys[:-1])  # t5's last event is not published yet
    produce(url, txs, ends)
    b = backend(url, topic, valueFormat="debezium", valueSchema=ROW, changeKeys="id",
                **{"debezium.transactionTopic": txs})
    sizes = Counter(tx_of.values())
    offset = Planner(b).initial("earliest")
    seen: list[str] = []
    for batch_end, table in batches(b, Planner(b).initial("earliest"), 2):
        offset = batch_end
        in_batch = Counter(_orders_of(table, tx_of))
        assert all(n == sizes[t] for t, n in in_batch.items()), in_batch  # whole transactions only
        seen += in_batch
    assert sorted(seen) == [f"t{t}" for t in range(5)]  # t5 waits for its last event
    produce(url, topic, payloads[-1:], keys[-1:])
    rest = [Counter(_orders_of(t, tx_of)) for _, t in batches(b, offset, 2)]
    assert rest == [Counter({"t5": 3})]
