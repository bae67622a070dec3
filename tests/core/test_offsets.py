"""The offset JSON users' checkpoints keep (``cdc.offsets``), and the planner's steps one by one."""

from __future__ import annotations

import json

import pytest

from cdc.backend import ChannelInfo
from cdc.errors import OffsetError
from cdc.offsets import ChannelOffset, Offset
from cdc.planner import ChannelPlan, Taken, batch_ranges, eligible_channels, end_offset, share_budget

# Offsets exactly as the planner wrote them before cdc.offsets existed (json.dumps, as PySpark stores them):
# local, Pulsar and Tablestore positions, every key of the format.
WRITTEN = [
    '{"channels": {"c0": {"pos": 0}, "c1": {"pos": 0}}, "initial": true}',
    '{"channels": {"c0": {"pos": 2, "from": 0}, "c1": {"pos": 2, "from": 0}}, "turn": 1}',
    '{"channels": {"c0": {"pos": 3, "done": true}, "c1": {"pos": 9}, "c2": {"pos": 0}, "c3": {"pos": 0}}}',
    '{"channels": {"c0": {"pos": 15, "from": 5}}}',
    '{"channels": {"snap-1a2b-0": {"pos": 0, "snapshot": true}, "c0": {"pos": 3}}, "initial": true}',
    '{"channels": {"snap-1a2b-0": {"pos": 1, "snapshot": true, "done": true, "from": 0}, "c0": {"pos": 3, '
    '"from": 3}}, "turn": 1}',
    '{"channels": {"orders-partition-0": {"pos": [12, 7, -1], "from": [-1, -1, -1]}}, "turn": 4}',
    '{"channels": {"8d1f-0": {"pos": {"token": "AAEC", "skip": 2, "n": 40, "last": [["id", 7]]}, "done": true}, '
    '"8d1f-1": {"pos": {"token": null, "skip": 0, "n": 0, "last": null}}}}',
    # A chunked snapshot (PostgreSQL): its start, a batch reading two chunks at a cut, one with a late entry.
    '{"channels": {"changes": {"pos": 27951345172480}}, "initial": true, '
    '"snapshot": {"tables": {"public.items": {"last": ["2000"]}}}}',
    '{"channels": {"changes": {"pos": 27951403892736, "from": 27951345172480}}, "snapshot": {"cut": {"pos": '
    '27951403892736, "seq": 27951403892735}, "tables": {"public.items": {"last": ["2000"], "after": ["600"], '
    '"chunks": [[null, ["300"]], [["300"], ["600"]]]}}}}',
    '{"channels": {"changes": {"pos": 28035399024640}}, "turn": 7, "snapshot": {"tables": {"public.t": {"last": '
    '["z\\\"q", "9"], "after": ["a", "1"], "late": [{"pos": 28035399024640, "seq": 28035399024639, "after": '
    'null, "upto": ["a", "1"]}, {"pos": 28035399024640, "seq": 28035399024639, "keys": [["b", "2"]]}]}, '
    '"public.u": {"last": ["5"], "after": ["5"], "done": true}}}}',
]


@pytest.mark.parametrize("text", WRITTEN)
def test_written_offsets_load_and_write_back_the_same_text(text: str) -> None:
    offset = Offset.from_json(json.loads(text))
    assert json.dumps(offset.to_json()) == text


def test_the_typed_form_reads_every_key() -> None:
    offset = Offset.from_json(json.loads(WRITTEN[5]))
    assert offset.turn == 1 and not offset.initial
    snap = offset.channels["snap-1a2b-0"]
    assert (snap.pos, snap.snapshot, snap.done, snap.from_) == (1, True, True, 0)
    assert offset.positions() == {"snap-1a2b-0": 1, "c0": 3}
    assert all(e.from_ is None for e in offset.without_from().values())


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ({"chanels": {}}, "not a cdc offset"),
        ({"channels": {"c0": {"pos": 1}}, "turns": 2}, r"unknown keys \['turns'\]"),
        ({"channels": {"c0": {"position": 1}}}, "channel 'c0' has no position"),
        ({"channels": {"c0": {"pos": 1, "new": True}}}, r"unknown keys \['new'\]"),
        ({"channels": {"c0": {"pos": 1, "done": "yes"}}}, "'done' must be true or false"),
        ({"channels": {}, "turn": -1}, "'turn' must be a count"),
        ({"channels": {}, "snapshot": {"tables": {"t": {"last": [5]}}}}, "must be a key"),
        ({"channels": {}, "snapshot": {"tables": {"t": {"last": ["5"], "chunks": [[None, ["1"]]]}}}},
         "chunks without a 'cut'"),
        ({"channels": {}, "snapshot": {"tables": {"t": {"last": ["5"], "next": ["1"]}}}}, r"unknown keys \['next'\]"),
        ({"channels": {}, "snapshot": {"cut": {"pos": 1}, "tables": {}}}, "'cut' must be"),
    ],
)
def test_what_is_not_a_cdc_offset_is_refused_naming_why(value: dict, complaint: str) -> None:
    with pytest.raises(OffsetError, match=complaint) as e:
        Offset.from_json(value)
    assert isinstance(e.value, ValueError)  # callers that caught the old ValueError still do


# ---------------------------------------------------------------------- eligible_channels
def offset(**entries: ChannelOffset) -> Offset:
    return Offset(dict(entries))


def test_a_child_is_eligible_only_once_every_parent_is_done_in_the_start() -> None:
    channels = {
        "c0": ChannelInfo("c0", finished=True),
        "c1": ChannelInfo("c1"),
        "c2": ChannelInfo("c2", ("c0",)),
        "c3": ChannelInfo("c3", ("c0", "c1")),
    }
    start = offset(c0=ChannelOffset(5), c1=ChannelOffset(3), c2=ChannelOffset(0), c3=ChannelOffset(0))
    assert eligible_channels(start, {}, channels) == ["c0", "c1"]
    start = offset(c0=ChannelOffset(5, done=True), c1=ChannelOffset(3), c2=ChannelOffset(0), c3=ChannelOffset(0))
    assert eligible_channels(start, {}, channels) == ["c1", "c2"]
    assert eligible_channels(start, {}, channels, respect_lineage=False) == ["c1", "c2", "c3"]


def test_a_new_channel_waits_for_a_parent_registered_with_it_but_not_for_a_forgotten_one() -> None:
    channels = {"c1": ChannelInfo("c1"), "c2": ChannelInfo("c2", ("c1",)), "c3": ChannelInfo("c3", ("gone",))}
    assert eligible_channels(Offset(), {"c1": 0, "c2": 0, "c3": 0}, channels) == ["c1", "c3"]


def test_change_channels_wait_for_every_snapshot_chunk_and_order_is_by_length_then_name() -> None:
    channels = {cid: ChannelInfo(cid) for cid in ("c2", "c10")}
    start = offset(**{"snap-0": ChannelOffset(0, snapshot=True, done=True), "snap-1": ChannelOffset(2, snapshot=True),
                      "c10": ChannelOffset(0), "c2": ChannelOffset(0)})
    assert eligible_channels(start, {}, channels) == ["snap-1"]
    finished = offset(**{"snap-1": ChannelOffset(3, snapshot=True, done=True), "c10": ChannelOffset(0),
                         "c2": ChannelOffset(0)})
    assert eligible_channels(finished, {}, channels) == ["c2", "c10"]
    forgotten = offset(c9=ChannelOffset(4))  # the backend no longer lists it: nothing to plan
    assert eligible_channels(forgotten, {}, channels) == []


# ---------------------------------------------------------------------- share_budget
class Channels:
    """``take`` over channels holding ``available`` records each; ``closed`` ones finish when exhausted."""

    def __init__(self, available: dict[str, int], closed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.left = dict(available)
        self.closed = closed
        self.calls: list[tuple[str, int | None]] = []

    def take(self, cid: str, want: int | None) -> Taken:
        self.calls.append((cid, want))
        n = self.left[cid] if want is None else min(want, self.left[cid])
        self.left[cid] -= n
        return Taken(n, cid in self.closed and self.left[cid] == 0)


def test_water_filling_hands_what_a_short_channel_leaves_to_the_others() -> None:
    chans = Channels({"c0": 2, "c1": 50, "c2": 50})
    assert share_budget(["c0", "c1", "c2"], 21, None, 0, chans.take) == {"c0": 2, "c1": 10, "c2": 9}


def test_without_a_budget_every_channel_is_asked_once_up_to_the_cap() -> None:
    chans = Channels({"c0": 2, "c1": 50})
    assert share_budget(["c0", "c1"], None, 5, 0, chans.take) == {"c0": 2, "c1": 5}
    assert chans.calls == [("c0", 5), ("c1", 5)]
    assert share_budget(["c0", "c1"], None, None, 0, Channels({"c0": 2, "c1": 50}).take) == {"c0": 2, "c1": 50}


def test_the_turn_rotates_who_goes_first_and_the_cap_bounds_each_channel() -> None:
    for turn, served in ((0, "c0"), (1, "c1"), (2, "c2"), (3, "c0")):
        chans = Channels({"c0": 9, "c1": 9, "c2": 9})
        got = share_budget(["c0", "c1", "c2"], 1, None, turn, chans.take)
        assert [cid for cid, n in got.items() if n] == [served]
    assert share_budget(["c0", "c1"], 100, 4, 0, Channels({"c0": 9, "c1": 9}).take) == {"c0": 4, "c1": 4}


def test_a_channel_the_budget_never_reached_is_still_asked_so_a_finished_one_is_marked_done() -> None:
    chans = Channels({"c0": 5, "c1": 0}, closed={"c1"})
    assert share_budget(["c0", "c1"], 1, None, 0, chans.take) == {"c0": 1, "c1": 0}
    assert chans.calls == [("c0", 1), ("c1", 0)]


# ---------------------------------------------------------------------- end_offset
def test_nothing_moved_and_nothing_learned_gives_no_end_offset() -> None:
    start = Offset({"c0": ChannelOffset(4, from_=0)}, turn=3)
    assert end_offset(start, {}, {"c0": ChannelPlan(4, 4)}, limited=True) is None


def test_new_and_skipped_ranges_record_where_they_begin_and_done_is_kept() -> None:
    start = Offset({"c0": ChannelOffset(4, from_=1), "c1": ChannelOffset(7, done=True), "c2": ChannelOffset(2)})
    plans = {"c0": ChannelPlan(4, 9, finished=True), "c2": ChannelPlan(5, 6, skipped=True), "c3": ChannelPlan(0, 3),
             "c4": ChannelPlan(0, 0)}
    end = end_offset(start, {"c3": 0, "c4": 0}, plans, limited=True)
    assert end is not None
    assert end.to_json() == {
        "channels": {
            "c0": {"pos": 9, "done": True},
            "c1": {"pos": 7, "done": True},
            "c2": {"pos": 6, "from": 5},
            "c3": {"pos": 3, "from": 0},
            "c4": {"pos": 0},
        },
        "turn": 1,
    }
    assert [(r.channel, r.start, r.end) for r in batch_ranges(start, end)] == [("c0", 4, 9), ("c2", 5, 6), ("c3", 0, 3)]


def test_the_first_batch_records_every_range_start() -> None:
    start = Offset({"c0": ChannelOffset(4), "c1": ChannelOffset(2)}, initial=True)
    end = end_offset(start, {"c2": 0}, {"c0": ChannelPlan(4, 6)}, limited=False)
    assert end is not None and end.to_json() == {
        "channels": {"c0": {"pos": 6, "from": 4}, "c1": {"pos": 2, "from": 2}, "c2": {"pos": 0, "from": 0}}
    }
