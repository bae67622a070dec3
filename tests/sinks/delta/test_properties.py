"""Stateful property tests: the Delta table equals a model of the source table after every batch.

Random histories of inserts, updates and deletes on a few keys are delivered to the sink's core
(:meth:`DeltaUpsertSink.write`, Arrow in, a real delta-rs commit out) in batches that reorder changes
within a bounded window, re-deliver old changes (duplicates), replay whole batches (same batch id) and
crash (a new sink object, then Spark's replay of the last batch), also between the main table's commit and the state
table's. Columns appear mid-history (schema
evolution), the table is compacted periodically, and the clock jumps past the tombstone retention (tombstones
purged). The model is computed independently: per key, the delivered change with the largest sequence
decides the row (a delete: no row); after a purge, a purged key's sequence is forgotten. Partial updates
(Tablestore's UpdateRow: some columns set, the others listed in ``_unchanged`` and carrying junk) are folded by
the model change by change: per key, the changes newer than the last applied one, in sequence order. SCD
type 2 places the older ones (late changes, partial changes, deletes and re-inserts; a rule delivers the
newest pending changes first to make them) into the model's history by the back-fill rules
(:mod:`sinks.delta.backfill`), change by change, before the newer ones.

Every check reads the main table with ``deltalake`` directly (as any Delta reader would, not through
:func:`sinks.delta.read`): its rows must be exactly the model's live rows (SCD2: versions), with no tombstone;
tombstones and sequences are checked in the state table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sinks.delta import DeltaUpsertSink
from sinks.delta.layout import DELETED_AT, IS_CURRENT, VALID_FROM, VALID_TO, state_path

TS = pa.timestamp("us", tz="UTC")
KEYS = st.tuples(st.integers(0, 5), st.sampled_from(["x", "y"]))  # a two-column key
VALUES = st.tuples(st.sampled_from(["p", "q", None]), st.integers(0, 2))
VALUE_COLS = ("a", "b", "c")
KINDS = ("upsert", "upsert", "delete", "partial")
JUNK = {"a": "junk", "b": 99, "c": 999}  # values of columns a partial change leaves unchanged: never applied


def batch_table(changes: list[dict[str, Any]]) -> pa.Table:
    with_c = any("c" in ch for ch in changes)
    partial = any(ch.get("_unchanged") for ch in changes)
    cols: dict[str, pa.Array] = {
        "_op": pa.array([ch["_op"] for ch in changes], pa.string()),
        "_seq": pa.array([ch["_seq"] for ch in changes], pa.int64()),
        "_commit_ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * len(changes), TS),
        "_channel": pa.array(["c0"] * len(changes), pa.string()),
        "_position": pa.array([ch["_seq"] for ch in changes], pa.int64()),
        "k1": pa.array([ch["k1"] for ch in changes], pa.int64()),
        "k2": pa.array([ch["k2"] for ch in changes], pa.string()),
        "a": pa.array([ch["a"] for ch in changes], pa.string()),
        "b": pa.array([ch["b"] for ch in changes], pa.int32()),
    }
    if with_c:
        cols["c"] = pa.array([ch.get("c") for ch in changes], pa.int64())
    if partial:
        cols["_unchanged"] = pa.array([ch.get("_unchanged") for ch in changes], pa.list_(pa.string()))
    return pa.table(cols)


def fold(state: tuple[Any, ...] | None, ch: dict[str, Any], ignore_nulls: tuple[str, ...] = ()) -> tuple[Any, ...] | None:
    """One change applied to a row (None: no row). A partial update overlays the columns it sets on the row,
    or on an all-null row when there is none (Tablestore's UpdateRow). A column of ``ignore_nulls``
    (``ignore_null_updates``) whose value is null is left as the row has it, the same way."""
    if ch["_op"] == "delete":
        return None
    full = (ch["a"], ch["b"], ch.get("c"))
    kept = set(ch.get("_unchanged") or ()) | {c for i, c in enumerate(VALUE_COLS) if c in ignore_nulls and full[i] is None}
    if not kept:
        return full
    base = state or (None, None, None)
    return tuple(base[i] if name in kept else full[i] for i, name in enumerate(VALUE_COLS))


class SinkMachine(RuleBasedStateMachine):
    scd_type = 1
    track: tuple[str, ...] | None = None
    #: the sink's ignore_null_updates_column_list (the model folds those nulls as "unchanged")
    ignore_nulls: tuple[str, ...] = ()
    sequence_by: Any = "_seq"

    def __init__(self) -> None:
        super().__init__()
        # The table in a folder of its own, which teardown removes (with the twin delta-spark table beside it).
        self.dir = tempfile.mkdtemp(prefix="delta-prop-")
        self.path = os.path.join(self.dir, "table")
        self.sink = self._new_sink()
        self.seq = 0
        self.source: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.pending: list[dict[str, Any]] = []
        self.delivered: list[dict[str, Any]] = []
        self.by_seq: dict[int, dict[str, Any]] = {}
        self.has_c = False
        self.batch_id = 0
        self.last: pa.Table | None = None
        self.now = datetime(2025, 1, 1, tzinfo=UTC)
        # The model: per key, the last applied sequence and row (None: a tombstone).
        self.applied: dict[tuple[Any, ...], tuple[int, tuple[Any, ...] | None]] = {}
        self.versions: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self.state_at: dict[tuple[tuple[Any, ...], int], tuple[Any, ...] | None] = {}
        self.backfilled: set[tuple[Any, ...]] = set()  # SCD2: keys a late change went into the history of
        self.purged = False
        self.any_partial = False
        self.lossy = False  # a partial history delivered out of order across batches: the table may lag the source
        self.any_partial = bool(self.ignore_nulls)  # (an update with an ignored null is a partial change)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def to_table(self, changes: list[dict[str, Any]]) -> pa.Table:
        return batch_table(changes)

    def _new_sink(self) -> DeltaUpsertSink:
        return DeltaUpsertSink(
            self.path, keys=["k1", "k2"], scd_type=self.scd_type, track_history_column_list=self.track,
            app_id="prop-test", compact_every=4, tombstone_retention=timedelta(hours=1), clock=lambda: self.now,
            ignore_null_updates_column_list=self.ignore_nulls or None, sequence_by=self.sequence_by,
        )

    def _version(self) -> tuple[int, int]:
        """The versions of the main and the state table (-1: no table yet)."""
        out = []
        for table in (self.path, state_path(self.path)):
            try:
                out.append(DeltaTable(table).version())
            except Exception:
                out.append(-1)
        return out[0], out[1]

    def _model_version(self, key: tuple[Any, ...], seq: int, row: tuple[Any, ...] | None) -> None:
        """SCD type 2 model: every applied change is a version, unless it changes no tracked column (then it
        updates the open version in place); a delete closes the open version."""
        versions = self.versions.setdefault(key, [])
        open_ = versions[-1] if versions and versions[-1]["to"] is None else None
        tracked = [VALUE_COLS.index(c) for c in (self.track or VALUE_COLS)]
        if row is not None and open_ is not None and all(row[i] == open_["row"][i] for i in tracked):
            open_.update(seq=seq, row=row)
            return
        if open_ is not None:
            open_["to"] = seq
        if row is not None:
            versions.append({"from": seq, "to": None, "seq": seq, "row": row})

    def _model_late(self, key: tuple[Any, ...], ch: dict[str, Any], head: int, tomb: bool) -> None:
        """SCD type 2 model of a late change (sequence not above the key's head), by the back-fill rules: it
        splits the version it falls into (which resumes at its last change when that was later), updates
        it in place (no tracked change, later than its last change), closes it (a delete), or opens a
        version in a gap until the next version (or the tombstone); a new version with the tracked values of
        the version right after it joins it; a stored change's sequence again is a redelivery."""
        q = ch["_seq"]
        vs = self.versions.setdefault(key, [])
        tracked = [VALUE_COLS.index(c) for c in (self.track or VALUE_COLS)]

        def same(r1: tuple[Any, ...], r2: tuple[Any, ...]) -> bool:
            return all(r1[i] == r2[i] for i in tracked)

        def add(v: dict[str, Any]) -> None:
            after = [w for w in vs if w["from"] > v["from"]]
            nxt = min(after, key=lambda w: w["from"]) if after else None
            if nxt is not None and v["to"] == nxt["from"] and same(v["row"], nxt["row"]):
                nxt["from"] = v["from"]
            else:
                vs.append(v)
            vs.sort(key=lambda w: w["from"])

        x = next((v for v in vs if v["from"] <= q and (v["to"] is None or q < v["to"])), None)
        if x is None:
            if ch["_op"] == "delete":
                return
            assert not (tomb and q == head), "the generator makes no ties"
            after = [w["from"] for w in vs if w["from"] > q]
            end = min(after) if after else (head if tomb else None)
            add({"from": q, "to": end, "seq": q, "row": fold(None, ch, self.ignore_nulls)})
            return
        if q in (x["from"], x["seq"]):
            return
        resumes = q < x["seq"] and (x["to"] is None or x["seq"] < x["to"])
        tail = {**x, "from": x["seq"], "row": x["row"]} if resumes else None
        if ch["_op"] == "delete":
            x["to"] = q
        else:
            row = fold(x["row"], ch, self.ignore_nulls)
            assert row is not None
            if same(row, x["row"]):
                if q > x["seq"]:
                    x.update(row=row, seq=q)
                return
            new = {"from": q, "to": tail["from"] if tail else x["to"], "seq": q, "row": row}
            x["to"] = q
            if tail:
                vs.append(tail)
            add(new)
            return
        if tail:
            vs.append(tail)
            vs.sort(key=lambda w: w["from"])

    # ------------------------------------------------------------------ the source
    @rule(ops=st.lists(st.tuples(st.sampled_from(KINDS), KEYS, VALUES, st.sets(st.sampled_from(VALUE_COLS), min_size=1)),
                       min_size=1, max_size=6))
    def write(self, ops: list[tuple[str, tuple[int, str], tuple[Any, int], set[str]]]) -> None:
        for kind, key, (a, b), unchanged in ops:
            self.seq += 1
            ch: dict[str, Any] = {"_seq": self.seq, "k1": key[0], "k2": key[1]}
            if kind == "delete":
                # A delete of an absent key happens too (e.g. a delete racing a snapshot).
                ch.update(_op="delete", a=None, b=None)
            else:
                ch.update(_op="update" if key in self.source else "insert", a=a, b=b)
                if self.has_c:
                    ch["c"] = b * 10 + self.seq
                if kind == "partial":
                    # Tablestore UpdateRow: only some columns set; the others' values mean nothing (junk here).
                    kept = sorted(c for c in unchanged if c != "c" or self.has_c)
                    if kept and len(kept) < 2 + self.has_c:
                        ch.update(_op="update", _unchanged=kept)
                        ch.update({c: JUNK[c] for c in kept})
                        self.any_partial = True
            if kind == "delete" and self.has_c:
                ch["c"] = None
            row = fold(self.source.get(key), ch, self.ignore_nulls)
            if row is None:
                self.source.pop(key, None)
            else:
                self.source[key] = row
            self.pending.append(ch)
            self.by_seq[self.seq] = ch

    @precondition(lambda self: not self.has_c)
    @rule()
    def add_column(self) -> None:
        self.has_c = True

    # ------------------------------------------------------------------ deliveries
    @precondition(lambda self: self.pending or self.delivered)
    @rule(data=st.data(), n=st.integers(1, 8), window=st.integers(0, 3), dups=st.integers(0, 3),
          crash_between=st.booleans())
    def deliver(self, data: st.DataObject, n: int, window: int, dups: int, crash_between: bool) -> None:
        reachable = self.pending[: n + window]
        chosen = data.draw(st.lists(st.sampled_from(range(len(reachable))), unique=True, max_size=n), "picks") if reachable else []
        batch = [reachable[i] for i in chosen]
        if self.delivered and dups:
            batch += data.draw(st.lists(st.sampled_from(self.delivered), max_size=dups), "duplicates")
        if not batch:
            return
        batch = data.draw(st.permutations(batch), "order")
        picked = {id(ch) for ch in (reachable[i] for i in chosen)}
        self.pending = [ch for ch in self.pending if id(ch) not in picked]
        self.delivered += [reachable[i] for i in chosen]
        # The model: per key, the batch's changes newer than the key's last applied one, applied in
        # sequence order (a per-row Python fold, independent of the sink's vectorised one).
        by_key: dict[tuple[Any, ...], dict[int, dict[str, Any]]] = {}
        for ch in batch:
            by_key.setdefault((ch["k1"], ch["k2"]), {})[ch["_seq"]] = ch
        for ch in (reachable[i] for i in chosen):
            key = (ch["k1"], ch["k2"])
            if key in self.applied and ch["_seq"] < self.applied[key][0] and self.any_partial:
                self.lossy = True
        for key, changes in by_key.items():
            last_seq, row = self.applied.get(key, (None, None))
            if self.scd_type == 2 and last_seq is not None:  # late changes go into history, in sequence order
                for q in sorted(q for q in changes if q <= last_seq):
                    self._model_late(key, changes[q], last_seq, row is None)
                    self.backfilled.add(key)
            fresh = [changes[q] for q in sorted(changes) if last_seq is None or q > last_seq]
            for ch in fresh:
                row = fold(row, ch, self.ignore_nulls)
                self.state_at[(key, ch["_seq"])] = row
                if self.scd_type == 2:
                    self._model_version(key, ch["_seq"], row)
            if fresh:
                self.applied[key] = (fresh[-1]["_seq"], row)
                self.state_at[(key, fresh[-1]["_seq"])] = row
        table = self.to_table(batch)
        if crash_between:
            # The process dies after the main table's commit, before the state table's: the restarted sink
            # gets the batch again and must commit the state alone, from the state as it was.
            self.sink.state_engine().merge = _crash  # type: ignore[method-assign]
            try:
                self.sink.write(table, self.batch_id)
                raise AssertionError("the state commit did not run")
            except _Crash:
                pass
            main_after = self._version()[0]
            assert DeltaTable(self.path).transaction_version("prop-test") == self.batch_id
            self.sink = self._new_sink()
            assert self.sink.write(table, self.batch_id)
            later = [h["operation"] for h in DeltaTable(self.path).history() if h["version"] > main_after]
            assert "MERGE" not in later, "the replay merged into the main table again"
        else:
            assert self.sink.write(table, self.batch_id)
        self.last = table
        self.batch_id += 1

    @precondition(lambda self: self.last is not None)
    @rule()
    def replay(self) -> None:
        before = self._version()
        assert self.last is not None
        assert not self.sink.write(self.last, self.batch_id - 1)
        assert self._version() == before

    @precondition(lambda self: self.last is not None)
    @rule()
    def crash_and_restart(self) -> None:
        # The process died after the batch's commit but before Spark recorded the batch as done: a new
        # sink (new engine, no cached state) receives the same batch id again.
        before = self._version()
        self.sink = self._new_sink()
        assert self.last is not None
        assert not self.sink.write(self.last, self.batch_id - 1)
        assert self._version() == before

    @rule()
    def expire_tombstones(self) -> None:
        # Past the retention every tombstone is purged; the model forgets those keys' sequences.
        self.now += timedelta(hours=2)
        self.sink.maintain()
        if self.scd_type == 1:  # SCD2 keeps its tombstones with the history
            self.applied = {k: v for k, v in self.applied.items() if v[1] is not None}
            self.purged = True

    # ------------------------------------------------------------------ checks
    def expected(self) -> tuple[dict[tuple[Any, ...], tuple[Any, ...]], dict[tuple[Any, ...], int]]:
        live = {k: row for k, (_, row) in self.applied.items() if row is not None}
        if not self.purged and not self.any_partial:
            # Without purges or partial changes the model is simply: per key, the delivered change with the
            # largest sequence.
            latest: dict[tuple[Any, ...], dict[str, Any]] = {}
            for ch in self.delivered:
                key = (ch["k1"], ch["k2"])
                if key not in latest or ch["_seq"] > latest[key]["_seq"]:
                    latest[key] = ch
            assert live == {k: (c["a"], c["b"], c.get("c")) for k, c in latest.items() if c["_op"] != "delete"}
        return live, {k: seq for k, (seq, _) in self.applied.items()}

    def rows(self) -> list[dict[str, Any]]:
        """The main table's rows, read by deltalake as any Delta reader would."""
        if self._version()[0] < 0:
            return []
        rows: list[dict[str, Any]] = DeltaTable(self.path).to_pyarrow_table().to_pylist()
        assert all(DELETED_AT not in r for r in rows), "the main table has no tombstone column"
        return rows

    def state_rows(self) -> list[dict[str, Any]]:
        if self._version()[1] < 0:
            return []
        rows: list[dict[str, Any]] = DeltaTable(state_path(self.path)).to_pyarrow_table().to_pylist()
        return rows

    def check_current(self, current: list[dict[str, Any]]) -> None:
        live, last_seq = self.expected()
        got = {(r["k1"], r["k2"]): (r["a"], r["b"], r.get("c")) for r in current}
        assert len(got) == len(current), "one row per key"
        assert got == live
        heads = self.state_rows()
        seqs = {(r["k1"], r["k2"]): r["_seq"] for r in heads}
        assert len(seqs) == len(heads), "one state row per key"
        assert seqs == last_seq, "the state keeps each key's last applied sequence (live key or tombstone)"
        deleted = {(r["k1"], r["k2"]) for r in heads if r[DELETED_AT] is not None}
        assert deleted == set(last_seq) - set(live), "the state's tombstones are the deleted keys"
        assert {(r["k1"], r["k2"]): r["_seq"] for r in current} == {k: q for k, q in seqs.items() if k in live}
        if not self.pending and not self.purged and not self.lossy:
            assert got == self.source, "everything delivered: the table equals the source table"


class _Crash(Exception):
    pass


def _crash(*args: Any, **kwargs: Any) -> dict[str, Any]:
    raise _Crash("killed between the main table's commit and the state table's")


class SCD1Machine(SinkMachine):
    @invariant()
    def table_equals_model(self) -> None:
        self.check_current(self.rows())


class SCD2Machine(SinkMachine):
    scd_type = 2
    track = ("a", "c")

    @precondition(lambda self: len(self.pending) > 1)
    @rule(data=st.data(), n=st.integers(1, 4), crash_between=st.booleans())
    def deliver_newest_first(self, data: st.DataObject, n: int, crash_between: bool) -> None:
        """The newest pending changes first: the older ones, delivered later, are late (changes, partial
        changes, deletes and re-inserts older than their key's head), and go into the history."""
        self.pending.reverse()
        try:
            self.deliver(data, n, 0, 0, crash_between)
        finally:
            self.pending.reverse()

    @invariant()
    def history_is_consistent(self) -> None:
        versions = self.rows()
        current = [r for r in versions if r[IS_CURRENT]]
        self.check_current(current)
        by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in versions:
            by_key.setdefault((r["k1"], r["k2"]), []).append(r)
        for key, vs in by_key.items():
            vs.sort(key=lambda r: r[VALID_FROM])
            assert len({r[VALID_FROM] for r in vs}) == len(vs), f"{key}: two versions from the same change"
            assert sum(r[IS_CURRENT] for r in vs) <= 1, f"{key}: more than one current version"
            for r in vs:
                assert (r[VALID_TO] is None) == r[IS_CURRENT], f"{key}: only the current version is open"
                assert r[VALID_TO] is None or r[VALID_FROM] < r[VALID_TO]
                assert r[VALID_FROM] <= r["_seq"], f"{key}: a version's last change is not before it"
                src = self.by_seq[r["_seq"]]
                assert (src["k1"], src["k2"]) == key
                if key not in self.backfilled:  # (a back-filled version holds its late change's values)
                    assert self.state_at[(key, r["_seq"])] == (r["a"], r["b"], r.get("c")), f"{key}: version values"
            model = [(v["from"], v["to"], v["seq"], v["row"]) for v in self.versions.get(key, [])]
            assert [(r[VALID_FROM], r[VALID_TO], r["_seq"], (r["a"], r["b"], r.get("c"))) for r in vs] == model, (
                f"{key}: the history equals the model's versions"
            )
            for older, newer in zip(vs, vs[1:], strict=False):
                assert older[VALID_TO] is not None and older[VALID_TO] <= newer[VALID_FROM], f"{key}: overlapping versions"
                if older[VALID_TO] == newer[VALID_FROM]:
                    tracked = [c for c in self.track or VALUE_COLS]
                    assert any(older.get(c) != newer.get(c) for c in tracked), f"{key}: a new version without a tracked change"


TestSCD1 = SCD1Machine.TestCase
TestSCD1.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)

class IgnoreNullsMachine(SCD1Machine):
    """SCD type 1 with ``ignore_null_updates_column_list=["a"]``: a null ``a`` in an update keeps the stored
    value (a fresh key stores it); ``b``'s nulls overwrite. The model folds such nulls as columns left
    unchanged, change by change in sequence order. (Not ``c``: it appears mid-history, and a list naming a
    column the changes do not carry fails the batch.)"""

    ignore_nulls = ("a",)


TestIgnoreNulls = IgnoreNullsMachine.TestCase
TestIgnoreNulls.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestSCD2 = SCD2Machine.TestCase
TestSCD2.settings = settings(max_examples=70, stateful_step_count=30, deadline=None)


class CompositeSequenceMachine(SCD1Machine):
    """SCD type 1 ordered by two columns, ``sequence_by=["hi", "lo"]``: each change's ``_seq`` s is sent as
    (hi, lo) = (s // 3 - 5, s % 3 - 1), which orders the changes as s does only when compared field by field
    (hi first; lo breaks its ties, and is larger for an older change of the next hi). ``_seq`` stays a plain
    value column; the state table's guard is the struct ``_sequence``, mapped back to s to check it."""

    sequence_by = ["hi", "lo"]

    def to_table(self, changes: list[dict[str, Any]]) -> pa.Table:
        seqs = [ch["_seq"] for ch in changes]
        table = batch_table(changes)
        table = table.append_column("hi", pa.array([q // 3 - 5 for q in seqs], pa.int64()))
        return table.append_column("lo", pa.array([q % 3 - 1 for q in seqs], pa.int32()))

    def state_rows(self) -> list[dict[str, Any]]:
        rows = super().state_rows()
        return [{**r, "_seq": (r["_sequence"]["hi"] + 5) * 3 + r["_sequence"]["lo"] + 1} for r in rows]


TestCompositeSequence = CompositeSequenceMachine.TestCase
TestCompositeSequence.settings = settings(max_examples=20, stateful_step_count=30, deadline=None)
