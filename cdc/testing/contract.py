"""The backend contract suite (needs pytest). A backend's test module subclasses :class:`BackendContract`
and provides a ``harness`` fixture (a :class:`cdc.testing.Harness`); every test here then runs against it.
A backend that offers chunked snapshots subclasses :class:`ChunkedSnapshotContract` too."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc.backend import Backend
from cdc.errors import OptionError, PositionError
from cdc.offsets import Offset
from cdc.partitions import check_splittable, split_ranges
from cdc.planner import Planner
from cdc.testing.harness import Harness, drain, read_batch, read_range
from cdc.testing.scripts import Append, Batch, Crash, Merge, Split, Step, play


def assert_unbudgeted_count(harness: Harness, records: int, rows: int) -> None:
    """A plan without a record budget counts exactly, or (where the harness says so) reports a lower bound
    that is zero exactly for an empty range (rule 2 of :mod:`cdc.backend`)."""
    if harness.exact_counts_without_budget:
        assert records == rows
    else:
        assert (records == 0) == (rows == 0) and records <= rows


class BackendContract:
    """Tests every backend must pass."""

    # ------------------------------------------------------------------ schema
    def test_schema_round_trips_through_spark_exactly(self, harness: Harness) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        schema = harness.backend().schema()
        spark_schema = from_arrow_schema(schema)
        assert to_arrow_schema(spark_schema, timezone="UTC").remove_metadata() == schema.remove_metadata()

    def test_has_channels(self, harness: Harness) -> None:
        channels = harness.backend().list_channels()
        assert channels
        assert len({c.id for c in channels}) == len(channels)

    # ------------------------------------------------------------------ planning and reading
    def test_plan_counts_match_reads_and_respect_limit(self, harness: Harness) -> None:
        harness.append(50)
        backend = harness.backend()
        total = 0
        for ch in backend.list_channels():
            start = backend.earliest(ch.id)
            planned = backend.plan(ch.id, start, max_records=7)
            assert planned.records <= 7
            assert read_range(backend, ch.id, start, planned.end).num_rows == planned.records
            full = backend.plan(ch.id, start)
            rows = read_range(backend, ch.id, start, full.end).num_rows
            assert_unbudgeted_count(harness, full.records, rows)
            total += rows
        assert total == 50

    def test_same_range_reads_same_records(self, harness: Harness) -> None:
        harness.append(40)
        backend = harness.backend()
        for ch in backend.list_channels():
            start = backend.earliest(ch.id)
            planned = backend.plan(ch.id, start, max_records=25)
            first = read_range(backend, ch.id, start, planned.end)
            harness.append(10)  # later appends never change a planned range
            again = read_range(harness.backend(), ch.id, start, planned.end)
            assert first.equals(again)

    def test_adjacent_ranges_concatenate_to_the_whole(self, harness: Harness) -> None:
        harness.append(60)
        backend = harness.backend()
        for ch in backend.list_channels():
            start = backend.earliest(ch.id)
            whole = read_range(backend, ch.id, start, backend.plan(ch.id, start).end)
            pieces, pos = [], start
            while True:
                p = backend.plan(ch.id, pos, max_records=4)
                if p.records == 0:
                    break
                pieces.append(read_range(backend, ch.id, pos, p.end))
                pos = p.end
            joined = pa.concat_tables(pieces) if pieces else whole.schema.empty_table()
            assert joined.equals(whole)

    def test_plan_respects_until(self, harness: Harness) -> None:
        harness.append(30)
        backend = harness.backend()
        for ch in backend.list_channels():
            start = backend.earliest(ch.id)
            mid = backend.plan(ch.id, start, max_records=3).end
            harness.append(10)
            p = backend.plan(ch.id, start, until=mid)
            assert p.end == mid
            assert_unbudgeted_count(harness, p.records, read_range(backend, ch.id, start, mid).num_rows)

    def test_latest_has_nothing_to_read(self, harness: Harness) -> None:
        harness.append(10)
        backend = harness.backend()
        for ch in backend.list_channels():
            latest = backend.latest(ch.id)
            p = backend.plan(ch.id, latest)
            assert p.records == 0 and p.end == latest

    def test_empty_log_is_not_an_error(self, harness: Harness) -> None:
        backend = harness.backend()
        for ch in backend.list_channels():
            p = backend.plan(ch.id, backend.earliest(ch.id))
            assert p.records == 0
            assert read_range(backend, ch.id, backend.earliest(ch.id), p.end).num_rows == 0

    def test_bad_position_is_rejected(self, harness: Harness) -> None:
        backend = harness.backend()
        ch = backend.list_channels()[0]
        with pytest.raises((PositionError, ValueError)):
            backend.parse_position(ch.id, {"not": "a position"})

    def test_acknowledge_is_harmless(self, harness: Harness) -> None:
        harness.append(10)
        backend = harness.backend()
        positions = {ch.id: backend.latest(ch.id) for ch in backend.list_channels()}
        backend.acknowledge(positions)
        backend.acknowledge(positions)  # twice: idempotent
        assert sum(t.num_rows for t in drain(harness.backend())) == 10  # nothing lost to an ack

    # ------------------------------------------------------------------ the planner over this backend
    def test_planner_delivers_everything_once(self, harness: Harness) -> None:
        harness.append(37)
        batches = list(drain(harness.backend(), limit=5))
        assert all(b.num_rows <= 5 for b in batches)
        assert sum(b.num_rows for b in batches) == 37

    def test_new_records_arrive_in_later_batches(self, harness: Harness) -> None:
        backend = harness.backend()
        planner = Planner(backend)
        start = planner.initial("latest")
        harness.append(12)
        end = planner.next(start)
        rows = sum(read_range(backend, r.channel, r.start, r.end).num_rows for r in planner.ranges(start, end))
        assert rows == 12

    # ------------------------------------------------------------------ split reads (minPartitions)
    def test_split_read_holds_exactly_the_records_of_the_unsplit_one(self, harness: Harness) -> None:
        """A backend that splits: a batch's ranges cut at its split points read, piece by piece, exactly the
        records of the whole ranges; ``_seq`` sorts them back (per channel) into the read order; a replay, after
        more records arrived, cuts the same pieces. A backend that cannot: ``minPartitions`` is refused naming
        the backend and why."""
        backend = harness.backend()
        cls = type(backend)
        refusal = cls.split_refusal(backend.options)
        if refusal is not None:
            with pytest.raises(OptionError) as refused:
                check_splittable(cls, backend.options, 4)
            assert refused.value.option == "minPartitions"
            assert f"backend {cls.name!r}" in str(refused.value) and refusal in str(refused.value)
            return
        for _ in range(8):
            harness.append(6)  # apart: every append leaves a place to cut (a segment file, a ledger entry)
        planner = Planner(backend)
        start = planner.initial("earliest")
        end = planner.next(start)
        ranges = planner.ranges(start, end)
        pieces = split_ranges(ranges, 4 * len(ranges), backend)
        assert len(pieces) > len(ranges), f"no range of {[str(r) for r in ranges]} was cut"
        for r in ranges:
            mine = [p for p in pieces if p.channel == r.channel]
            assert mine[0].start == r.start and mine[-1].end == r.end
            assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
            whole = read_range(backend, r.channel, r.start, r.end)
            parts = [read_range(backend, p.channel, p.start, p.end) for p in mine]
            assert all(t.num_rows > 0 for t in parts), "a piece holds no record"
            assert pa.concat_tables(parts).equals(whole)
            if harness.order_columns is not None:
                order = harness.order_columns[1]
                shuffled = pa.concat_tables(parts[::-1])  # tasks finish in any order
                assert shuffled.sort_by(order).equals(whole)
        harness.append(10)  # later records change neither the batch nor how it is cut
        replayed = harness.backend()
        assert split_ranges(Planner.ranges(start, end), 4 * len(ranges), replayed) == pieces

    # ------------------------------------------------------------------ lineage
    def test_split_finishes_parent_and_children_follow(self, harness: Harness) -> None:
        if not harness.supports_split:
            pytest.skip("this backend's channels do not split")
        harness.append(20)
        backend = harness.backend()
        parent = backend.list_channels()[0].id
        children = harness.split(parent)
        harness.append(20)
        backend = harness.backend()
        infos = {c.id: c for c in backend.list_channels()}
        assert infos[parent].finished
        for c in children:
            assert parent in infos[c].parents
        final = backend.plan(parent, backend.earliest(parent))
        assert final.finished
        assert sum(b.num_rows for b in drain(backend, limit=6)) == 40

    def test_merge_finishes_parents(self, harness: Harness) -> None:
        if not harness.supports_merge:
            pytest.skip("this backend's channels do not merge")
        backend = harness.backend()
        open_ids = [c.id for c in backend.list_channels() if not c.finished]
        if len(open_ids) < 2:
            open_ids = list(harness.split(open_ids[0]))
        harness.append(15)
        child = harness.merge(open_ids[:2])
        harness.append(15)
        backend = harness.backend()
        infos = {c.id: c for c in backend.list_channels()}
        assert set(open_ids[:2]) <= set(infos[child].parents)
        assert all(infos[p].finished for p in open_ids[:2])
        assert sum(b.num_rows for b in drain(backend, limit=4)) == 30

    # ------------------------------------------------------------------ a scripted history with crashes
    def test_scripted_history_with_crashes_delivers_everything_once(self, harness: Harness) -> None:
        script: list[Step] = [Append(12), Batch(5), Crash(4), Append(6), Split(), Append(9), Crash(3), Batch(7),
                  Merge(), Append(8), Crash(), Append(3)]
        result = play(harness, script)
        assert result.delivered == result.appended == 38 and result.replays == 3


def _keys(schema: pa.Schema) -> list[str]:
    """The key columns of a change-model schema: its non-nullable columns besides the metadata."""
    from cdc.model import METADATA_COLUMNS

    return [f.name for f in schema if not f.nullable and f.name not in METADATA_COLUMNS]


def fold(tables: list[pa.Table], keys: list[str]) -> dict[Any, dict[str, Any]]:
    """Records applied in delivery order, by key (whole rows; a delete removes the key)."""
    state: dict[Any, dict[str, Any]] = {}
    for t in tables:
        for row in t.to_pylist():
            key = tuple(row[k] for k in keys)
            if row["_op"] == "delete":
                state.pop(key, None)
            else:
                state[key] = {k: v for k, v in row.items() if not k.startswith("_")}
    return state


def drain_snapshot(backend: Backend, start: dict[str, Any]) -> list[pa.Table]:
    """Every batch from ``start`` until the chunked snapshot is done and nothing moves."""
    planner = Planner(backend)
    out: list[pa.Table] = []
    for _ in range(1000):
        end = planner.next(start)
        if end == start:
            state = Offset.from_json(end).snapshot
            if state is None or not state.pending:
                return out
            continue
        out.append(read_batch(backend, start, end))
        backend.acknowledge(Offset.from_json(end).positions())
        start = end
    raise AssertionError("the chunked snapshot never finished")


def _exact_in_order(delivered: list[pa.Table], keys: list[str], table: dict[Any, Any]) -> None:
    """What a chunked snapshot ``delivered`` folds to the source ``table``, and every key's records come in
    increasing ``_seq``: none older than one before it."""
    assert fold(delivered, keys) == table
    last: dict[Any, int] = {}
    for t in delivered:
        for row in t.select([*keys, "_seq"]).to_pylist():
            key = tuple(row[k] for k in keys)
            assert row["_seq"] > last.get(key, -1)
            last[key] = row["_seq"]


class ChunkedSnapshotContract:
    """Rule 1 for a chunked snapshot's ranges (see :mod:`cdc.backend`): every read of a chunk is exact with respect
    to its cut, and once one has completed every later read yields the same records; a replay whose cut is gone
    reads at a later cut, which the next batch learns and holds back. A backend's test module subclasses this
    with a ``harness`` fixture whose :class:`Harness` implements ``start_chunked``, ``update`` and ``table``."""

    def _first_batch(self, harness: Harness) -> tuple[Backend, dict[str, Any], dict[str, Any]]:
        backend = harness.start_chunked(rows=30, chunk_rows=10)
        planner = Planner(backend)
        start = planner.initial("snapshot")
        end = planner.next(start)
        assert Offset.from_json(end).snapshot is not None and Offset.from_json(end).snapshot.chunks()  # type: ignore[union-attr]
        return backend, start, end

    def test_a_chunk_is_read_as_of_its_cut(self, harness: Harness) -> None:
        """A chunk holds the table as of its batch's cut, or, read at a later cut of its own (a reader that cannot
        share the batch's read view: ``connectorx`` on MariaDB), as of that read, its rows' ``_seq`` after the
        batch's cut and its changes up to there held back by the next batches: the snapshot then ends exact."""
        backend, start, end = self._first_batch(harness)
        before = harness.table()
        harness.update(10)  # after the cut: not in the rows of a chunk read at it
        after = harness.table()
        got = read_batch(backend, start, end)
        cut = Offset.from_json(end).snapshot.cut  # type: ignore[union-attr]
        rows = got.filter(pc.equal(got.column("_op"), "snapshot"))
        assert rows.num_rows > 0
        keys = _keys(backend.schema())
        for seq in set(rows.column("_seq").to_pylist()):
            assert seq >= cut.seq, (seq, cut.seq)  # type: ignore[union-attr]
            expected = before if seq == cut.seq else after  # type: ignore[union-attr]
            for key, row in fold([rows.filter(pc.equal(rows.column("_seq"), seq))], keys).items():
                assert row == expected[key]
        _exact_in_order([got, *drain_snapshot(backend, end)], keys, harness.table())
        backend.close()

    def test_every_read_of_a_chunk_yields_the_same_records(self, harness: Harness) -> None:
        backend, start, end = self._first_batch(harness)
        first = read_batch(backend, start, end)
        harness.update(10)
        assert read_batch(backend, start, end).equals(first)  # a retried task, the cut still held
        replay = harness.backend()  # a restarted driver: the cut is gone, the first complete read is kept
        assert read_batch(replay, start, end).equals(first)
        backend.close()
        replay.close()

    def test_a_replay_without_its_cut_reads_at_a_later_cut_that_the_next_batch_holds_back(
        self, harness: Harness
    ) -> None:
        backend, start, end = self._first_batch(harness)
        backend.close()  # the driver dies after logging the batch, before any read of it
        harness.update(20)
        replay = harness.backend()
        first = read_batch(replay, start, end)
        _exact_in_order([first, *drain_snapshot(replay, end)], _keys(replay.schema()), harness.table())
        replay.close()
