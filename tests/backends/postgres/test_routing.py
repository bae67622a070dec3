"""The routing sink over a real many-table stream: each table into its own Delta table, an added column
flowing through, a dropped column no longer written, a type change refused, a replayed batch skipping the
tables already committed."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from cdc.testing import batches
from sinks.delta.schema import SchemaEvolutionError
from sinks.routing import RoutingDeltaSink
from tests.backends.postgres.harness import PostgresHarness


def _delta(path: str) -> list[dict[str, object]]:
    # The main table holds live rows only (tombstones live in its _cdc_state table); bookkeeping starts with "_".
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(({k: v for k, v in r.items() if not k.startswith("_")} for r in rows), key=lambda r: r["id"])


def test_each_table_into_its_own_delta_table_and_replays_skip(postgres_dsn: str, tmp_path: Path) -> None:
    h = PostgresHarness(postgres_dsn, tables=("orders", "customers"))
    try:
        h.execute("INSERT INTO orders SELECT g, 'o' || g, g FROM generate_series(1, 5) g")
        h.execute("INSERT INTO customers VALUES (1, 'c', 1)")
        sink = RoutingDeltaSink(str(tmp_path / "lake"))
        got = list(batches(h.backend(), limit=3))
        for i, (_, table) in enumerate(got):
            sink.write(table, i, "q")
        h.execute("ALTER TABLE customers ADD COLUMN city text")
        h.execute("UPDATE customers SET city = 'Oslo', n = 2 WHERE id = 1")
        h.execute("DELETE FROM orders WHERE id = 2")
        h.execute("INSERT INTO orders VALUES (9, 'late', 9)")
        more = list(batches(h.backend(), got[-1][0]))
        assert len(more) == 1
        batch_id = len(got)
        # A crash after the first table committed: the replay applies only the other one.
        first_table = sorted(set(more[0][1].column("_table").to_pylist()))[0]
        part = more[0][1].filter(pc.equal(more[0][1].column("_table"), first_table))
        assert sink.write(part, batch_id, "q") == {first_table: True}
        applied = RoutingDeltaSink(str(tmp_path / "lake")).write(more[0][1], batch_id, "q")
        assert applied == {"public.customers": first_table != "public.customers",
                           "public.orders": first_table != "public.orders"}
        for t in ("orders", "customers"):
            expected = [dict(zip(("id", "v", "n", "city"), r, strict=False))
                        for r in h.conn.execute(f"SELECT * FROM {t} ORDER BY id".encode()).fetchall()]
            assert _delta(sink.path(f"public.{t}")) == expected
    finally:
        h.close()


def test_dropped_column_stops_being_written_and_a_type_change_fails_clearly(
    postgres_dsn: str, tmp_path: Path
) -> None:
    h = PostgresHarness(postgres_dsn, tables=("orders", "customers"))
    try:
        h.execute("INSERT INTO orders VALUES (1, 'a', 1), (2, 'b', 2)")
        h.execute("INSERT INTO customers VALUES (1, 'c', 1)")
        sink = RoutingDeltaSink(str(tmp_path / "lake"))
        got = list(batches(h.backend()))
        for i, (_, table) in enumerate(got):
            sink.write(table, i, "q")
        h.execute("ALTER TABLE orders DROP COLUMN v")
        h.execute("UPDATE orders SET n = 10 WHERE id = 1")
        h.execute("INSERT INTO orders VALUES (3, 3)")
        more = list(batches(h.backend(), got[-1][0]))
        for i, (_, table) in enumerate(more, start=len(got)):
            sink.write(table, i, "q")
        # The Delta column stays (older versions and untouched rows keep their values); rows written after
        # the drop no longer carry it.
        assert _delta(sink.path("public.orders")) == [
            {"id": 1, "v": None, "n": 10}, {"id": 2, "v": "b", "n": 2}, {"id": 3, "v": None, "n": 3}]
        h.execute("ALTER TABLE customers ALTER COLUMN n TYPE text")
        h.execute("UPDATE customers SET n = 'many' WHERE id = 1")
        last = list(batches(h.backend(), more[-1][0]))
        with pytest.raises(SchemaEvolutionError, match="'n': table has int64, changes have string"):
            sink.write(last[0][1], len(got) + len(more), "q")
        assert _delta(sink.path("public.customers")) == [{"id": 1, "v": "c", "n": 1}]  # nothing written
    finally:
        h.close()
