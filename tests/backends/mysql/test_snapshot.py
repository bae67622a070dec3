"""``startingOffsets=snapshot`` on a real MariaDB: the chunked, window-reconciled snapshot.

* The visibility rule, forced: a transaction commits between ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and
  the reading of the cut's position. ``SHOW MASTER STATUS`` then lies past the commit while the read view does
  not hold it; the cut (``Binlog_snapshot_position``) lies before it, so the change follows the chunk's row.
* Snapshot rows equal the binary log's records of the same rows, for every type, in both layouts.
* Hypothesis histories over two tables (the many-table form; text keys under a case-insensitive collation, with
  quotes and backslashes, and integer keys) with a writer between planning and reading: inserts, updates,
  deletes, key changes across chunks, transactions spanning chunks; the driver dying after logging a batch
  (before or after reading it), and the server killed (``kill -9``) and restarted mid-snapshot. At the end the
  folded records equal ``SELECT *`` of both tables and every key's ``_seq`` only grows.
* A driver process killed with ``kill -9`` mid-snapshot while a writer runs, then the server killed and
  restarted: the restarted driver replays the logged batch, and the output equals ``SELECT *``.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backends.mysql import snapshot
from cdc.backends.mysql.positions import file_number, pack
from cdc.offsets import Offset
from cdc.planner import Planner
from cdc.testing import drain, read_batch
from cdc.testing.contract import drain_snapshot
from tests.backends.mysql.harness import MySQLHarness, connect
from tests.backends.mysql.test_backend import KINDS, MAX_ROW, _insert
from tests.backends.postgres.fold import fold_json, fold_typed


def test_the_cut_is_the_read_views_position_not_show_master_status(
    mysql_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = MySQLHarness(mysql_dsn, **{"snapshot.path": str(tmp_path / "snap")})
    try:
        backend = h.start_chunked(rows=20, chunk_rows=100)
        planner = Planner(backend)
        start = planner.initial("snapshot")
        seen: dict[str, int] = {}

        def commit_in_between() -> None:  # after the read view is taken, before its position is read
            h.execute("UPDATE items SET v = 'between' WHERE id = 5")
            name, offset = h.rows("SHOW MASTER STATUS")[0][:2]
            seen["master"] = pack(file_number(name), int(offset))

        monkeypatch.setattr(snapshot, "after_snapshot_start", commit_in_between)
        # The chunk in the cut's own transaction (connectorx would read it at a later snapshot of its own).
        monkeypatch.setattr(snapshot.arrowread, "usable", lambda columns: False)
        end = planner.next(start)
        monkeypatch.setattr(snapshot, "after_snapshot_start", None)
        cut = Offset.from_json(end).snapshot.cut  # type: ignore[union-attr]
        assert cut is not None and seen["master"] > int(cut.pos)  # SHOW MASTER STATUS holds the commit ...
        first = read_batch(backend, start, end)
        rows = {r["id"]: r for r in first.to_pylist()}
        assert rows[5]["v"] == "v5" and rows[5]["_seq"] == cut.seq  # ... the read view does not
        later = drain_snapshot(backend, end)
        update = [r for t in later for r in t.to_pylist() if r["id"] == 5]
        assert [(r["_op"], r["v"]) for r in update] == [("update", "between")] and update[0]["_seq"] > cut.seq
        # Had the cut been SHOW MASTER STATUS, the update would lie before it, in no batch after the chunk: lost.
        assert update[0]["_position"] < seen["master"]
        assert fold_typed([first, *later], ("id",)) == h.table()
    finally:
        h.close()


@pytest.mark.parametrize("layout", ["typed", "json"])
def test_snapshot_rows_equal_the_binary_logs_records_of_every_type(mysql_dsn: str, tmp_path: Path,
                                                                    layout: str) -> None:
    tables = ("kinds",) if layout == "typed" else ("kinds", "items")
    h = MySQLHarness(mysql_dsn, tables=tables[1:], **{"snapshot.path": str(tmp_path / "snap")})
    h.options["tables"] = ",".join(tables)
    try:
        h.execute(KINDS)
        h.execute("SET SESSION time_zone = '+02:00'")
        _insert(h, MAX_ROW)
        h.execute("INSERT INTO kinds (k) VALUES ('nulls')")
        h.execute("SET SESSION sql_mode = ''")
        h.execute("INSERT INTO kinds (k, day, dtm, dtm6, ts, e, st, yr) VALUES ('zero', '0000-00-00', "
                  "'0000-00-00 00:00:00', '2024-00-10 00:00:00', '0000-00-00 00:00:00', 'zz', '', 0)")
        h.execute("INSERT INTO kinds (k, tx) VALUES ('A b', 'case'), ('a c', 'order')")
        changes = pa.concat_tables(list(drain(h.backend())))
        backend = h.backend()
        start = Planner(backend).initial("snapshot")
        rows = pa.concat_tables([read_batch(backend, start, Planner(backend).next(start))])
        rows = rows.filter(pc.equal(rows.column("_op"), "snapshot"))
        strip = lambda t: sorted(  # noqa: E731
            ({k: v for k, v in r.items() if not k.startswith("_") or k in ("_table", "_key", "_row")}
             for r in t.to_pylist()), key=repr)
        assert rows.num_rows == changes.num_rows == 5
        assert strip(rows) == strip(changes)
    finally:
        h.close()


def test_integer_keyed_snapshot_rows_read_by_connectorx_equal_the_binary_logs_records(mysql_dsn: str,
                                                                                     tmp_path: Path) -> None:
    """Every type again, keyed on an integer: read by connectorx at a snapshot of its own. FLOAT's largest value
    is exact (its text form, which a PyMySQL read parses, has six digits), impossible dates are null, negative
    times keep their sign, over two chunks."""
    h = MySQLHarness(mysql_dsn, tables=(), **{"snapshot.path": str(tmp_path / "snap"), "snapshot.chunkRows": "3"})
    h.options["tables"] = "kinds"
    try:
        h.execute(KINDS)
        h.execute("ALTER TABLE kinds DROP PRIMARY KEY, ADD COLUMN id INT PRIMARY KEY AUTO_INCREMENT FIRST")
        h.execute("SET SESSION time_zone = '+02:00'")
        _insert(h, MAX_ROW)
        h.execute("INSERT INTO kinds (k) VALUES ('nulls')")
        h.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
        h.execute("INSERT INTO kinds (k, day, dtm, dtm6, ts, e, st, yr) VALUES ('zero', '0000-00-00', "
                  "'0000-00-00 00:00:00', '2024-00-10 00:00:00', '0000-00-00 00:00:00', 'zz', '', 0)")
        h.execute("INSERT INTO kinds (k, day, dtm6, f, tm, tm6) VALUES ('feb31', '2024-02-31', '0000-03-01 00:00:00', "
                  "3.4028234e38, '-00:00:01', '-00:00:00.5')")
        changes = pa.concat_tables(list(drain(h.backend())))
        backend = h.backend()
        start = Planner(backend).initial("snapshot")
        rows = pa.concat_tables(drain_snapshot(backend, start))
        rows = rows.filter(pc.equal(rows.column("_op"), "snapshot"))
        strip = lambda t: sorted(  # noqa: E731
            ({k: v for k, v in r.items() if not k.startswith("_")} for r in t.to_pylist()), key=lambda r: r["id"])
        assert rows.num_rows == changes.num_rows == 4
        assert strip(rows) == strip(changes)
    finally:
        h.close()


# ------------------------------------------------------------------------------------------------ histories
@dataclass(frozen=True)
class Txn:
    size: int


@dataclass(frozen=True)
class Batch:
    limit: int | None
    write: bool = False
    """A writer's transaction between planning the batch and reading it."""
    die: str | None = None
    """The driver dies after logging the batch: ``before`` reading it (its cut is gone; the replay reads at a new
    one) or ``after`` (the replay yields the first reads' records)."""


@dataclass(frozen=True)
class Restart:
    pass


STEPS = st.lists(
    st.one_of(
        st.builds(Txn, st.integers(1, 6)),
        st.builds(Batch, st.one_of(st.none(), st.integers(1, 8)), st.booleans(),
                  st.sampled_from([None, None, "before", "after"])),
        st.just(Restart()),
    ),
    min_size=4,
    max_size=20,
)
_examples = itertools.count()
_PREFIXES = ("a", "B", "c", "D")  # utf8mb4_general_ci orders a < B < c < D; Python orders B < D < a < c


def _text_key(k: int) -> str:
    return f"{_PREFIXES[k % 4]}'{k:02d}\\\"é"


def _transaction(conn: Any, rng: random.Random, tables: tuple[str, str], size: int) -> None:
    """Inserts, updates, key changes and deletes over both tables, one transaction (spanning chunks)."""
    conn.begin()
    with conn.cursor() as cur:
        for _ in range(size):
            t = rng.choice(tables)
            text = t == tables[0]
            key_col = "k" if text else "id"
            k = rng.randrange(40)
            key: Any = _text_key(k) if text else k
            op = rng.random()
            if op < 0.4:
                cur.execute(f"INSERT INTO `{t}` VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v), "
                            "n = VALUES(n)", (key, f"r'{rng.random():.5f}\\", rng.randrange(1000)))
            elif op < 0.65:
                cur.execute(f"UPDATE `{t}` SET n = %s WHERE {key_col} = %s", (rng.randrange(1000), key))
            elif op < 0.85:  # a key change (often into another chunk), unless the new key is taken
                other = rng.randrange(40)
                cur.execute(f"UPDATE IGNORE `{t}` SET {key_col} = %s WHERE {key_col} = %s",
                            (_text_key(other) if text else other, key))
            else:
                cur.execute(f"DELETE FROM `{t}` WHERE {key_col} = %s", (key,))
    conn.commit()


@pytest.mark.slow
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS, kill=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)), seed=st.integers(0, 2**32))
def test_random_histories_with_a_writer_during_the_snapshot(
    mysql_dsn: str, mariadb_server: Any, tmp_path_factory: pytest.TempPathFactory, steps: list[Any],
    kill: float | None, seed: int,
) -> None:
    rng = random.Random(seed)
    kill_at = None if kill is None else int(kill * len(steps))
    n = next(_examples)
    tables = (f"s{n}", f"i{n}")
    h = MySQLHarness(mysql_dsn, tables=(), create=False, fresh=False,
                     **{"snapshot.path": str(tmp_path_factory.mktemp("snap")), "snapshot.chunkRows": "4",
                        "snapshot.chunksPerBatch": "2"})
    h.options["tables"] = ",".join(tables)
    try:
        name, offset = h.rows("SHOW MASTER STATUS")[0][:2]
        before = pack(file_number(name), int(offset))  # every change of the tables, their first rows included
        h.execute(f"CREATE TABLE `{tables[0]}` (k VARCHAR(40) COLLATE utf8mb4_general_ci PRIMARY KEY, v TEXT, n INT)")
        h.execute(f"CREATE TABLE `{tables[1]}` (id BIGINT PRIMARY KEY, v TEXT, n INT)")
        for t, key in ((tables[0], _text_key), (tables[1], int)):
            with h.conn.cursor() as cur:
                cur.executemany(f"INSERT INTO `{t}` VALUES (%s, 'seed', %s)", [(key(k), k) for k in range(0, 40, 2)])
        backend = h.backend()
        start = Planner(backend).initial("snapshot")
        delivered: list[pa.Table] = []
        planned: dict[str, Any] | None = None  # an end offset logged, its batch not committed yet
        for i, step in enumerate(steps):
            if i == kill_at:  # the server dies mid-snapshot; the query fails and restarts from its checkpoint
                mariadb_server.kill()
                mariadb_server.start()
                h.conn = connect(h.dsn)
                _transaction(h.conn, rng, tables, 2)
                backend = h.backend()
                if planned is not None:
                    assert read_batch(backend, start, planned).equals(delivered[-1])  # the replay yields the same
                    start, planned = planned, None
            if isinstance(step, Txn):
                _transaction(h.conn, rng, tables, step.size)
            elif isinstance(step, Restart):
                backend = h.backend()
            else:
                if planned is not None:  # Spark commits a batch when it plans the next one
                    backend.acknowledge(Offset.from_json(planned).positions())
                    start, planned = planned, None
                end = Planner(backend).next(start, step.limit)
                if end == start:
                    continue
                if step.write or step.die == "before":  # rows of the planned chunks change before they are read
                    _transaction(h.conn, rng, tables, 3)
                    for t in tables:
                        h.execute(f"UPDATE `{t}` SET n = n + 1")
                if step.die == "before":  # logged, never read: the cut is gone with the driver
                    backend = h.backend()
                first = read_batch(backend, start, end)
                if step.die == "after":
                    backend = h.backend()
                    assert read_batch(backend, start, end).equals(first)
                delivered.append(first)
                planned = end
        if planned is not None:
            start = planned
        delivered += drain_snapshot(h.backend(), start)
        last: dict[Any, int] = {}
        for t in delivered:
            for row in t.select(["_table", "_key", "_seq"]).to_pylist():
                key = (row["_table"], row["_key"])
                assert row["_seq"] > last.get(key, -1), f"{key}: _seq {row['_seq']} after {last.get(key)}"
                last[key] = row["_seq"]
        expected = {}
        for t, col in ((tables[0], "k"), (tables[1], "id")):
            for row in h.rows(f"SELECT {col}, v, n FROM `{t}`"):
                expected[(f"{h.database}.{t}", json.dumps({col: row[0]}, separators=(",", ":"), ensure_ascii=False))] = (
                    dict(zip((col, "v", "n"), row, strict=True)))
        assert fold_json(delivered) == expected
        _rows_are_exact_at_their_seq(h, before, delivered)
    finally:
        h.close()


def _rows_are_exact_at_their_seq(h: MySQLHarness, before: int, delivered: list[pa.Table]) -> None:
    """Every snapshot row equals its key's state as of its ``_seq`` (the binary log's changes up to it): a row is
    never labelled older than what it holds, so no change it holds is delivered again after it."""
    plain = h.backend_with(**{k: v for k, v in h.options.items() if not k.startswith("snapshot.")})
    changes = [r for t in drain(plain, Planner(plain).initial(json.dumps({"changes": before})))
               for r in t.to_pylist()]
    history: dict[tuple[str, str], list[tuple[int, dict[str, Any] | None]]] = {}
    for r in changes:
        row = None if r["_op"] == "delete" else r["_row"]
        history.setdefault((r["_table"], r["_key"]), []).append((r["_seq"], row))
    for t in delivered:
        for r in t.filter(pc.equal(t.column("_op"), "snapshot")).to_pylist():
            states = [row for seq, row in history.get((r["_table"], r["_key"]), []) if seq <= r["_seq"]]
            assert states and states[-1] == r["_row"], f"{r['_key']} at {r['_seq']}: {r['_row']} != {states[-1:]}"


# ------------------------------------------------------------------------------------------- driver kill -9
def test_driver_killed_mid_snapshot_and_a_server_restart(mysql_dsn: str, mariadb_server: Any, tmp_path: Path) -> None:
    h = MySQLHarness(mysql_dsn)
    with h.conn.cursor() as cur:
        cur.executemany("INSERT INTO items VALUES (%s, %s, 0)", [(i, f"v'{i}\\") for i in range(400)])
    stop = threading.Event()

    def writer() -> None:
        conn = connect(mysql_dsn)
        i = 0
        with conn.cursor() as cur:
            while not stop.is_set() and i < 300:
                i += 1
                conn.begin()  # a transaction spanning chunks: a key moves from the start of the table to its end
                cur.execute("UPDATE IGNORE items SET id = id + 1000 WHERE id = %s", (i % 400,))
                cur.execute("UPDATE items SET n = n + 1 WHERE id = %s", (399 - i % 400,))
                cur.execute("INSERT INTO items VALUES (%s, 'w', 0) ON DUPLICATE KEY UPDATE n = n + 1", (i * 13 % 450,))
                cur.execute("DELETE FROM items WHERE id = %s", (i * 7 % 400,))
                conn.commit()
        conn.close()

    def run(*extra: str) -> int:
        cmd = [sys.executable, "-m", "tests.backends.mysql.driver", mysql_dsn, str(tmp_path / "work"),
               "--snapshot", str(tmp_path / "snap"), *extra]
        return subprocess.run(cmd, cwd=Path(__file__).parents[3], timeout=300).returncode

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert run("--die-after", "2") == -9  # killed after logging batch 2 (mid-snapshot), before its output
        assert not (tmp_path / "work" / "out-2.arrow").exists()
    finally:
        stop.set()
        thread.join()
    mariadb_server.kill()  # the server dies too, and comes back: the batch's cut is gone with both
    mariadb_server.start()
    h.conn = connect(mysql_dsn)
    h.execute("UPDATE items SET v = 'after restart' WHERE id = 399")
    assert run() == 0
    outs = sorted((tmp_path / "work").glob("out-*.arrow"), key=lambda p: int(p.stem.split("-")[1]))
    tables = [feather.read_table(str(p)) for p in outs]
    assert sum(t.filter(pc.equal(t.column("_op"), "snapshot")).num_rows for t in tables) > 300
    assert fold_typed(tables, ("id",)) == h.table()
    h.close()


def test_a_snapshot_without_snapshot_path_or_with_a_key_it_cannot_range_over_is_refused_by_name(
    mysql_dsn: str, tmp_path: Path
) -> None:
    from cdc.errors import OptionError

    h = MySQLHarness(mysql_dsn)
    try:
        with pytest.raises(OptionError, match="option 'snapshot.path' is required with startingOffsets=snapshot"):
            Planner(h.backend()).initial("snapshot")
        h.execute("CREATE TABLE flags (f ENUM('x','y') PRIMARY KEY, v INT)")
        backend = h.backend_with(dsn=mysql_dsn, tables="flags", **{"snapshot.path": str(tmp_path)})
        with pytest.raises(OptionError, match=r"table '.*\.flags' has primary key column 'f' of type enum"):
            Planner(backend).initial("snapshot")
    finally:
        h.close()
