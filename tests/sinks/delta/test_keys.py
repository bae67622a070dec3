"""Every key type, every key value, every batch shape: the sink's table equals a model after every batch.

A hypothesis test over the key types the sink accepts (integers, string, large and view strings, binary,
large and view binary, decimal, date, timestamp, boolean, and composite keys mixing them) crossed with batch
shapes (one key, one key many times, all keys, keys outside the table's current range, only deletes, an
empty batch after a non-empty one, and mixes), on delta-rs (:meth:`DeltaUpsertSink.write`) and delta-spark
(:meth:`DeltaUpsertSink.write_frame`, the path ``foreachBatch`` takes). Text keys include the values that
break SQL built from data (quotes, backslashes, ``\\N``, NUL, newlines, unicode, ``' OR 1=1 --``, the empty
string) and long values sharing a prefix longer than the Delta statistics keep (32 characters), so that
pruning by the files' truncated min/max is exercised. After every batch the main table holds exactly one
row per live key of the model, with the model's value, and the state table one row per key seen.

The delta-spark part shares the session's Spark (the ``spark`` fixture) and runs few examples (every batch is
two Spark MERGEs; ``CDC_KEYS_SPARK_EXAMPLES`` raises them); its examples draw composite keys of three or four
types, so a few examples cover many types. ``CDC_KEYS_EXAMPLES`` sets the delta-rs part's examples (60).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.errors import MalformedRecordError
from sinks.delta import DeltaUpsertSink, SchemaEvolutionError
from sinks.delta.layout import state_path

TS = pa.timestamp("us", tz="UTC")

#: Text that SQL built from data gets wrong, and values whose difference lies past the statistics' prefix.
HOSTILE = ["", "'", "''", "\\", "\\\\", "\\N", "w\\N", "w/N", "\x00", "a\x00b", "a\nb", "\r\n", "\t",
           "' OR 1=1 --", "\\' OR 1=1 --", "ü", "日本", "🎉", "\uffff", "a" * 40, "a" * 40 + "\\"]
TEXT = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=6),
    st.text(st.sampled_from("\\'\"\x00\n%_ab"), max_size=4).map(lambda s: "p" * 33 + s),
)
BINARY = st.one_of(st.binary(max_size=6), st.binary(max_size=3).map(lambda b: b"\x00" * 33 + b),
                   st.sampled_from([b"", b"\\", b"'", b"\xff" * 40]))

#: name -> (Arrow type of the batch's column, its values).
KEY_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "string": (pa.string(), TEXT),
    "large_string": (pa.large_string(), TEXT),
    "string_view": (pa.string_view(), TEXT),
    "binary": (pa.binary(), BINARY),
    "large_binary": (pa.large_binary(), BINARY),
    "binary_view": (pa.binary_view(), BINARY),
    "decimal": (pa.decimal128(12, 3), st.decimals(min_value=-(10**8), max_value=10**8, places=3,
                                                  allow_nan=False, allow_infinity=False)),
    "date": (pa.date32(), st.dates(min_value=date(1900, 1, 1), max_value=date(2200, 1, 1))),
    # (hypothesis takes naive bounds and attaches the time zone)
    "timestamp": (TS, st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1),  # noqa: DTZ001
                                   timezones=st.just(UTC))),
    "boolean": (pa.bool_(), st.booleans()),
}
#: Spark has no view types; its batches carry the plain ones (what a DataFrame's toArrow gives).
SPARK_TYPES = {"string_view": pa.string(), "binary_view": pa.binary(), "large_string": pa.string(),
               "large_binary": pa.binary()}
SHAPES = ("one", "one_many", "all", "outside", "deletes", "empty", "mixed")

Key = tuple[Any, ...]


def comparable(v: Any) -> Any:
    """A value's sort position as the engines order it (text by UTF-8 bytes, like Python's code points)."""
    return v.timestamp() if isinstance(v, datetime) else v


def batch(names: list[str], types: list[pa.DataType], changes: list[tuple[str, Key, int]]) -> pa.Table:
    cols: dict[str, pa.Array] = {
        "_op": pa.array([op for op, _, _ in changes], pa.string()),
        "_seq": pa.array([seq for _, _, seq in changes], pa.int64()),
    }
    for i, (name, typ) in enumerate(zip(names, types, strict=True)):
        cols[name] = pa.array([key[i] for _, key, _ in changes], typ)
    cols["v"] = pa.array([None if op == "delete" else seq for op, _, seq in changes], pa.int64())
    return pa.table(cols)


def table_rows(path: str, names: list[str]) -> list[tuple[Key, Any]]:
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return [(tuple(r[n] for n in names), r.get("v")) for r in rows]


def check(path: str, names: list[str], model: dict[Key, int | None]) -> None:
    """The main table is the model's live keys with their values, each once; the state table has each key
    the model has seen (live or tombstone) once."""
    main = Counter((k, v) for k, v in table_rows(path, names))
    want = Counter((k, v) for k, v in model.items() if v is not None)
    assert main == want, f"main table differs from the model: extra {main - want}, missing {want - main}"
    state = Counter(k for k, _ in table_rows(state_path(path), names))
    assert state == Counter(k for k in model), "state table differs from the model's keys"


@st.composite
def scenario(draw: st.DrawFn, kinds: st.SearchStrategy[list[str]], max_batches: int) -> Any:
    """A key schema, a pool of distinct keys, and a list of batches, each a list of (op, key) in order."""
    type_names = draw(kinds)
    values = st.tuples(*(KEY_TYPES[t][1] for t in type_names))
    pool: list[Key] = draw(st.lists(values, min_size=1, max_size=8, unique=True))
    plans: list[tuple[str, list[tuple[str, Key]]]] = []
    live: set[Key] = set()
    for i in range(draw(st.integers(1, max_batches))):
        shape = draw(st.sampled_from(SHAPES if i else [s for s in SHAPES if s != "empty"]))
        changes: list[tuple[str, Key]]
        if shape == "one":
            changes = [("upsert", draw(st.sampled_from(pool)))]
        elif shape == "one_many":
            key = draw(st.sampled_from(pool))
            changes = [(op, key) for op in draw(st.lists(st.sampled_from(["upsert", "upsert", "delete"]),
                                                         min_size=2, max_size=5))]
        elif shape == "all":
            changes = [("upsert", k) for k in (sorted(live, key=order) or pool)]
        elif shape == "outside":
            lo, hi = (min(map(order, live)), max(map(order, live))) if live else (None, None)
            outside = [k for k in pool if lo is None or order(k) < lo or order(k) > hi]
            changes = [("upsert", k) for k in (outside or [k for k in pool if k not in live] or pool)]
        elif shape == "deletes":
            changes = [("delete", k) for k in draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))]
        elif shape == "empty":
            changes = []
        else:
            changes = draw(st.lists(st.tuples(st.sampled_from(["upsert", "delete"]), st.sampled_from(pool)),
                                    min_size=1, max_size=8))
        for op, k in changes:
            (live.add if op == "upsert" else live.discard)(k)
        plans.append((shape, changes))
    return type_names, pool, plans


def order(key: Key) -> tuple[Any, ...]:
    return tuple(comparable(v) for v in key)


def run(scn: Any, write: Callable[[DeltaUpsertSink, pa.Table, int], Any], engine: str,
        spark_types: bool = False, compact_every: int | None = 3) -> None:
    type_names, _pool, plans = scn
    names = [f"k{i}" for i in range(len(type_names))]
    types = [SPARK_TYPES.get(t, KEY_TYPES[t][0]) if spark_types else KEY_TYPES[t][0] for t in type_names]
    folder = tempfile.mkdtemp(prefix="delta-keys-")
    try:
        path = os.path.join(folder, "table")
        sink = DeltaUpsertSink(path, keys=names, app_id="keys", compact_every=compact_every, engine=engine)
        model: dict[Key, int | None] = {}
        seq = 0
        for batch_id, (_shape, plan) in enumerate(plans):
            changes = []
            for op, key in plan:
                seq += 1
                changes.append(("delete" if op == "delete" else "update" if model.get(key) else "insert", key, seq))
                model[key] = None if op == "delete" else seq
            write(sink, batch(names, types, changes), batch_id)
            if model:
                check(path, names, model)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


SINGLE = st.sampled_from(sorted(KEY_TYPES)).map(lambda t: [t])
COMPOSITE = st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=2, max_size=3)


@settings(max_examples=int(os.environ.get("CDC_KEYS_EXAMPLES", "60")))
@given(scn=scenario(st.one_of(SINGLE, COMPOSITE), max_batches=4))
def test_every_key_type_and_batch_shape_on_delta_rs(scn: Any) -> None:
    run(scn, lambda sink, table, batch_id: sink.write(table, batch_id), "delta-rs")


@pytest.mark.spark
@settings(max_examples=int(os.environ.get("CDC_KEYS_SPARK_EXAMPLES", "2")))
@given(scn=scenario(st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=3, max_size=4), max_batches=3))
def test_every_key_type_and_batch_shape_on_delta_spark(spark: Any, scn: Any) -> None:
    def write(sink: DeltaUpsertSink, table: pa.Table, batch_id: int) -> None:
        sink.write_frame(spark.createDataFrame(table), batch_id)

    run(scn, write, "delta-spark", spark_types=True, compact_every=None)  # (compaction: the delta-rs part)


# ---------------------------------------------------------------------------------------- hostile values
def hostile_batch(changes: list[tuple[str, str, int]]) -> pa.Table:
    """(op, key, seq) -> change records keyed by the text column ``id``; the value is the sequence."""
    return batch(["id"], [pa.string()], [(op, (key,), seq) for op, key, seq in changes])


def pruned(history: dict[str, Any]) -> bool:
    """The MERGE left the files outside the batch's key range alone: delta-rs records the files its scan
    skipped; delta-spark does not put its skipping counts in the commit, so there only the files it
    rewrote are known (one range's worth)."""
    m = history["operationMetrics"]
    if "num_target_files_skipped_during_scan" in m:
        return int(m["num_target_files_skipped_during_scan"]) >= 2
    return int(m["numTargetFilesRemoved"]) <= 2


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.spark)])
def test_hostile_text_keys_are_values_never_sql(request: pytest.FixtureRequest, tmp_path: Any, engine: str) -> None:
    """Keys that end a SQL literal early, escape, or hide in a prefix: each key stays one row with its latest
    value; a batch of keys in one narrow range prunes the other files of both tables (the range is bound as
    typed values); then a key column changing type is the sink's schema-evolution error, and nothing is
    written."""
    if engine == "delta-spark":
        spark = request.getfixturevalue("spark")

        def write(table: pa.Table, batch_id: int) -> Any:
            return sink.write_frame(spark.createDataFrame(table), batch_id)
    else:
        def write(table: pa.Table, batch_id: int) -> Any:
            return sink.write(table, batch_id)

    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, keys=["id"], app_id="hostile", compact_every=None, engine=engine)
    model: dict[Key, int | None] = {}
    seq = 0

    def apply(batch_id: int, ops: list[tuple[str, str]]) -> None:
        nonlocal seq
        changes = []
        for op, key in ops:
            seq += 1
            changes.append((op, key, seq))
            model[(key,)] = None if op == "delete" else seq
        write(hostile_batch(changes), batch_id)
        check(path, ["id"], model)

    # Three files of disjoint ranges (each batch inserts only: a MERGE that matches nothing adds a file).
    low, mid, high = ([p + k for k in HOSTILE] for p in ("a", "m", "z"))
    apply(0, [("insert", k) for k in low])
    apply(1, [("insert", k) for k in mid])
    apply(2, [("insert", k) for k in high])
    # Only the middle range (including the keys that would end or escape a literal): the other files are skipped.
    apply(3, [("update", "m\\"), ("update", "m'"), ("update", "m\\N"), ("update", "m\x00"), ("update", "m")])
    main, state = DeltaTable(path).history(1)[0], DeltaTable(state_path(path)).history(1)[0]
    assert main["operation"] == state["operation"] == "MERGE"
    assert pruned(main) and pruned(state), (main["operationMetrics"], state["operationMetrics"])
    # The reproduction of the duplicated key: insert b and w\N, then insert c and update w\N.
    apply(4, [("insert", "b"), ("insert", "w\\N")])
    apply(5, [("insert", "c"), ("update", "w\\N"), ("update", "m' OR 1=1 --"), ("delete", "m\\' OR 1=1 --")])
    # A key column that changes type: the sink's error, naming the column and both types; nothing written.
    versions = DeltaTable(path).version(), DeltaTable(state_path(path)).version()
    retyped = batch(["id"], [pa.int64()], [("insert", (7,), seq + 1)])
    with pytest.raises(SchemaEvolutionError, match="'id': table has string, changes have int64"):
        write(retyped, 6)
    assert (DeltaTable(path).version(), DeltaTable(state_path(path)).version()) == versions


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.spark)])
def test_ops_outside_the_change_model_are_refused(request: pytest.FixtureRequest, tmp_path: Any, engine: str) -> None:
    path = str(tmp_path / "t")
    sink = DeltaUpsertSink(path, keys=["id"], app_id="ops", compact_every=None, engine=engine)
    table = hostile_batch([("insert", "a", 1), ("upsert", "b", 2), ("upsert", "c", 3)])
    table = table.set_column(0, "_op", pa.array(["insert", "upsert", None], pa.string()))
    message = r"2 change record\(s\) have an '_op' outside the change model: null, 'upsert' .*accepted: insert, update, delete, snapshot, truncate"
    with pytest.raises(MalformedRecordError, match=message):
        if engine == "delta-spark":
            sink.write_frame(request.getfixturevalue("spark").createDataFrame(table), 0)
        else:
            sink.write(table, 0)
    assert not os.path.exists(os.path.join(path, "_delta_log")), "nothing was written"
