"""A batch read (``spark.read``) with ``startingOffsets=snapshot`` on a real MariaDB: the chunked snapshot read by
the driver at its cuts, then the changes after the last cut up to ``endingOffsets``.

* Through Spark: a table of every common type with text keys holding quotes and backslashes, read at several
  cuts, equals the table (the binary log's records of the same rows, and ``SELECT`` of the keys); a second
  identical read gives the same records (``_commit_ts`` aside: the time each read's driver read the rows);
  ``endingOffsets`` before the snapshot and a table without a primary key are refused by name.
* Through the planner, as the batch reader calls it: a writer commits at the start and at the first cuts
  (inserts, updates, key changes, deletes across chunks), and the records applied by key in ``_seq`` order
  equal ``SELECT *`` at the end. An empty table reads nothing; a chunk file removed under a running read fails it.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc.backends.mysql import snapshot
from cdc.errors import DataLossError, OptionError
from cdc.planner import Planner
from cdc.testing import drain
from tests.backends.mysql.harness import MySQLHarness
from tests.backends.mysql.test_backend import KINDS, MAX_ROW, _insert
from tests.backends.postgres.fold import fold_typed


def _text_key(k: int) -> str:
    return f"{'aBcD'[k % 4]}'{k:02d}\\\"é"


def _in_seq_order(tables: list[pa.Table]) -> list[pa.Table]:
    """The records by ``_seq`` (stable: a key's records keep their delivery order where ``_seq`` ties)."""
    whole = pa.concat_tables(tables)
    return [whole.take(pc.sort_indices(whole, [("_seq", "ascending")]))]


def _read(backend: Any, ranges: list[Any]) -> list[pa.Table]:
    """The ranges as the tasks read them: through a pickled reader."""
    reader = pickle.loads(pickle.dumps(backend.reader()))
    out = []
    for r in ranges:
        parts = reader.read(r.channel, r.start, r.end) if r.window is None else reader.read_window(
            r.channel, r.start, r.end, r.window)
        out.append(pa.Table.from_batches(list(parts), schema=backend.schema()))
    return out


def test_a_writer_between_the_cuts_and_the_records_in_seq_order_give_the_table(
    mysql_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = MySQLHarness(mysql_dsn, tables=("texts",), create=False,
                     **{"snapshot.path": str(tmp_path / "snap"), "snapshot.chunkRows": "2",
                        "snapshot.chunksPerBatch": "2"})
    try:
        h.execute("CREATE TABLE texts (k VARCHAR(40) PRIMARY KEY, v VARCHAR(200), n INT)")
        h.execute("INSERT INTO texts VALUES " + ", ".join(["(%s, %s, %s)"] * 24),
                  [x for i in range(24) for x in (_text_key(i), f"v'{i}\\", i)])
        rng = random.Random(7)
        writes = {"left": 3}  # at the start and the first two cuts: before the last cut, in the read

        def write() -> None:  # after each consistent snapshot (start and cuts) is taken: changes between the cuts
            if writes["left"] == 0:
                return
            writes["left"] -= 1
            h.conn.begin()
            with h.conn.cursor() as cur:
                for _ in range(6):
                    k, op = rng.randrange(30), rng.random()
                    if op < 0.4:
                        cur.execute("INSERT INTO texts VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v), "
                                    "n = VALUES(n)", (_text_key(k), f"w'{rng.random():.4f}\\", rng.randrange(99)))
                    elif op < 0.7:  # a key change, often into another chunk
                        cur.execute("UPDATE IGNORE texts SET k = %s WHERE k = %s", (_text_key(rng.randrange(30)),
                                                                                     _text_key(k)))
                    elif op < 0.85:
                        cur.execute("UPDATE texts SET n = n + 100 WHERE k = %s", (_text_key(k),))
                    else:
                        cur.execute("DELETE FROM texts WHERE k = %s", (_text_key(k),))
            h.conn.commit()

        monkeypatch.setattr(snapshot, "after_snapshot_start", write)
        backend = h.backend()
        chunked = backend.chunked_batch_snapshot()
        ranges = Planner(backend).chunked_batch(chunked, "latest")
        monkeypatch.setattr(snapshot, "after_snapshot_start", None)
        assert writes["left"] == 0, "the writer ran at the first three consistent snapshots"
        cuts = {json.dumps(r.window["cut"]) for r in ranges if r.channel.startswith("chunk:")}
        chunks = [r for r in ranges if r.channel.startswith("chunk:")]
        cuts = {json.dumps(r.window["cut"]) for r in chunks}
        assert len(cuts) == 3  # one per write (cuts after the last write share its position) ...
        assert len(chunks) > 6  # ... and more than three cuts of two chunks: the writes came before the last cut
        got = _read(backend, ranges)
        snap = pa.concat_tables(got).filter(pc.equal(pa.concat_tables(got).column("_op"), "snapshot"))
        assert snap.num_rows >= 20
        assert {"insert", "update"} <= set(pa.concat_tables(got).column("_op").to_pylist())  # changes between cuts
        state = fold_typed(_in_seq_order(got), ("k",))
        assert state == {(r[0],): {"k": r[0], "v": r[1], "n": r[2]} for r in h.rows("SELECT k, v, n FROM texts")}
        # the read is a streaming query's batches: files of its own, apart from a streaming query's directory
        assert chunked.root.parent == tmp_path / "snap" / "batch-reads"
    finally:
        h.close()


def test_an_empty_table_and_an_ending_before_the_snapshot(mysql_dsn: str, tmp_path: Path) -> None:
    h = MySQLHarness(mysql_dsn, **{"snapshot.path": str(tmp_path / "snap")})
    try:
        empty = h.backend()  # an empty table: no chunk, nothing to read
        assert Planner(empty).chunked_batch(empty.chunked_batch_snapshot(), "latest") == []
        h.append(3)
        early = h.backend().latest("changes")
        h.append(2)
        backend = h.backend()
        with pytest.raises(OptionError, match=rf"option 'endingOffsets'.*{early}.* is before the snapshot's position"):
            Planner(backend).chunked_batch(backend.chunked_batch_snapshot(), json.dumps({"changes": early}))
    finally:
        h.close()


def test_a_chunk_file_removed_while_the_read_runs_fails_it_by_name(mysql_dsn: str, tmp_path: Path) -> None:
    h = MySQLHarness(mysql_dsn, **{"snapshot.path": str(tmp_path / "snap"), "snapshot.chunkRows": "2"})
    try:
        h.append(5)
        backend = h.backend()
        chunked = backend.chunked_batch_snapshot()
        ranges = Planner(backend).chunked_batch(chunked, "latest")
        assert len(_read(backend, ranges)) == len(ranges)  # the kept files, read as often as asked
        shutil.rmtree(chunked.root)
        with pytest.raises(DataLossError, match=r"chunk \(None, \('1',\)\] of .*items: the batch read's snapshot files"):
            _read(backend, ranges)
    finally:
        h.close()


def _spark_read(spark: Any, options: dict[str, str]) -> Any:
    reader = spark.read.format("cdc").option("backend", "mysql").option("startingOffsets", "snapshot")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in r.items() if not k.startswith("_")} for r in rows), key=lambda r: r["k"])


def test_spark_batch_read_of_every_type_equals_the_table_and_repeats(
    spark: Any, mysql_dsn: str, tmp_path: Path
) -> None:
    h = MySQLHarness(mysql_dsn, tables=("kinds",), create=False)
    try:
        h.execute(KINDS)
        h.execute("SET SESSION time_zone = '+02:00'")
        _insert(h, MAX_ROW)
        h.execute("SET SESSION time_zone = '+00:00'")
        h.execute("INSERT INTO kinds (k) VALUES ('nulls')")
        for i in range(9):
            _insert(h, {**MAX_ROW, "k": _text_key(i), "i": i, "big": "x" * i})
        inserted = pa.concat_tables(list(drain(h.backend()))).to_pylist()
        options = {**h.options, "snapshot.path": str(tmp_path / "snap"), "snapshot.chunkRows": "2",
                   "snapshot.chunksPerBatch": "2"}
        first = _spark_read(spark, options).toArrow()
        assert set(first.column("_op").to_pylist()) == {"snapshot"}
        assert first.num_rows == 11
        assert sorted(first.column("k").to_pylist()) == sorted(r[0] for r in h.rows("SELECT k FROM kinds"))
        assert _plain(first.to_pylist()) == _plain(inserted)
        frame = _spark_read(spark, options)
        again = frame.toArrow()
        assert frame.count() == 11  # a second action on the DataFrame: the same files, no snapshot of its own
        a, b = again.sort_by("k"), first.sort_by("k")
        # every column but the time each read's driver read the rows
        assert [n for n in a.column_names if not a.column(n).equals(b.column(n))] == ["_commit_ts"]
        assert len(list((tmp_path / "snap" / "batch-reads").iterdir())) == 2  # each read's chunks in a directory of its own
    finally:
        h.close()


def test_spark_batch_read_refuses_an_early_end_and_a_table_without_key(
    spark: Any, mysql_dsn: str, tmp_path: Path
) -> None:
    h = MySQLHarness(mysql_dsn, **{"snapshot.path": str(tmp_path / "snap")})
    try:
        h.append(2)
        early = h.backend().latest("changes")
        h.append(2)
        with pytest.raises(Exception, match=r"option 'endingOffsets'.* is before the snapshot's position"):
            _spark_read(spark, {**h.options, "endingOffsets": json.dumps({"changes": early})}).collect()
        h.execute("CREATE TABLE nokey (a INT, b VARCHAR(5))")
        with pytest.raises(Exception, match=r"nokey.*primary key"):
            _spark_read(spark, {**h.options, "tables": "nokey"}).collect()
    finally:
        h.close()


def test_a_new_batch_read_removes_the_batch_reads_older_than_the_retention(tmp_path: Path) -> None:
    import os
    import time

    from cdc.backends.mysql.snapshot import prune_batch_reads

    reads = tmp_path / "batch-reads"
    for name, age_h in (("old", 30), ("recent", 2)):
        (reads / name / "cuts").mkdir(parents=True)
        then = time.time() - age_h * 3600
        os.utime(reads / name, (then, then))
    prune_batch_reads(reads, 0)  # 0 keeps them all
    assert sorted(p.name for p in reads.iterdir()) == ["old", "recent"]
    prune_batch_reads(reads, 24)
    assert sorted(p.name for p in reads.iterdir()) == ["recent"]
    prune_batch_reads(tmp_path / "none", 24)  # nothing there yet
