"""Key changes that leave columns unchanged (PostgreSQL's unchanged TOASTed values, Debezium's placeholder):
the sink completes the insert half from the old key's row (:func:`sinks.delta.batch.complete_key_changes`),
whether the old row came in the same batch or is in the table, through chains (re-keyed twice, swapped), on
both SCD types' tables; where the old row is not there it fails naming the table, keys, column and fix.

The rule's own cases run on Arrow tables here; tests/backends/postgres/test_toasted_key_changes.py and
tests/debezium/test_toasted_key_changes.py drive both engines end to end from real sources."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.delta import DeltaUpsertSink
from sinks.delta.batch import UnknownValueError, complete_key_changes, key_change_rows
from sinks.delta.layout import DELETED_AT, VALID_FROM, VALID_TO
from sinks.delta.spec import SinkSpec

OLD_KEY = pa.struct([pa.field("id", pa.int64())])
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def changes(rows: list[tuple[Any, ...]]) -> pa.Table:
    """rows: (op, seq, id, n, big, unchanged, old id)."""
    cols = list(zip(*rows, strict=True))
    return pa.table({
        "_op": pa.array(cols[0], pa.string()), "_seq": pa.array(cols[1], pa.int64()),
        "id": pa.array(cols[2], pa.int64()), "n": pa.array(cols[3], pa.int64()), "big": pa.array(cols[4], pa.string()),
        "_unchanged": pa.array(cols[5], pa.list_(pa.string())),
        "_old_key": pa.array([None if k is None else {"id": k} for k in cols[6]], OLD_KEY),
    })


def table(spec: SinkSpec, live: dict[int, tuple[int, Any, Any]], dead: dict[int, int] | None = None,
          versions: list[tuple[int, int, int | None, Any, Any]] | None = None) -> Any:
    """The sink's tables as :func:`key_change_rows` reads them: ``live`` key -> (seq, n, big); ``dead`` key ->
    tombstone seq; SCD type 2 ``versions``: (id, valid_from, valid_to, n, big)."""
    heads = pa.table({
        "id": pa.array([*live, *(dead or {})], pa.int64()),
        "_seq": pa.array([v[0] for v in live.values()] + list((dead or {}).values()), pa.int64()),
        DELETED_AT: pa.array([None] * len(live) + [NOW] * len(dead or {}), pa.timestamp("us", tz="UTC")),
    })
    if spec.scd_type == 1:
        rows = pa.table({"id": pa.array(list(live), pa.int64()), "n": pa.array([v[1] for v in live.values()], pa.int64()),
                         "big": pa.array([v[2] for v in live.values()], pa.string()),
                         "_seq": pa.array([v[0] for v in live.values()], pa.int64())})
    else:
        vs = versions or []
        rows = pa.table({"id": pa.array([v[0] for v in vs], pa.int64()), "n": pa.array([v[3] for v in vs], pa.int64()),
                         "big": pa.array([v[4] for v in vs], pa.string()),
                         VALID_FROM: pa.array([v[1] for v in vs], pa.int64()), VALID_TO: pa.array([v[2] for v in vs], pa.int64())})
    asked: list[pa.Table] = []

    def lookup(keys: pa.Table) -> pa.Table:
        asked.append(keys)
        wanted = set(keys.column("id").to_pylist())
        h = heads.filter(pa.array([k in wanted for k in heads.column("id").to_pylist()], pa.bool_()))
        r = rows.filter(pa.array([k in wanted for k in rows.column("id").to_pylist()], pa.bool_()))
        return key_change_rows(spec, h, r)

    lookup.asked = asked  # type: ignore[attr-defined]
    return lookup


def complete(spec: SinkSpec, batch: pa.Table, lookup: Any) -> dict[int, tuple[Any, Any, Any]]:
    """Key -> (n, big, unchanged) of the completed batch's last change per key (deletes dropped)."""
    out = complete_key_changes(spec, batch, lookup, "/lake/t")
    last: dict[int, dict[str, Any]] = {}
    for r in out.to_pylist():
        last[r["id"]] = r
    return {k: (r["n"], r["big"], r["_unchanged"]) for k, r in last.items() if r["_op"] != "delete"}


SCD1 = SinkSpec(keys=("id",))
SCD2 = SinkSpec(keys=("id",), scd_type=2)


def test_the_old_row_in_the_same_batch() -> None:
    batch = changes([
        ("insert", 1, 1, 1, "A" * 5000, None, None),
        ("update", 2, 1, 2, None, ["big"], None),  # touches n only
        ("delete", 3, 1, None, None, None, None),
        ("insert", 4, 10, 2, None, ["big"], 1),
    ])
    assert complete(SCD1, batch, table(SCD1, {})) == {10: (2, "A" * 5000, None)}


@pytest.mark.parametrize("spec", [SCD1, SCD2], ids=["scd1", "scd2"])
def test_the_old_row_in_the_table(spec: SinkSpec) -> None:
    lookup = table(spec, {1: (5, 1, "A"), 2: (6, 2, "B")}, versions=[(1, 5, None, 1, "A"), (2, 2, 6, 0, "old B"),
                                                                     (2, 6, None, 2, "B")])
    batch = changes([
        ("delete", 7, 1, None, None, None, None),
        ("insert", 8, 10, 1, None, ["big"], 1),
        ("update", 9, 2, 3, None, ["big"], None),
        ("delete", 10, 2, None, None, None, None),
        ("insert", 11, 20, 3, None, ["big"], 2),
    ])
    assert complete(spec, batch, lookup) == {10: (1, "A", None), 20: (3, "B", None)}
    assert sorted(lookup.asked[0].column("id").to_pylist()) == [1, 2, 10, 20]  # one lookup: old and new keys


def test_a_swap_and_a_double_re_key_in_one_transaction_chain() -> None:
    lookup = table(SCD1, {1: (1, 1, "A"), 2: (2, 2, "B"), 3: (3, 3, "C")})
    batch = changes([
        # swap 1 and 2 through 9
        ("delete", 10, 1, None, None, None, None), ("insert", 11, 9, 1, None, ["big"], 1),
        ("delete", 12, 2, None, None, None, None), ("insert", 13, 1, 2, None, ["big"], 2),
        ("delete", 14, 9, None, None, None, None), ("insert", 15, 2, 1, None, ["big"], 9),
        # 3 -> 4 -> 5
        ("delete", 16, 3, None, None, None, None), ("insert", 17, 4, 3, None, ["big"], 3),
        ("delete", 18, 4, None, None, None, None), ("insert", 19, 5, 3, None, ["big"], 4),
    ])
    assert complete(SCD1, batch, lookup) == {1: (2, "B", None), 2: (1, "A", None), 5: (3, "C", None)}


def test_the_latest_setter_wins_and_a_re_insert_is_not_walked_past() -> None:
    lookup = table(SCD1, {1: (1, 1, "A")})
    batch = changes([
        ("update", 2, 1, 1, "B", None, None),  # sets big
        ("update", 3, 1, 2, None, ["big"], None),  # leaves it
        ("delete", 4, 1, None, None, None, None), ("insert", 5, 7, 2, None, ["big"], 1),
        ("insert", 6, 1, 9, "C", None, None),  # key 1 re-used
        ("delete", 7, 1, None, None, None, None), ("insert", 8, 8, 9, None, ["big"], 1),
    ])
    assert complete(SCD1, batch, lookup) == {7: (2, "B", None), 8: (9, "C", None)}


def test_changes_already_in_the_table_are_not_walked() -> None:
    """A re-delivered change older than the key's head is in the table's row already."""
    lookup = table(SCD1, {1: (5, 1, "new")})
    batch = changes([("update", 3, 1, 1, "stale", None, None), ("delete", 6, 1, None, None, None, None),
                     ("insert", 7, 2, 1, None, ["big"], 1)])
    assert complete(SCD1, batch, lookup)[2] == (1, "new", None)


def test_an_scd2_tombstone_keeps_the_last_version_scd1_does_not() -> None:
    """A Debezium delete and create split over two batches: SCD type 2 still has the closed version."""
    batch = changes([("insert", 8, 10, 1, None, ["big"], 1)])
    scd2 = table(SCD2, {}, dead={1: 7}, versions=[(1, 2, 7, 1, "A")])
    assert complete(SCD2, batch, scd2) == {10: (1, "A", None)}
    with pytest.raises(UnknownValueError, match="old key's row is not in the table"):
        complete(SCD1, batch, table(SCD1, {}, dead={1: 7}))


def test_an_unknown_old_row_fails_naming_table_keys_column_and_fix() -> None:
    batch = changes([("delete", 7, 1, None, None, None, None), ("insert", 8, 10, 1, None, ["big"], 1)])
    with pytest.raises(UnknownValueError) as err:
        complete(SCD1, batch, table(SCD1, {}))
    text = str(err.value)
    for part in ("/lake/t", "id=10", "id=1", "'big'", "REPLICA IDENTITY FULL", "no quarantine", "nothing was written"):
        assert part in text, (part, text)


def test_an_insert_leaving_columns_unchanged_without_an_old_key_fails() -> None:
    batch = changes([("insert", 8, 10, 1, None, ["big"], None)])
    with pytest.raises(UnknownValueError, match=r"name no old key.*id=10.*\['big'\]"):
        complete(SCD1, batch, table(SCD1, {}))


def test_stale_key_changes_are_left_for_the_guard() -> None:
    lookup = table(SCD1, {10: (9, 1, "X")})  # the new key is already past the change
    batch = changes([("delete", 7, 1, None, None, None, None), ("insert", 8, 10, 1, None, ["big"], 1)])
    out = complete_key_changes(SCD1, batch, lookup, "/lake/t")
    assert out.equals(batch)


def test_whole_rows_and_partial_updates_pass_untouched_without_a_lookup() -> None:
    lookup = table(SCD1, {})
    batch = changes([("insert", 1, 1, 1, "A", None, None), ("update", 2, 1, 2, None, ["big"], None),
                     ("delete", 3, 1, None, None, None, None), ("insert", 4, 2, 2, "B", None, 1)])
    assert complete_key_changes(SCD1, batch, lookup, "/lake/t").equals(batch)
    assert lookup.asked == []


# ------------------------------------------------------------------------------ through the sink (delta-rs)
@dataclass(frozen=True)
class Step:
    kind: str  # insert, touch, big, rekey, delete
    a: int
    b: int


STEPS = st.lists(st.lists(st.builds(Step, st.sampled_from(["insert", "touch", "big", "rekey", "rekey", "delete"]),
                                    st.integers(0, 31), st.integers(0, 999)), min_size=1, max_size=4),
                 min_size=1, max_size=8)


def records_of(snapshot: int, transactions: list[list[Step]]) -> tuple[list[list[dict[str, Any]]], dict[int, Any]]:
    """Change records as PostgreSQL's backend makes them under REPLICA IDENTITY DEFAULT (a touch leaves big
    unchanged; a key change is a delete and an insert leaving big unchanged, naming the old key), one list per
    transaction (the snapshot first), and the table they leave."""
    model: dict[int, tuple[int, str]] = {}
    seq = iter(range(1, 10**6))

    def rec(op: str, k: int, n: Any = None, big: Any = None, unchanged: Any = None, old: Any = None) -> dict[str, Any]:
        return {"_op": op, "_seq": next(seq), "id": k, "n": n, "big": big, "_unchanged": unchanged, "_old_key": old}

    out = [[rec("snapshot", k, k, f"big{k}") for k in range(1, snapshot + 1)]]
    model.update({k: (k, f"big{k}") for k in range(1, snapshot + 1)})
    for steps in transactions:
        txn = []
        for s in steps:
            live = sorted(model)
            free = [k for k in range(1, 9) if k not in model]
            old = live[s.a % len(live)] if live else None
            new = free[s.b % len(free)] if free else None
            if s.kind == "insert" and new is not None:
                model[new] = (s.b, f"big{s.b}")
                txn.append(rec("insert", new, s.b, f"big{s.b}"))
            elif old is None:
                continue
            elif s.kind == "touch":
                model[old] = (s.b, model[old][1])
                txn.append(rec("update", old, s.b, None, ["big"]))
            elif s.kind == "big":
                model[old] = (model[old][0], f"big{s.b}")
                txn.append(rec("update", old, model[old][0], f"big{s.b}"))
            elif s.kind == "rekey" and new is not None:
                model[new] = model.pop(old)
                txn += [rec("delete", old), rec("insert", new, model[new][0], None, ["big"], {"id": old})]
            elif s.kind == "delete":
                del model[old]
                txn.append(rec("delete", old))
        out.append(txn)
    return out, model


@settings(max_examples=30, deadline=None)
@given(snapshot=st.integers(0, 6), transactions=STEPS, cuts=st.sets(st.integers(1, 8)), scd_type=st.sampled_from([1, 2]),
       ordered=st.booleans())
def test_any_history_of_key_changes_leaves_the_table_equal_to_the_source(
    tmp_path_factory: pytest.TempPathFactory, snapshot: int, transactions: list[list[Step]], cuts: set[int],
    scd_type: int, ordered: bool,
) -> None:
    """Batches end between transactions at random (as the PostgreSQL backend's do): old rows come from the
    same batch or an earlier one; in either mode (ordered: the old rows' heads come from the main table)."""
    txns, model = records_of(snapshot, transactions)
    schema = pa.schema([("_op", pa.string()), ("_seq", pa.int64()), ("id", pa.int64()), ("n", pa.int64()),
                        ("big", pa.string()), ("_unchanged", pa.list_(pa.string())), ("_old_key", OLD_KEY)])
    path = tmp_path_factory.mktemp("keychanges") / "t"
    sink = DeltaUpsertSink(str(path), keys=["id"], scd_type=scd_type, app_id="p", engine="delta-rs", ordered=ordered)
    bounds = [0, *sorted(c for c in cuts if c < len(txns)), len(txns)]
    for batch_id, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        records = [r for t in txns[lo:hi] for r in t]
        if records:
            sink.write(pa.Table.from_pylist(records, schema), batch_id)
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(path)) else []
    got = {r["id"]: (r["n"], r["big"]) for r in rows if r.get(VALID_TO) is None}
    assert got == model


def test_a_batch_whose_key_columns_are_declared_not_null() -> None:
    """Spark hands the sink a batch whose key columns are non-nullable when the source declares them so (the
    change model does); the old keys, taken out of the nullable ``_old_key`` struct, are looked up with them."""
    lookup = table(SCD1, {1: (5, 1, "A")})
    batch = changes([("delete", 7, 1, None, None, None, None), ("insert", 8, 10, 1, None, ["big"], 1)])
    schema = batch.schema.set(batch.schema.get_field_index("id"), pa.field("id", pa.int64(), nullable=False))
    assert complete(SCD1, batch.cast(schema), lookup) == {10: (1, "A", None)}
