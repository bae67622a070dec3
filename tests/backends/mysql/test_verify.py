"""``cdc verify --backend mysql`` against the session's real MariaDB and Delta tables written by the real sink
(delta-rs) from what the mysql backend streams: every type the backend streams hashes alike on both sides (the
server's SQL and canonical.py), tampering done directly in Delta is named key by key, and bad input is refused
naming the table, column or path."""

from __future__ import annotations

import json
import random
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, write_deltalake

from cdc.cli import main
from cdc.testing import batches
from cdc.verify.compare import _Bisect
from sinks.delta import DeltaUpsertSink
from tests.backends.mysql.harness import MySQLHarness, connect

_TYPES = """CREATE TABLE typed (
    k VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY,
    ti TINYINT, su SMALLINT UNSIGNED, mi MEDIUMINT, i INT, iu INT UNSIGNED, b BIGINT, bu BIGINT UNSIGNED,
    d DECIMAL(12, 3), wide DECIMAL(50, 10), f FLOAT, db DOUBLE, day DATE, dt DATETIME(6), dt0 DATETIME,
    ts TIMESTAMP(3) NULL, tm TIME(2), y YEAR, b1 BIT(1), b10 BIT(10), e ENUM('red', 'green', 'blü'),
    st SET('x', 'y', 'z'), j JSON, raw VARBINARY(40), bl BLOB, doc TEXT, lat VARCHAR(20) CHARACTER SET latin1)"""
# Under utf8mb4_general_ci 'B' sorts between 'a' and 'c' and 'é' with 'e': the server's order, not Python's.
_KEYS = ["plain", "it's", "back\\slash", "quo\"te", "ünïcødé ✓", "", "a,b:c", "N", "tab\tnew\nline", "B", "a",
         "c", "é", "f", "emoji 🙂"]


def _fill(h: MySQLHarness) -> None:
    rng = random.Random(7)
    for n, key in enumerate(_KEYS + [f"k{j:04d}" for j in range(200)]):
        null = n % 5 == 0
        h.execute(
            "INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s, %s, %s, %s, %s, %s)",
            (key, rng.randrange(-128, 128), rng.randrange(65536), rng.randrange(-2**23, 2**23),
             None if null else rng.randrange(-2**31, 2**31), rng.randrange(2**32), rng.randrange(-2**63, 2**63),
             rng.choice([0, 2**64 - 1, 2**63, rng.randrange(2**64)]),  # BIGINT UNSIGNED beyond the signed range
             Decimal(f"{rng.randrange(-10**9, 10**9)}.{rng.randrange(1000):03d}"),
             Decimal(f"-{rng.randrange(10**30)}.{rng.randrange(10**10):010d}"),
             None if null else rng.choice([0.1, -2.5, 3.4028234663852886e38, 1e-45, rng.uniform(-1e6, 1e6)]),
             rng.choice([0.1, 1.7976931348623157e308, 5e-324, -1e-310, rng.uniform(-1e300, 1e300), 0.0]),
             f"{rng.randrange(1000, 9999)}-0{rng.randrange(1, 9)}-1{rng.randrange(9)}",
             f"19{rng.randrange(10, 99)}-12-31 23:59:59.{rng.randrange(10**6):06d}",
             "0000-00-00 00:00:00" if n % 7 == 0 else f"2026-11-27 12:{n % 60:02d}:00",  # zero: null
             None if null else f"2026-11-27 12:{n % 60:02d}:00.{rng.randrange(1000):03d}",
             rng.choice(["-838:59:59.99", "00:00:00", "12:34:56.7", "100:00:01.01"]), rng.choice([0, 1901, 2155]),
             None if null else n % 2, rng.randrange(1024), rng.choice(["red", "green", "blü", None]),
             rng.choice(["", "x", "z,x", "x,y,z"]), json.dumps({"a": [n, "it's ✓"], "b": None}),
             bytes(rng.randrange(256) for _ in range(rng.randrange(40))),
             None if null else bytes(rng.randrange(256) for _ in range(rng.randrange(600))),
             ("x'\\\"é" * rng.randrange(1, 300)) if n % 3 == 0 else "short", "café"))


def _commit(checkpoint: Path, batch_id: int, end: dict[str, Any]) -> None:
    """Log a batch's end and its commit in the checkpoint, as Spark's OffsetSeqLog and commit log write them
    (after the sink has committed the batch)."""
    for log in ("offsets", "commits"):
        (checkpoint / log).mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(["v1", json.dumps(meta), json.dumps(end)]))
    (checkpoint / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def _pipeline(backend: Any, sink: DeltaUpsertSink, checkpoint: Path, offset: dict[str, Any] | None = None,
              batch_id: int = 0) -> tuple[dict[str, Any] | None, int]:
    """Deliver the backend's changes into the sink, committing each batch in the checkpoint as Spark does."""
    for end, records in batches(backend, offset):
        sink.write(records, batch_id, "verify-test")
        _commit(checkpoint, batch_id, end)
        offset, batch_id = end, batch_id + 1
    return offset, batch_id


def _verify(*args: str) -> Any:
    return CliRunner().invoke(main, ["verify", "--backend", "mysql", *args], catch_exceptions=False)


def test_every_streamed_type_hashes_alike_and_tampered_keys_are_named(
    mysql_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Bisect, "LEAF", 4)  # this table's chunks of 40 rows are narrowed down by sub-ranges
    h = MySQLHarness(mysql_dsn, tables=("typed",), create=False)
    try:
        h.execute(_TYPES)
        h.execute("CREATE TABLE nokey (a INT, b TEXT)")
        _fill(h)
        path, ck = str(tmp_path / "typed"), tmp_path / "checkpoint"
        _pipeline(h.backend(), DeltaUpsertSink(path, keys=["k"]), ck)
        database = h.database
        table = f"{database}.typed"
        dsn, at = mysql_dsn, ["--checkpoint", str(ck), "--chunk-rows", "40"]
        equal = _verify(table, path, "--dsn", dsn, *at)
        assert equal.exit_code == 0, equal.output
        # Equal at the first pass: every chunk's checksum computed by the server equals the Delta side's.
        assert "equal; 215 source rows, 215 Delta rows, 7 chunks, 0 re-checks" in equal.output, equal.output

        # Tamper in Delta directly: two rows deleted (keys with a quote and one equal to another but for case
        # and accents under the collation), one added, one value changed in a row whose key has a backslash.
        rows = DeltaTable(path).to_pyarrow_table()
        tampered = rows.filter(pc.invert(pc.is_in(rows.column("k"), pa.array(["it's", "é", "k0100"]))))
        extra = tampered.slice(0, 1).set_column(tampered.schema.get_field_index("k"), "k", pa.array(["zz\\'new"]))
        tampered = pa.concat_tables([tampered, extra.cast(tampered.schema)])
        changed = pc.if_else(pc.equal(tampered.column("k"), "back\\slash"), "tampered", tampered.column("doc"))
        tampered = tampered.set_column(tampered.schema.get_field_index("doc"), "doc", changed)
        write_deltalake(path, tampered, mode="overwrite")

        got = _verify(table, path, "--dsn", dsn, *at, "--json")
        assert got.exit_code == 1, got.output
        report = json.loads(got.output)
        found = sorted((r["kind"], r["key"][0]) for c in report["differences"] for r in c["rows"])
        assert found == [("changed", "back\\slash"), ("extra", "zz\\'new"), ("missing", "it's"), ("missing", "k0100"),
                         ("missing", "é")], found
        assert report["equal"] is False and report["differing_rows"] == 5 and report["pipeline_reached"] is True
        shown = {r["key"][0]: r for c in report["differences"] for r in c["rows"]}
        assert shown["back\\slash"]["delta"]["doc"] == "tampered" and shown["back\\slash"]["source"]["doc"] != "tampered"
        assert shown["it's"]["delta"] is None and shown["it's"]["source"]["lat"] == "café"
        text = _verify(table, path, "--dsn", dsn, *at)
        assert text.exit_code == 1
        assert "DIFFERENT: 5 rows" in text.output and 'missing key ["it\'s"]' in text.output

        # Bad input: each refused with exit status 2, naming what is wrong.
        for args, message in [
            ((f"{database}.nosuch", path), f"table '{database}.nosuch' does not exist"),
            ((f"{database}.nokey", path), f"table '{database}.nokey' has no primary key"),
            ((table, str(tmp_path / "nowhere")), "is not a Delta table"),
        ]:
            bad = _verify(*args, "--dsn", dsn)
            assert bad.exit_code == 2 and message in bad.output, bad.output
        other = str(tmp_path / "other")
        write_deltalake(other, pa.table({"k": ["a"], "v": [1]}))
        bad = _verify(table, other, "--dsn", dsn)
        assert bad.exit_code == 2 and f"the Delta table at {other!r} is not '{table}'" in bad.output, bad.output
        assert "no column 'ti'" in bad.output
        retyped = str(tmp_path / "retyped")
        write_deltalake(retyped, tampered.set_column(tampered.schema.get_field_index("db"), "db",
                                                     tampered.column("db").cast(pa.string())))
        bad = _verify(table, retyped, "--dsn", dsn)
        assert bad.exit_code == 2 and "column 'db' of" in bad.output and "kind text" in bad.output, bad.output
        bad = _verify(table, path, "--dsn", dsn, "--slot", "s")
        assert bad.exit_code == 2 and "--slot is for --backend postgres" in bad.output
        bad = _verify(table, path, "--dsn", dsn, "--checkpoint", str(tmp_path / "nock"))
        assert bad.exit_code == 2 and "--checkpoint: " in bad.output and "no committed batch" in bad.output, bad.output
    finally:
        h.close()


def test_untampered_is_equal_while_a_writer_runs(mysql_dsn: str, tmp_path: Path) -> None:
    """Reads at consistent snapshots, compared once the checkpoint's committed batch has passed their position:
    a table under writes, followed by the pipeline, is equal (chunks that differed while the pipeline was behind
    are settled by re-checks)."""
    h = MySQLHarness(mysql_dsn)
    stop = threading.Event()
    try:
        h.execute("INSERT INTO items SELECT seq, CONCAT('v', seq), seq FROM seq_0_to_1499")
        path, ck = str(tmp_path / "items"), tmp_path / "checkpoint"
        sink = DeltaUpsertSink(path, keys=["id"])
        backend = h.backend()
        state: dict[str, Any] = {}
        state["offset"], state["batch"] = _pipeline(backend, sink, ck)
        failures: list[BaseException] = []

        def writer() -> None:
            rng = random.Random(3)
            conn = connect(mysql_dsn)
            try:
                while not stop.is_set():
                    conn.begin()
                    with conn.cursor() as cur:
                        for _ in range(5):
                            k = rng.randrange(1800)
                            if rng.random() < 0.8:
                                cur.execute("INSERT INTO items VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
                                            "v = VALUES(v), n = VALUES(n)", (k, f"w'\\{rng.random()}", k))
                            else:
                                cur.execute("DELETE FROM items WHERE id = %s", (k,))
                    conn.commit()
            finally:
                conn.close()

        def pipeline() -> None:
            try:
                while not stop.is_set():
                    state["offset"], state["batch"] = _pipeline(backend, sink, ck, state["offset"], state["batch"])
            except BaseException as e:  # surfaced below
                failures.append(e)

        threads = [threading.Thread(target=writer), threading.Thread(target=pipeline)]
        for t in threads:
            t.start()
        table = f"{h.database}.items"
        outcomes = [_verify(table, path, "--dsn", mysql_dsn, "--checkpoint", str(ck), "--chunk-rows", "300",
                            "--rechecks", "5", "--json") for _ in range(3)]
        stop.set()
        for t in threads:
            t.join()
        assert not failures, failures
        for got in outcomes:
            assert got.exit_code == 0, got.output
            assert json.loads(got.output)["equal"] is True
        # The writer kept the pipeline behind: chunks differed at the first read and were settled by re-checks.
        assert any(json.loads(got.output)["rechecks"] for got in outcomes), [got.output for got in outcomes]
    finally:
        stop.set()
        h.close()


def test_a_composite_key_of_every_key_type(mysql_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key of BIGINT UNSIGNED (a decimal in Delta), text under a collation, DATE, DATETIME, binary and DECIMAL
    columns: chunks, sub-ranges and the Delta rows' order and placement follow the server's order."""
    monkeypatch.setattr(_Bisect, "LEAF", 3)
    h = MySQLHarness(mysql_dsn, tables=("multi",), create=False)
    try:
        h.execute("CREATE TABLE multi (bu BIGINT UNSIGNED, t VARCHAR(10) COLLATE utf8mb4_general_ci, day DATE, "
                  "at DATETIME(3), raw VARBINARY(4), d DECIMAL(6, 2), v INT, PRIMARY KEY (bu, t, day, at, raw, d))")
        rng = random.Random(5)
        rows = {(rng.choice([1, 2**63 + 5, 2**64 - 1]), rng.choice(["a", "B", "c", "É", "e"]),
                 rng.choice(["1999-01-01", "2026-11-27"]), rng.choice(["2026-01-01 00:00:00", "2026-01-01 00:00:00.5"]),
                 bytes([rng.randrange(256)]), rng.choice(["-1.50", "0.05", "10.00"])) for _ in range(80)}
        for n, row in enumerate(sorted(rows)):
            h.execute("INSERT INTO multi VALUES (%s, %s, %s, %s, %s, %s, %s)", (*row, n))
        path, ck = str(tmp_path / "multi"), tmp_path / "checkpoint"
        _pipeline(h.backend(), DeltaUpsertSink(path, keys=["bu", "t", "day", "at", "raw", "d"]), ck)
        table, at = f"{h.database}.multi", ["--dsn", mysql_dsn, "--checkpoint", str(ck), "--chunk-rows", "7"]
        equal = _verify(table, path, *at)
        assert equal.exit_code == 0 and ", 0 re-checks" in equal.output, equal.output
        delta = DeltaTable(path).to_pyarrow_table()
        picked = delta.slice(len(rows) // 2, 1).to_pylist()[0]
        changed = pc.if_else(pc.equal(delta.column("v"), picked["v"]), -1, delta.column("v"))
        write_deltalake(path, delta.set_column(delta.schema.get_field_index("v"), "v", changed), mode="overwrite")
        got = _verify(table, path, *at, "--json")
        assert got.exit_code == 1, got.output
        [diff] = [r for c in json.loads(got.output)["differences"] for r in c["rows"]]
        assert diff["kind"] == "changed" and diff["source"]["v"] == picked["v"] and diff["delta"]["v"] == -1
        assert diff["key"][:2] == [str(picked["bu"]), picked["t"]] and diff["key"][4] == picked["raw"].hex()
    finally:
        h.close()
