"""The backend-neutral part of chunked snapshots (``cdc.snapshots``), without a database: the planner's steps over
the cursors, the hold-back rule on change batches, and the write-once chunk store."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.model import OLD_KEY
from cdc.snapshots.holdback import HoldBack, KeyValues
from cdc.snapshots.planning import advance, chunk_ranges, expire, hold_window
from cdc.snapshots.state import Chunk, Cut, Key, Late, SnapshotState, TableCursor
from cdc.snapshots.store import ChunkStore, entry_name


def k(*values: int) -> Key:
    return tuple(str(v) for v in values)


# ---------------------------------------------------------------------- planning steps
def test_advance_reads_chunks_table_by_table_and_marks_the_last_chunk_done() -> None:
    state = SnapshotState({"a": TableCursor(k(10)), "b": TableCursor(k(7), after=k(2))})
    bounds = {"a": [k(4), k(8), k(10)], "b": [k(5), k(7)]}
    cut = Cut(100, 99)
    got = advance(state, cut, lambda t, c, n: bounds[t][:n], 4)
    assert got.cut == cut
    assert got.tables["a"] == TableCursor(k(10), after=k(10), done=True,
                                          chunks=(Chunk(None, k(4)), Chunk(k(4), k(8)), Chunk(k(8), k(10))))
    assert got.tables["b"] == TableCursor(k(7), after=k(5), chunks=(Chunk(k(2), k(5)),))  # one chunk left of 4
    ranges = chunk_ranges(got)
    assert [(r.channel, r.start, r.end) for r in ranges][:2] == [("chunk:a", None, ["4"]), ("chunk:a", ["4"], ["8"])]
    assert all(r.window == {"cut": {"pos": 100, "seq": 99}} for r in ranges)


def test_the_hold_window_covers_from_the_first_chunk_of_the_batch_to_the_last_key() -> None:
    state = SnapshotState({"a": TableCursor(k(10), after=k(8), chunks=(Chunk(k(4), k(8)),)),
                           "b": TableCursor(k(3), after=k(3), done=True, late=(Late(Cut(50, 49), None, k(3)),))},
                          Cut(100, 99))
    window = hold_window(state)
    assert window == {"hold": {"a": {"after": ["4"], "last": ["10"]},
                               "b": {"late": [{"pos": 50, "seq": 49, "after": None, "upto": ["3"]}]}},
                      "cut": {"pos": 100, "seq": 99}}
    # The next batch starts from the settled state: no chunks, no cut; expired late entries and done tables go.
    settled = state.settled()
    assert settled.cut is None and settled.tables["a"].chunks == () and "b" in settled.tables
    assert "b" not in expire(settled, 50).tables and "b" in expire(settled, 49).tables
    assert hold_window(SnapshotState({"b": TableCursor(k(3), after=k(3), done=True)})) is None


def test_the_offset_holds_a_cursor_per_table_whatever_the_table_size() -> None:
    # A table of 12 chunks and one of 1,200, read 4 chunks a batch: every batch's state (what the offset
    # holds) is the cursor and the chunks in flight, so its JSON is as long at the end of the large table as
    # at the end of the small one (keys of equal width), never one entry per chunk read.
    import json

    def sizes(chunks: int) -> list[int]:
        last = k(10**9 + chunks)
        state = SnapshotState({"t": TableCursor(last)})
        out = []
        for batch in range(10**6):
            def bounds(table: str, cursor: TableCursor, n: int) -> list[Key]:
                start = 0 if cursor.after is None else int(cursor.after[0]) - 10**9
                return [k(10**9 + i) for i in range(start + 1, min(start + n, chunks) + 1)]

            state = advance(state, Cut(10**7 + batch, 10**7 - 1 + batch), bounds, 4)
            out.append(len(json.dumps(state.to_json())))
            if not state.pending:
                return out
            state = state.settled()
        raise AssertionError("never done")

    small, large = sizes(12), sizes(1_200)
    assert len(small) == 3 and len(large) == 300
    assert max(large) == max(small), (max(small), max(large))


# ---------------------------------------------------------------------- the hold-back rule
class IntKeys:
    """Records of one table ``t`` whose key is column ``id``."""

    def keys(self, batch: pa.RecordBatch) -> list[tuple[str, KeyValues]]:
        return [("t", (v,)) for v in batch.column("id").to_pylist()]

    def old_keys(self, batch: pa.RecordBatch) -> list[tuple[str, KeyValues] | None]:
        return [None if v is None else ("t", (v["id"],)) for v in batch.column(OLD_KEY).to_pylist()]


def classify(table: str, keys: Sequence[KeyValues], ranges: Sequence[tuple[Key | None, Key]]) -> tuple[
        list[Key], list[list[bool]]]:
    spans = [(None if a is None else int(a[0]), int(u[0])) for a, u in ranges]
    return [k(*key) for key in keys], [[(a is None or key[0] > a) and key[0] <= u for a, u in spans] for key in keys]


OLD = pa.struct([pa.field("id", pa.int64())])


def batch(rows: list[tuple[str, int, int, int | None, list[str] | None]]) -> pa.RecordBatch:
    """Records (op, seq, id, old id, unchanged)."""
    return pa.RecordBatch.from_pydict({
        "_op": [r[0] for r in rows], "_seq": [r[1] for r in rows], "id": [r[2] for r in rows],
        OLD_KEY: pa.array([None if r[3] is None else {"id": r[3]} for r in rows], OLD),
        "_unchanged": pa.array([r[4] for r in rows], pa.list_(pa.string())),
    })


def survivors(hold: HoldBack, rows: list[Any]) -> list[tuple[str, int, int | None]]:
    out = hold.apply(batch(rows))
    return list(zip(out.column("_op").to_pylist(), out.column("id").to_pylist(),
                    [None if v is None else v["id"] for v in out.column(OLD_KEY).to_pylist()], strict=True))


def test_changes_of_keys_not_yet_emitted_are_held_and_keys_above_the_last_are_not() -> None:
    hold = HoldBack({"t": {"after": ["10"], "last": ["20"]}}, IntKeys(), classify)
    rows = [("update", 1, 5, None, None), ("update", 2, 11, None, ["big"]), ("delete", 3, 20, None, None),
            ("insert", 4, 21, None, None)]
    assert survivors(hold, rows) == [("update", 5, None), ("insert", 21, None)]
    assert hold.held == 2 and hold.rekeyed == {}


def test_a_late_entry_holds_its_keys_up_to_its_seq_only() -> None:
    window = {"t": {"late": [Late(Cut(100, 99), k(0), k(5)).to_json(), Late(Cut(200, 199), keys=(k(7),)).to_json()]}}
    hold = HoldBack(window, IntKeys(), classify)
    rows = [("update", 99, 3, None, None), ("update", 100, 3, None, None), ("update", 150, 7, None, None),
            ("update", 199, 8, None, None), ("update", 200, 7, None, None)]
    assert survivors(hold, rows) == [("update", 3, None), ("update", 8, None), ("update", 7, None)]


def test_a_key_change_out_of_the_held_keys_is_delivered_whole_or_re_read() -> None:
    hold = HoldBack({"t": {"after": ["10"], "last": ["20"]}}, IntKeys(), classify)
    rows = [
        ("delete", 1, 15, None, None), ("insert", 1, 3, 15, None),          # whole: delivered, its link cleared
        ("delete", 2, 16, None, None), ("insert", 2, 4, 16, ["big"]),       # partial: 4 is re-keyed into
        ("update", 3, 4, None, ["big"]),                                    # so 4's later changes are held
        ("update", 4, 3, None, None),
        ("delete", 5, 2, None, None), ("insert", 5, 12, 2, ["big"]),        # into the held keys: the insert waits
    ]
    assert survivors(hold, rows) == [("insert", 3, None), ("update", 3, None), ("delete", 2, None)]
    assert hold.rekeyed == {"t": [k(4)]}


# ---------------------------------------------------------------------- the write-once store
def test_the_first_complete_read_is_kept_and_every_run_yields_it(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path)
    name = entry_name("t", None, ["5"])
    first = pa.table({"id": [1, 2]})
    kept, meta = store.put_once(7, name, first, {"cut": "a"})
    assert kept.equals(first) and meta == {"cut": "a"}
    kept, meta = store.put_once(7, name, pa.table({"id": [9]}), {"cut": "b"})  # a later run: the first one wins
    assert kept.equals(first) and meta == {"cut": "a"} and store.meta(7, name) == {"cut": "a"}
    assert not [p for p in (tmp_path / f"{7:020d}").iterdir() if p.name.endswith(".tmp")]
    store.cleanup(7)
    assert store.get(7, name) is not None
    store.cleanup(8)
    assert store.get(7, name) is None and store.meta(7, name) is None


def test_concurrent_runs_of_a_read_all_yield_the_same_rows(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path)
    got: list[pa.Table] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        kept, _ = store.put_once(1, "x", pa.table({"id": [i] * 1000}), {"cut": str(i)})
        with lock:
            got.append(kept)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(t.equals(got[0]) for t in got)


@pytest.mark.parametrize("value", [{"last": ["1"], "chunks": [[None, ["1"]]]}])
def test_state_round_trips(value: dict[str, Any]) -> None:
    state = SnapshotState.from_json({"cut": {"pos": 3, "seq": 2}, "tables": {"t": value}})
    assert SnapshotState.from_json(state.to_json()) == state


def test_a_resnapshot_holds_nothing_back_but_late_keys_and_ends_its_last_chunk_with_a_refresh() -> None:
    """A re-snapshot of a streaming table (``refresh``: the first cut's ``_seq``): no key region is held (the
    consumer has every row); a late entry holds its keys' changes but not their deletes; the last chunk's window
    asks for the refresh record, and an empty table at its cut gets a range that holds the refresh alone."""
    cursor = TableCursor(k(10), after=k(8), chunks=(Chunk(k(4), k(8)),), refresh=99)
    state = SnapshotState({"t": cursor}, Cut(200, 199))
    assert SnapshotState.from_json(state.to_json()) == state and state.to_json()["tables"]["t"]["refresh"] == 99
    assert hold_window(state) is None
    done = advance(state.settled(), Cut(300, 299), lambda t, c, n: [k(10)], 2)
    assert [(r.start, r.end, r.window) for r in chunk_ranges(done)] == [
        (["8"], ["10"], {"cut": {"pos": 300, "seq": 299}, "refresh": 99})]
    assert chunk_ranges(state)[0].window == {"cut": {"pos": 200, "seq": 199}}  # not its last chunk
    empty = SnapshotState({"t": TableCursor(None, done=True, refresh=299)}, Cut(300, 299))
    assert [(r.start, r.end, r.window) for r in chunk_ranges(empty)] == [
        (None, [], {"cut": {"pos": 300, "seq": 299}, "refresh": 299})]
    late = SnapshotState({"t": replace(cursor, late=(Late(Cut(150, 149), k(0), k(5)),))}, Cut(200, 199))
    window = hold_window(late)
    assert window is not None and window["hold"] == {"t": {"late": [Late(Cut(150, 149), k(0), k(5)).to_json()],
                                                          "deletes": True}}
    hold = HoldBack(window["hold"], IntKeys(), classify)  # type: ignore[arg-type]
    rows = [("update", 100, 3, None, None), ("delete", 120, 3, None, None), ("update", 100, 7, None, None)]
    assert survivors(hold, rows) == [("delete", 3, None), ("update", 7, None)]
    later = SnapshotState({"t": TableCursor(None, done=True, late=(Late(Cut(150, 149), k(0), k(5)),), refresh=299)},
                          Cut(400, 399))
    assert chunk_ranges(later) == [], "the refresh of an empty table comes once, at its own cut"
