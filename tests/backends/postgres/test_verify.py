"""``cdc verify`` against a real PostgreSQL and Delta tables written by the real sink (delta-rs): tampering done
directly in Delta is named key by key; an untampered table is equal while a writer and the pipeline run; bad
input is refused naming the table or the path."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, write_deltalake

from cdc.cli import main
from cdc.offsets import Offset
from cdc.testing import batches
from cdc.verify.compare import _Bisect
from sinks.delta import DeltaUpsertSink
from sinks.routing import RoutingDeltaSink
from tests.backends.postgres.harness import PostgresHarness

_TYPES = """CREATE TABLE typed (
    k text PRIMARY KEY, i int, b bigint, s smallint, f8 float8, f4 real, d numeric(12, 3), big numeric,
    ok boolean, day date, at timestamptz, naive timestamp, raw bytea, doc text)"""
_KEYS = ["plain", "it's", "back\\slash", "quo\"te", "ünïcødé ✓", "", "a,b:c", "N", "tab\tnew\nline"]


def _fill(h: PostgresHarness) -> None:
    rng = random.Random(7)
    for i, key in enumerate(_KEYS + [f"k{j:04d}" for j in range(200)]):
        null = i % 5 == 0
        h.execute(
            "INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (key, None if null else rng.randrange(-2**31, 2**31), rng.randrange(-2**63, 2**63), rng.randrange(-999, 999),
             None if null else rng.choice([0.1, -0.0, 1e300, float("inf"), float("nan"), rng.random()]),
             rng.random(), f"{rng.randrange(-10**9, 10**9)}.{rng.randrange(1000):03d}", f"{rng.random() * 1e30:.12f}",
             None if null else bool(i % 2), f"{rng.randrange(1900, 2100)}-0{rng.randrange(1, 9)}-1{rng.randrange(9)}",
             f"2026-11-27 12:{i % 60:02d}:00.{rng.randrange(10**6):06d}+05", "1999-12-31 23:59:59.999999",
             None if null else bytes(rng.randrange(256) for _ in range(rng.randrange(40))),
             # Large values: stored out of line (TOAST) in PostgreSQL.
             ("x'\\\"" * rng.randrange(1, 3000)) if i % 3 == 0 else "short"))


def _pipeline(h: PostgresHarness, sink: DeltaUpsertSink, offset: dict[str, Any] | None, batch_id: int,
              backend: Any) -> tuple[dict[str, Any] | None, int]:
    """Deliver what the slot holds into the sink, acknowledging each batch as Spark's commit does."""
    for end, records in batches(backend, offset):
        sink.write(records, batch_id, "verify-test")
        backend.acknowledge(Offset.from_json(end).positions())
        offset, batch_id = end, batch_id + 1
    return offset, batch_id


def _verify(*args: str) -> Any:
    return CliRunner().invoke(main, ["verify", *args], catch_exceptions=False)


def test_tampered_keys_are_named_exactly_and_bad_input_is_refused(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Differing chunks are narrowed down by sub-range checksums before rows are compared: small sub-ranges here,
    # so that this table's chunks of 40 rows are split.
    monkeypatch.setattr(_Bisect, "LEAF", 4)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(_TYPES.encode())
        conn.execute(b"CREATE TABLE nokey (a int, b text)")
    h = PostgresHarness(postgres_dsn, tables=("typed",), create=False)
    try:
        _fill(h)
        path = str(tmp_path / "typed")
        sink = DeltaUpsertSink(path, keys=["k"])
        backend = h.backend()
        _pipeline(h, sink, None, 0, backend)
        dsn = postgres_dsn
        slot = backend.slot  # type: ignore[attr-defined]
        equal = _verify("public.typed", path, "--dsn", dsn, "--slot", slot, "--chunk-rows", "40")
        assert equal.exit_code == 0, equal.output
        # Equal at the first pass (the chunk checksums of both sides agree): no chunk needed a re-check.
        assert "equal; 209 source rows, 209 Delta rows, 7 chunks, 0 re-checks" in equal.output

        # Tamper in Delta directly: two rows deleted (one with a quote, one with a backslash in its key), one
        # added, one value changed in a row whose key has a quote.
        table = DeltaTable(path).to_pyarrow_table()
        keep = pc.invert(pc.is_in(table.column("k"), pa.array(["it's", "k0100"])))
        tampered = table.filter(keep)
        extra = tampered.slice(0, 1).set_column(tampered.schema.get_field_index("k"), "k", pa.array(["zz\\'new"]))
        tampered = pa.concat_tables([tampered, extra.cast(tampered.schema)])
        changed = pc.if_else(pc.equal(tampered.column("k"), "back\\slash"), "tampered", tampered.column("doc"))
        tampered = tampered.set_column(tampered.schema.get_field_index("doc"), "doc", changed)
        write_deltalake(path, tampered, mode="overwrite")

        compared: list[int] = []
        compare = _Bisect.compare

        def counted(self: _Bisect, rng: Any, idx: Any) -> Any:
            compared.append(len(idx))
            return compare(self, rng, idx)

        monkeypatch.setattr(_Bisect, "compare", counted)
        got = _verify("public.typed", path, "--dsn", dsn, "--slot", slot, "--chunk-rows", "40", "--json")
        assert got.exit_code == 1, got.output
        # Only the sub-ranges holding a tampered key were compared row by row (the sub-range checksums of both
        # sides agree elsewhere): at most one per tampered key in each of the 3 re-checks.
        assert len(compared) <= 4 * 3 and sum(compared) <= 4 * 3 * 4, compared
        monkeypatch.setattr(_Bisect, "compare", compare)
        report = json.loads(got.output)
        rows = sorted((r["kind"], r["key"][0]) for c in report["differences"] for r in c["rows"])
        assert rows == [("changed", "back\\slash"), ("extra", "zz\\'new"), ("missing", "it's"), ("missing", "k0100")]
        assert report["equal"] is False and report["differing_rows"] == 4
        text = _verify("public.typed", path, "--dsn", dsn, "--chunk-rows", "40")
        assert text.exit_code == 1
        assert "DIFFERENT: 4 rows" in text.output and 'missing key ["it\'s"]' in text.output

        # Bad input: each refused with exit status 2, naming what is wrong.
        for args, message in [
            (("public.nosuch", path), "table 'public.nosuch' does not exist"),
            (("public.nokey", path), "table 'public.nokey' has no primary key"),
            (("public.typed", str(tmp_path / "nowhere")), "is not a Delta table"),
        ]:
            bad = _verify(*args, "--dsn", dsn)
            assert bad.exit_code == 2 and message in bad.output, bad.output
        other = str(tmp_path / "other")
        write_deltalake(other, pa.table({"k": ["a"], "v": [1]}))
        bad = _verify("public.typed", other, "--dsn", dsn)
        assert bad.exit_code == 2 and f"the Delta table at {other!r} is not 'public.typed'" in bad.output
        assert "no column 'i'" in bad.output
        # A Delta table written without some columns (the sink's except_columns) is compared without them: the
        # tampered document no longer differs, the missing and extra rows still do.
        narrow = str(tmp_path / "narrow")
        write_deltalake(narrow, tampered.drop_columns(["doc", "raw"]))
        bad = _verify("public.typed", narrow, "--dsn", dsn)
        assert bad.exit_code == 2 and "no column 'raw', 'doc'" in bad.output, bad.output
        got = _verify("public.typed", narrow, "--dsn", dsn, "--exclude", "doc", "--exclude", "raw", "--json")
        assert got.exit_code == 1
        assert sorted((r["kind"], r["key"][0]) for c in json.loads(got.output)["differences"] for r in c["rows"]) == [
            ("extra", "zz\\'new"), ("missing", "it's"), ("missing", "k0100")]
        bad = _verify("public.typed", narrow, "--dsn", dsn, "--exclude", "k", "--exclude", "nope")
        assert bad.exit_code == 2 and "has no column 'nope'" in bad.output
    finally:
        h.close()


def test_untampered_is_equal_while_a_writer_runs(postgres_dsn: str, tmp_path: Path) -> None:
    h = PostgresHarness(postgres_dsn, tables=("items",))
    stop = threading.Event()
    try:
        h.execute("INSERT INTO items SELECT g, 'v' || g, g FROM generate_series(0, 2999) g")
        path = str(tmp_path / "items")
        sink = DeltaUpsertSink(path, keys=["id"])
        backend = h.backend()
        state: dict[str, Any] = {"offset": None, "batch": 0}
        state["offset"], state["batch"] = _pipeline(h, sink, None, 0, backend)
        failures: list[BaseException] = []

        def writer() -> None:
            rng = random.Random(3)
            with psycopg.connect(postgres_dsn, autocommit=True) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        for _ in range(5):
                            k = rng.randrange(3500)
                            if rng.random() < 0.8:
                                conn.execute(b"INSERT INTO items VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                                             b"SET v = excluded.v, n = excluded.n", (k, f"w'\\{rng.random()}", k))
                            else:
                                conn.execute(b"DELETE FROM items WHERE id = %s", (k,))

        def pipeline() -> None:
            try:
                while not stop.is_set():
                    state["offset"], state["batch"] = _pipeline(h, sink, state["offset"], state["batch"], backend)
            except BaseException as e:  # surfaced below
                failures.append(e)

        threads = [threading.Thread(target=writer), threading.Thread(target=pipeline)]
        for t in threads:
            t.start()
        slot = backend.slot  # type: ignore[attr-defined]
        outcomes = [_verify("public.items", path, "--dsn", postgres_dsn, "--slot", slot, "--chunk-rows", "500",
                            "--rechecks", "5", "--json") for _ in range(5)]
        stop.set()
        for t in threads:
            t.join()
        assert not failures, failures
        for got in outcomes:
            assert got.exit_code == 0, got.output
            assert json.loads(got.output)["equal"] is True
        # The writer kept the pipeline behind: chunks differed at the first read and were settled by re-checks.
        print("rechecks", [json.loads(got.output)["rechecks"] for got in outcomes])
        assert any(json.loads(got.output)["rechecks"] for got in outcomes)
    finally:
        stop.set()
        h.close()


def test_many_table_layout_through_the_routing_sink(postgres_dsn: str, tmp_path: Path) -> None:
    """A many-table query carries rows as JSON: the routing sink writes numerics, timestamps, dates and bytea as
    text (ISO 8601, hex) and reals as doubles; verify compares them in those forms."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(b"CREATE TABLE a (id int PRIMARY KEY, d numeric(10,2), f real, g float8, naive timestamp, "
                     b"t timestamptz, ok bool, day date, raw bytea, big numeric)")
        conn.execute(b"CREATE TABLE b (k text PRIMARY KEY, v text)")
    h = PostgresHarness(postgres_dsn, tables=("a", "b"), create=False)
    try:
        h.execute("INSERT INTO a VALUES (1, 1.50, 0.1, 1e300, '2020-01-01 00:00:00', '2026-01-01 10:00:00.123456+02', "
                  "true, '2026-02-03', '\\x00ff', 12345678901234567890.5), (2, NULL, NULL, NULL, NULL, NULL, NULL, "
                  "NULL, NULL, NULL), (3, 0.05, -0.0, 'NaN', '1999-12-31 23:59:59.5', '2000-01-01 00:00:00+00', "
                  "false, '0099-01-01', '', 'NaN')")
        h.execute("INSERT INTO b VALUES ('it''s', 'x'), ('back\\slash', 'y')")
        sink = RoutingDeltaSink(str(tmp_path / "lake"))
        for i, (_, records) in enumerate(batches(h.backend())):
            sink.write(records, i, "q")
        for table in ("public.a", "public.b"):
            got = _verify(table, sink.path(table), "--dsn", postgres_dsn)
            assert got.exit_code == 0 and ", 0 re-checks" in got.output, got.output
        path = sink.path("public.a")
        rows = DeltaTable(path).to_pyarrow_table()
        changed = pc.if_else(pc.equal(rows.column("id"), 3), "2000-01-01T00:00:00.000001+00:00", rows.column("t"))
        write_deltalake(path, rows.set_column(rows.schema.get_field_index("t"), "t", changed), mode="overwrite")
        got = _verify("public.a", path, "--dsn", postgres_dsn, "--json")
        assert got.exit_code == 1
        assert [(r["kind"], r["key"]) for c in json.loads(got.output)["differences"] for r in c["rows"]] == [
            ("changed", ["3"])]
    finally:
        h.close()


def test_a_table_above_whole_rows_is_read_by_groups_of_chunks(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``whole_rows`` an integer-keyed Delta table is read by key-range filters, a group of chunks at a
    time (its files hold keys in no order: pruning by statistics cannot skip them all); the verdict and the
    differences named are those of the whole read."""
    from cdc.backends.postgres.verify import PostgresVerifySource
    from cdc.verify.compare import DeltaSide, verify

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(b"CREATE TABLE grouped (id bigint PRIMARY KEY, v text, n int)")
        conn.execute(b"INSERT INTO grouped SELECT g, 'v-' || g, g % 7 FROM generate_series(1, 120) g")
    ids = list(range(1, 121))
    random.Random(3).shuffle(ids)
    path = str(tmp_path / "grouped")
    for part in range(4):  # four files, each holding keys scattered over the whole range
        mine = sorted(ids[part * 30:(part + 1) * 30])
        write_deltalake(path, pa.table({"id": pa.array(mine, pa.int64()), "v": [f"v-{i}" for i in mine],
                                        "n": pa.array([i % 7 for i in mine], pa.int32()),
                                        "_seq": pa.array([0] * 30, pa.int64())}), mode="append")
    groups: list[int] = []
    grouped = DeltaSide.grouped

    def spied(self: DeltaSide, ranges: Any, per: int) -> Any:
        groups.append(per)
        return grouped(self, ranges, per)

    monkeypatch.setattr(DeltaSide, "grouped", spied)
    source = PostgresVerifySource(postgres_dsn, "public.grouped")
    try:
        for whole_rows in (1_000, 30):
            report = verify(source, path, chunk_rows=10, whole_rows=whole_rows)
            assert report.equal and report.delta_rows == 120 and report.rechecks == 0, report.summary()
        assert groups == [3]
        table = DeltaTable(path).to_pyarrow_table()
        table = table.filter(pc.not_equal(table.column("id"), 17))
        table = table.set_column(1, "v", pc.if_else(pc.equal(table.column("id"), 55), "tampered", table.column("v")))
        extra = table.slice(0, 2).set_column(0, "id", pa.array([0, 1000], pa.int64()))
        write_deltalake(path, pa.concat_tables([table, extra]), mode="overwrite")
        found = []
        for whole_rows in (1_000, 30):
            report = verify(source, path, chunk_rows=10, whole_rows=whole_rows)
            found.append(sorted((r.kind, r.key[0]) for c in report.differences for r in c.rows))
            assert report.delta_rows == 121
        assert found[0] == found[1] == [("changed", "55"), ("extra", 0), ("extra", 1000), ("missing", "17")], found
        assert groups == [3, 3]
    finally:
        source.close()
