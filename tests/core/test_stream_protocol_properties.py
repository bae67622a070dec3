"""Exactly-once, per-key order and lineage, proved over random histories.

A hypothesis state machine drives the ``cdc`` stream reader through Spark's own call protocol
(``initialOffset``, ``latestOffset(start, ReadMaxRows)``, ``partitions``, ``read`` on a pickled copy,
``commit``), with the offset log and commit log of Spark's checkpoint modelled as lists. A *crash* throws
the driver-side reader away at a random point, between writing a batch's offset and committing its
output; the restarted reader then replays that batch from the logged offsets, exactly as Spark does
(Spark re-asks ``initialOffset`` when batch 0 is replayed). Meanwhile random appends, splits and merges
change the local log. Invariants, checked after every batch and at the end:

* no record is lost and none is delivered twice (the final drain delivers everything appended);
* a replayed batch yields exactly the records of its first attempt, in the same input partitions (with
  ``minPartitions``, ranges are cut at segment boundaries and the pieces delivered in reverse, as tasks may
  finish in any order);
* per key, sequences increase from batch to batch, and inside a batch they order a key's records as their
  positions do (sorting by ``_seq`` restores a key's order);
* no record of a child channel is delivered before every record of each of its parents, in an
  earlier batch;
* a batch never exceeds ``maxRecordsPerTrigger``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from cdc.backends.local import LocalLog
from cdc.source import CdcStreamReader, _Config

KEYS = 12
# Hundreds of logs are created, appended to (each write fsynced) and removed per run: in memory where the
# machine has a tmpfs. No process dies here (a crash throws a reader away), so the disk proves nothing more.
MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class StreamProtocol(RuleBasedStateMachine):
    @initialize(channels=st.integers(1, 3), starting=st.sampled_from(["earliest", "latest", "snapshot"]),
                min_partitions=st.sampled_from([None, 2, 5]))
    def setup(self, channels: int, starting: str, min_partitions: int | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cdc-prop-", dir=MEMORY))
        self.log = LocalLog.create(self.dir / "log", [("k", pa.int64()), ("v", pa.int64())], ["k"], channels=channels)
        self.options = {"backend": "local", "path": str(self.log.path), "startingOffsets": starting}
        if min_partitions:  # ranges cut at segment boundaries, read by several tasks
            self.options["minPartitions"] = str(min_partitions)
        self.pieces: dict[int, list[Any]] = {}  # each batch's input partitions, as first planned
        self.schema = from_arrow_schema(self.log.arrow_schema)
        self.reader = self._new_reader()
        self.offsets: list[dict[str, Any]] = []  # Spark's offset log: end offset of batch i
        self.committed = 0  # Spark's commit log: batches 0..committed-1 are done
        self.attempts: dict[int, list[tuple[Any, ...]]] = {}  # first attempt of each batch
        self.delivered: list[tuple[int, dict[str, Any]]] = []  # (batch id, record) of committed batches
        self.appended: dict[tuple[str, int], dict[str, Any]] = {}
        self.skipped_before_start: set[tuple[str, int]] = set()
        self.initial: dict[str, Any] | None = None
        self.limit_used: dict[int, int | None] = {}
        self.next_v = 0
        self.expected_snapshot: dict[int, int] = {}
        if starting != "earliest":  # history before the query starts: skipped, or folded into the snapshot
            # 30 keys beyond the appended ones plus a few of them: a snapshot spans several small batches
            self.log.append([{"k": k, "v": -1 - k} for k in [*range(100, 130), *range(4)]])
            self.log.append([{"k": 1, "v": None, "_op": "update"}, {"k": 2, "_op": "delete"}])
        self.starting = starting

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _new_reader(self) -> CdcStreamReader:
        return CdcStreamReader(_Config(self.options), self.schema)

    # ------------------------------------------------------------------ the world changes
    @rule(keys=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=8), op=st.sampled_from(["insert", "update", "delete"]))
    def append(self, keys: list[int], op: str) -> None:
        rows = []
        for k in keys:
            rows.append({"k": k, "v": self.next_v, "_op": op})
            self.next_v += 1
        self.log.append(rows)

    @rule(data=st.data())
    def split(self, data: st.DataObject) -> None:
        open_ids = self.log.open_channels()
        if len(open_ids) >= 6:
            return
        self.log.split(data.draw(st.sampled_from(open_ids)))

    @rule(data=st.data())
    def merge(self, data: st.DataObject) -> None:
        states = sorted((c for c in self.log.channels() if c.closed_at is None), key=lambda c: c.hash_range[0])
        if len(states) < 2:
            return
        i = data.draw(st.integers(0, len(states) - 2))
        self.log.merge([states[i].id, states[i + 1].id])

    @rule()
    def crash(self) -> None:
        """The driver dies: a new process starts from Spark's checkpoint."""
        self.reader = self._new_reader()
        self.initial = None

    # ------------------------------------------------------------------ Spark runs a batch
    def _read_batch(self, start: dict[str, Any], end: dict[str, Any], batch_id: int) -> list[tuple[Any, ...]]:
        parts = self.reader.partitions(start, end)
        pieces = [p.range for p in parts]  # type: ignore[attr-defined]
        first = self.pieces.setdefault(batch_id, pieces)
        assert pieces == first, f"batch {batch_id} replayed in other pieces: {first}, then {pieces}"
        rows: list[tuple[Any, ...]] = []
        # Tasks finish in any order: a batch cut into pieces is delivered last piece first.
        for part in reversed(parts) if "minPartitions" in self.options else parts:
            executor_copy = pickle.loads(pickle.dumps(self.reader))
            part = pickle.loads(pickle.dumps(part))
            for batch in executor_copy.read(part):
                assert batch.schema.equals(self.log.arrow_schema)
                t = pa.Table.from_batches([batch])
                for r in t.to_pylist():
                    rows.append((r["_channel"], r["_position"], r["_seq"], r["k"], r["v"], r["_op"]))
        return rows

    def _fold(self, idents: set[tuple[str, int]]) -> dict[int, int]:
        """The table the changes ``idents`` leave behind: an independent model of a snapshot."""
        table: dict[int, int] = {}
        for r in sorted(self.log.read_all().to_pylist(), key=lambda r: r["_seq"]):
            if (r["_channel"], r["_position"]) not in idents:
                continue
            if r["_op"] == "delete":
                table.pop(r["k"], None)
            else:
                table[r["k"]] = r["v"]
        return table

    def _start_of(self, batch_id: int) -> dict[str, Any]:
        if batch_id == 0:
            # Spark keeps no record of the initial offset: it asks the (possibly new) reader again.
            return self.reader.initialOffset()
        return self.offsets[batch_id - 1]

    @rule(limit=st.sampled_from([1, 2, 3, 5, 8, 13, None]), crash_before_commit=st.booleans())
    def run_batch(self, limit: int | None, crash_before_commit: bool) -> None:
        self._run_batch(limit, crash_before_commit)

    def _run_batch(self, limit: int | None, crash_before_commit: bool) -> bool:
        batch_id = self.committed
        if batch_id < len(self.offsets):  # replay the logged, uncommitted batch
            start, end = self._start_of(batch_id), self.offsets[batch_id]
        else:
            if batch_id == 0:
                if self.initial is None:  # this driver run asks for its initial offset once
                    self.initial = self.reader.initialOffset()
                    if self.starting == "latest":  # what exists now is before the query's start
                        self.skipped_before_start = {
                            (c.id, p) for c in self.log.channels() for p in range(c.head)
                        }
                    elif self.starting == "snapshot":  # changes before the cut are folded into the snapshot
                        cut = {c: e["pos"] for c, e in self.initial["channels"].items() if not e.get("snapshot")}
                        self.skipped_before_start = {(c, p) for c, head in cut.items() for p in range(head)}
                        self.expected_snapshot = self._fold(self.skipped_before_start)
                start = self.initial
            else:
                start = self.offsets[-1]
            read_limit = ReadMaxRows(limit) if limit else ReadAllAvailable()
            end = self.reader.latestOffset(start, read_limit)
            if end == start:
                return False
            self.offsets.append(end)
            self.limit_used[batch_id] = limit
        rows = self._read_batch(start, end, batch_id)
        if batch_id in self.attempts:
            assert rows == self.attempts[batch_id], f"batch {batch_id} replayed differently"
        else:
            self.attempts[batch_id] = rows
            lim = self.limit_used.get(batch_id)
            if lim is not None:
                assert len(rows) <= lim, f"batch {batch_id} has {len(rows)} rows over the limit {lim}"
        if crash_before_commit:
            self.crash()
            return True
        for r in rows:
            self.delivered.append((batch_id, {"ch": r[0], "pos": r[1], "seq": r[2], "k": r[3], "v": r[4], "op": r[5]}))
        self.committed += 1
        self.reader.commit(end)
        self._check_batch(batch_id)
        return True

    # ------------------------------------------------------------------ invariants
    def _check_batch(self, batch_id: int) -> None:
        batch_of: dict[tuple[str, int], int] = {}
        for b, r in self.delivered:
            ident = (r["ch"], r["pos"])
            assert ident not in batch_of, f"record {ident} delivered twice"
            batch_of[ident] = b
        # the full data first: a batch with changes comes after every snapshot row has been delivered
        this = [r for b, r in self.delivered if b == batch_id]
        if any(r["op"] != "snapshot" for r in this):
            earlier = sum(1 for b, r in self.delivered if b < batch_id and r["op"] == "snapshot")
            assert earlier == len(self.expected_snapshot), f"batch {batch_id} has changes before the snapshot ended"
        # lineage: every parent record precedes, in an earlier batch, any child record of this batch
        channels = {c.id: c for c in self.log.channels()}
        for r in this:
            if r["op"] == "snapshot":
                continue
            for parent in channels[r["ch"]].parents:
                pst = channels[parent]
                for pos in range(pst.earliest, pst.head):
                    if (parent, pos) in self.skipped_before_start:
                        continue
                    pb = batch_of.get((parent, pos))
                    assert pb is not None and pb < batch_id, (
                        f"child {r['ch']} delivered in batch {batch_id} before parent {parent} record {pos}"
                    )

    @invariant()
    def per_key_order(self) -> None:
        if not hasattr(self, "delivered"):
            return
        last: dict[int, int] = defaultdict(lambda: -1)
        for _b, r in sorted(self.delivered, key=lambda x: (x[0], x[1]["seq"])):
            assert r["seq"] > last[r["k"]]
            last[r["k"]] = r["seq"]
        # within each batch, a key's records come from one channel, and _seq orders them as positions do (what
        # a batch read in pieces relies on)
        seen: dict[tuple[int, int], str] = {}
        last_pos: dict[tuple[int, int], int] = {}
        for b, r in sorted(self.delivered, key=lambda x: (x[0], x[1]["seq"])):
            ch = seen.setdefault((b, r["k"]), r["ch"])
            assert ch == r["ch"], f"key {r['k']} read from two channels in batch {b}"
            assert r["pos"] > last_pos.get((b, r["k"]), -1), f"key {r['k']}: _seq and positions disagree"
            last_pos[(b, r["k"])] = r["pos"]

    @precondition(lambda self: hasattr(self, "log"))
    @rule()
    def drain_and_check_everything_delivered_once(self) -> None:
        for _ in range(200):
            if not self._run_batch(None, False) and self.committed == len(self.offsets):
                break
        delivered = {(r["ch"], r["pos"]) for _b, r in self.delivered}
        assert len(delivered) == len(self.delivered), "duplicates"
        everything = {(c.id, pos) for c in self.log.channels() for pos in range(c.earliest, c.head)}
        # startingOffsets=latest: what existed before the query started is not delivered
        # startingOffsets=snapshot: it is delivered folded, as the snapshot's rows
        missing = everything - self.skipped_before_start - delivered
        assert not missing, f"lost records: {sorted(missing)[:10]}"
        snapshot_rows = [r for _b, r in self.delivered if r["op"] == "snapshot"]
        assert {r["k"]: r["v"] for r in snapshot_rows} == self.expected_snapshot
        assert len(snapshot_rows) == len(self.expected_snapshot)


TestStreamProtocol = StreamProtocol.TestCase
# Hundreds of histories per CI run (about a minute on 2 cores); the "dev" profile runs fewer.
TestStreamProtocol.settings = settings(
    max_examples=300 if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci" else 50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
