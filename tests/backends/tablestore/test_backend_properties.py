"""Hypothesis drives random writes (through the real SDK), splits, merges, micro-batches, replays,
acknowledgements and reader restarts against the local Tablestore server; every change must arrive
exactly once and, per key, in the order it was written (the base-data snapshot first)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cdc.backends.tablestore import TablestoreBackend
from cdc.planner import Planner
from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World, drain

KEYS = st.integers(0, 40)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TablestoreProcess]:
    proc = TablestoreProcess(
        tmp_path_factory.mktemp("ots") / "data",
        instance="props",
        access_key_id="props-id",
        access_key_secret="props-secret",
        max_records_per_read=5,  # ranges span many responses
    )
    proc.start()
    yield proc
    proc.stop()


def read(backend: TablestoreBackend, start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
    reader = pickle.loads(pickle.dumps(backend.reader()))
    out: list[dict[str, Any]] = []
    for r in Planner.ranges(start, end):
        out += pa.Table.from_batches(
            list(reader.read(r.channel, r.start, r.end)), schema=backend.schema()
        ).to_pylist()
    return out


class TunnelMachine(RuleBasedStateMachine):
    server: TablestoreProcess

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.expected: dict[int, list[tuple[str, str | None]]] = {}
        self.delivered: list[dict[str, Any]] = []
        self.batches: dict[str, list[int]] = {}  # channel -> the batch numbers its records came in
        self.batch_no = 0
        self.last_batch: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]] | None = None
        self.backend: TablestoreBackend | None = None

    @initialize(
        base=st.lists(KEYS, unique=True, max_size=12), kind=st.sampled_from(["Stream", "BaseAndStream"])
    )
    def setup(self, base: list[int], kind: str) -> None:
        self.world = World(self.server, tunnel_type=kind, key_range=(0, 41))
        self.world.put_many([(k, f"b{k}") for k in base])
        self.world.create_tunnel()
        if kind == "BaseAndStream":
            for k in sorted(base):
                self.expected[k] = [("snapshot", f"b{k}")]
        self.backend = self.world.backend()
        self.offset = Planner(self.backend).initial("earliest")
        self.version = 0

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    @property
    def b(self) -> TablestoreBackend:
        assert self.backend is not None
        return self.backend

    @rule(ops=st.lists(st.tuples(st.sampled_from(["put", "update", "delete"]), KEYS), min_size=1, max_size=8))
    def write(self, ops: list[tuple[str, int]]) -> None:
        for kind, key in ops:
            self.version += 1
            v = f"{kind[0]}{self.version}"
            if kind == "put":
                self.w.put(key, v)
                self.expected.setdefault(key, []).append(("insert", v))
            elif kind == "update":
                self.w.update(key, v)
                self.expected.setdefault(key, []).append(("update", v))
            else:
                self.w.delete(key)
                self.expected.setdefault(key, []).append(("delete", None))

    @rule(data=st.data())
    def split(self, data: st.DataObject) -> None:
        shards = [s for s in self.server.shards(self.w.table) if not s["sealed"]]
        target = data.draw(st.sampled_from(shards))
        lo = target["lo"][0] if target["lo"] and isinstance(target["lo"][0], int) else 0
        hi = target["hi"][0] if target["hi"] and isinstance(target["hi"][0], int) else 41
        if hi - lo >= 2:
            self.server.split(self.w.table, target["shard_id"], [data.draw(st.integers(lo + 1, hi - 1))])

    @rule(data=st.data())
    def merge(self, data: st.DataObject) -> None:
        shards = [s for s in self.server.shards(self.w.table) if not s["sealed"]]  # ordered by creation
        shards.sort(key=lambda s: -1 if not s["lo"] else s["lo"][0])
        if len(shards) >= 2:
            i = data.draw(st.integers(0, len(shards) - 2))
            self.w.merge([shards[i]["shard_id"], shards[i + 1]["shard_id"]])

    @rule(limit=st.none() | st.integers(1, 12), ack=st.booleans())
    def batch(self, limit: int | None, ack: bool) -> None:
        planner = Planner(self.b)
        end = planner.next(self.offset, limit)
        got = read(self.b, self.offset, end)
        assert limit is None or len(got) <= limit
        self.deliver(got)
        self.last_batch = (self.offset, end, got)
        self.offset = end
        if ack:
            self.b.acknowledge({c: e["pos"] for c, e in end["channels"].items()})

    @precondition(lambda self: self.last_batch is not None)
    @rule()
    def replay_last_batch(self) -> None:
        """A batch re-run after a crash (from Spark's offset log) reads exactly the same records."""
        assert self.last_batch is not None
        start, end, got = self.last_batch
        assert read(self.b, start, end) == got

    @rule()
    def restart_reader(self) -> None:
        self.b.close()
        self.backend = self.w.backend()

    @invariant()
    def never_ahead_or_out_of_order(self) -> None:
        per_key: dict[int, list[tuple[str, str | None]]] = {}
        for r in self.delivered:
            per_key.setdefault(r["id"], []).append((r["_op"], r["v"]))
        for key, seen in per_key.items():
            assert seen == self.expected.get(key, [])[: len(seen)], f"key {key}"

    def deliver(self, records: list[dict[str, Any]]) -> None:
        self.batch_no += 1
        self.delivered += records
        for r in records:
            self.batches.setdefault(r["_channel"], []).append(self.batch_no)

    def check_lineage(self) -> None:
        """From the server's own shard lineage (not the backend's view): every record of a child came in
        a later batch than every record of its parents."""
        parents = {s["shard_id"]: s["parents"] for s in self.server.shards(self.w.table)}
        for child, ps in parents.items():
            if child not in self.batches:
                continue
            for p in ps:
                if p in self.batches:
                    assert max(self.batches[p]) < min(self.batches[child]), f"{child} before its parent {p}"
        base = [c for c in self.batches if c.endswith("-base")]
        for c in self.batches:
            if not c.endswith("-base") and base:
                assert max(max(self.batches[b]) for b in base) < min(self.batches[c]), (
                    "changes before snapshot"
                )

    def teardown(self) -> None:
        if self.backend is None:
            return
        for _, table in drain(self.b, self.offset):
            self.deliver(table.to_pylist())
        per_key: dict[int, list[tuple[str, str | None]]] = {}
        for r in self.delivered:
            per_key.setdefault(r["id"], []).append((r["_op"], r["v"]))
        self.b.close()
        assert per_key == self.expected
        self.check_lineage()


def test_random_writes_splits_merges_exactly_once_in_order(server: TablestoreProcess) -> None:
    TunnelMachine.server = server
    run_state_machine_as_test(
        TunnelMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
