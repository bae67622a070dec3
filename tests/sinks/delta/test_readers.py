"""Readers of other implementations see the sink's table as the source table: ``deltalake`` (delta-rs),
DuckDB's ``delta_scan`` (the ``duckdb-ext-delta`` package, loaded from its path: DuckDB cannot download
extensions here) and ``spark.read.format("delta")`` (delta-spark's reader, in the shared Spark session, which has
the io.delta jars). ``sinks.delta.read`` is not one of them.

One history (inserts, updates, deletes, re-deliveries of older changes, a replayed batch) is written by the
sink into an SCD type 1 table with the default columns, one with every bookkeeping column hidden and an SCD
type 2 table; each reader must return exactly the model's rows (per key, the delivered change with the
largest sequence; a deleted key has no row) and the columns the options promise.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta import DeltaUpsertSink

TS = pa.timestamp("us", tz="UTC")
TABLES = {
    "scd1": {},
    "scd1_bare": {"bookkeeping_columns": []},
    "scd2": {"scd_type": 2, "bookkeeping_columns": ["sequence"]},
}
COLUMNS = {
    "scd1": ["id", "_seq", "_commit_ts", "name", "qty"],
    "scd1_bare": ["id", "name", "qty"],
    "scd2": ["id", "_seq", "name", "qty", "_valid_from", "_valid_to"],
}


def history(seed: int = 13) -> tuple[list[pa.Table], dict[int, tuple[str, int]]]:
    """Batches of change records, and the source table they lead to."""
    rng = random.Random(seed)
    seq, source, sent, batches = 0, {}, [], []
    for _ in range(12):
        rows = []
        for _ in range(rng.randint(5, 25)):
            seq += 1
            key = rng.randrange(40)
            if key in source and rng.random() < 0.3:
                rows.append(("delete", seq, key, None, None))
                del source[key]
            else:
                rows.append(("update" if key in source else "insert", seq, key, f"v{seq}", seq))
                source[key] = (f"v{seq}", seq)
        stale = rng.sample(sent, min(len(sent), 4))  # re-deliveries of older changes: must lose on sequence
        sent += rows
        rows += stale
        rng.shuffle(rows)
        batches.append(pa.table({
            "_op": [r[0] for r in rows],
            "_seq": pa.array([r[1] for r in rows], pa.int64()),
            "_commit_ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * len(rows), TS),
            "id": pa.array([r[2] for r in rows], pa.int64()),
            "name": pa.array([r[3] for r in rows], pa.string()),
            "qty": pa.array([r[4] for r in rows], pa.int64()),
        }))
    return batches, source


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[int, tuple[str, int]]]:
    root = tmp_path_factory.mktemp("readers")
    batches, source = history()
    paths = {}
    for name, options in TABLES.items():
        path = str(root / name)
        sink = DeltaUpsertSink(path, keys=["id"], app_id="readers", compact_every=5, **options)
        for batch_id, batch in enumerate(batches):
            sink.write(batch, batch_id)
        assert not sink.write(batches[-1], len(batches) - 1)  # a replay changes nothing
        paths[name] = path
    return paths, source


def plain(value: Any) -> Any:
    """One spelling of a timestamp across readers (Spark returns naive UTC: the session time zone is UTC)."""
    if isinstance(value, datetime):
        return (value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value).isoformat(" ")
    return value


def check(name: str, columns: list[str], rows: list[dict[str, Any]], source: dict[int, tuple[str, int]]) -> None:
    assert columns == COLUMNS[name], f"{name}: the columns the options promise"
    if name == "scd2":
        # History rows are legitimate rows; the current versions are the source table.
        current = [r for r in rows if r["_valid_to"] is None]
        assert {r["id"]: (r["name"], r["qty"]) for r in current} == source
        assert len(current) == len(source), "one current version per live key"
        assert all(r["name"] is not None for r in rows), "no row of nulls (no tombstone)"
    else:
        assert {r["id"]: (r["name"], r["qty"]) for r in rows} == source
        assert len(rows) == len(source), "a deleted key is not a row"


def canonical(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((tuple((k, plain(v)) for k, v in sorted(r.items())) for r in rows), key=repr)


def test_deltalake_reader(tables: tuple[dict[str, str], dict[int, tuple[str, int]]]) -> None:
    paths, source = tables
    for name, path in paths.items():
        t = DeltaTable(path).to_pyarrow_table()
        check(name, t.column_names, t.to_pylist(), source)


def duckdb_extension() -> str:
    import duckdb
    import duckdb_ext  # the duckdb-ext-delta package: the extension binary for our duckdb

    base = Path(next(iter(duckdb_ext.__path__))) / "extensions" / f"v{duckdb.__version__}"
    found = sorted(base.glob("*/delta.duckdb_extension"))
    assert found, f"no delta extension for duckdb {duckdb.__version__} under {base}"
    return str(found[0])


def test_duckdb_reader(tables: tuple[dict[str, str], dict[int, tuple[str, int]]]) -> None:
    import duckdb

    paths, source = tables
    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    con.execute(f"LOAD '{duckdb_extension()}'")
    for name, path in paths.items():
        t = con.execute("SELECT * FROM delta_scan(?)", [path]).fetch_arrow_table()
        check(name, t.column_names, t.to_pylist(), source)
        assert canonical(t.to_pylist()) == canonical(DeltaTable(path).to_pyarrow_table().to_pylist())


@pytest.mark.spark
def test_delta_spark_reader(spark: Any, tables: tuple[dict[str, str], dict[int, tuple[str, int]]]) -> None:
    paths, source = tables
    for name, path in paths.items():
        df = spark.read.format("delta").load(path)
        rows = [r.asDict() for r in df.collect()]
        check(name, df.columns, rows, source)
        assert canonical(rows) == canonical(DeltaTable(path).to_pyarrow_table().to_pylist())
