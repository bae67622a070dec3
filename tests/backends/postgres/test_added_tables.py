"""Adding a table to a running query (and removing one) on a restart from its checkpoint, against the session's
PostgreSQL: the added table is snapshotted in chunks while the others keep streaming, then streams too; a removed
one stops; bad additions fail naming the table, the option and the fix. The Spark test runs the real thing into
Delta through the routing sink, with a writer running, a failure in the middle of the added table's snapshot and a
restart."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.backend import open_backend
from cdc.backends.postgres import connection
from cdc.backends.postgres.errors import NoPrimaryKeyError
from cdc.errors import OptionError
from cdc.planner import Planner
from cdc.testing import batches

_TABLES = ("first", "second")


def _create(conn: psycopg.Connection[Any], rows: int) -> None:
    for t in _TABLES:
        conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text, n int)".encode())
        conn.execute(f"INSERT INTO {t} SELECT g, 'v' || g, 0 FROM generate_series(0, %s - 1) g".encode(), (rows,))


class Writer(threading.Thread):
    """Inserts, updates, key changes and deletes on both tables (keys below 200), a transaction each."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.done = 0

    def run(self) -> None:
        rng = random.Random(11)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                t, k = rng.choice(_TABLES), rng.randrange(200)
                op = rng.random()
                try:
                    if op < 0.3:
                        conn.execute(f"INSERT INTO {t} VALUES (%s, %s, 0) ON CONFLICT DO NOTHING".encode(), (k, f"w{k}"))
                    elif op < 0.7:
                        conn.execute(f"UPDATE {t} SET n = n + 1, v = %s WHERE id = %s".encode(), (f"u{rng.random()}", k))
                    elif op < 0.85:
                        conn.execute(f"UPDATE {t} SET id = %s WHERE id = %s".encode(), (rng.randrange(200), k))
                    else:
                        conn.execute(f"DELETE FROM {t} WHERE id = %s".encode(), (k,))
                    self.done += 1
                except psycopg.errors.UniqueViolation:
                    pass
                time.sleep(0.003)


def _delta(path: str) -> dict[int, tuple[str, int]]:
    from deltalake import DeltaTable

    return {r["id"]: (r["v"], r["n"]) for r in DeltaTable(path).to_pyarrow_table(columns=["id", "v", "n"]).to_pylist()}


def _source(dsn: str, table: str) -> dict[int, tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(f"SELECT id, v, n FROM {table}".encode())}


def test_a_table_added_on_restart_is_snapshotted_then_streamed_exactly_once(
    spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    from sinks.routing import RoutingDeltaSink

    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 60)
    conn.execute("INSERT INTO first SELECT g, 'quiet', 0 FROM generate_series(1000, 1004) g")  # the writer's keys are < 200
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "checkpoint")
    delivered: dict[int, list[tuple[str, str, int, str, str | None]]] = {}
    fail_in: list[str] = []

    def batch(df: Any, batch_id: int) -> None:
        changes = df.toArrow()
        rows = list(zip(*(changes.column(c).to_pylist() for c in ("_table", "_key", "_seq", "_op", "_row")), strict=True))
        if fail_in and any(t == fail_in[0] and op == "snapshot" for t, _, _, op, _ in rows):
            fail_in.clear()
            raise RuntimeError("the driver fails in the middle of the added table's snapshot")
        RoutingDeltaSink(lake, engine="delta-rs").write(changes, batch_id, "q")
        delivered[batch_id] = rows  # a replay replaces what its first attempt delivered

    def run(tables: str) -> None:
        reader = (spark.readStream.format("cdc").option("backend", "postgres").option("dsn", postgres_dsn)
                  .option("tables", tables).option("layout", "json").option("startingOffsets", "snapshot")
                  .option("snapshot.path", str(tmp_path / "snapshots")).option("snapshot.chunkRows", "20")
                  .option("snapshot.chunksPerBatch", "2").option("snapshot.cutTimeout", "2").load())
        reader.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint).trigger(
            availableNow=True).start().awaitTermination()

    writer = Writer(postgres_dsn)
    writer.start()
    try:
        run("first")
        assert not any(r[0] == "public.second" for b in delivered.values() for r in b)
        for i in range(5):  # while the query is down: changes it must deliver exactly once
            conn.execute("UPDATE first SET v = %s WHERE id = %s", (f"down {i}", 1000 + i))
        time.sleep(0.3)
        fail_in.append("public.second")
        with pytest.raises(Exception, match="in the middle of the added table's snapshot"):
            run("first,second")
        assert not fail_in, "the added table's snapshot never began"
        run("first,second")  # the failed batch again, at a new cut, then the rest
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.done > 50
    run("first,second")  # everything up to the writer's last change
    for t in _TABLES:
        assert _delta(f"{lake}/public.{t}") == _source(postgres_dsn, t), t
    records = [r for b in delivered.values() for r in b]
    seen = [(t, k, seq) for t, k, seq, _, _ in records]
    assert len(seen) == len(set(seen)), "a record was delivered twice"
    downs = [json.loads(row)["v"] for t, _, _, _, row in records if t == "public.first" and row]
    assert sorted(v for v in downs if v.startswith("down")) == [f"down {i}" for i in range(5)]
    second = [(seq, op) for t, _, seq, op, _ in records if t == "public.second"]
    start = _added_at(Path(checkpoint), "public.second")
    # Its rows carry the cut's _seq or a later cut's, its changes come after the cut.
    assert second and all(seq > start or (op == "snapshot" and seq == start) for seq, op in second), \
        "a change before the added table's cut came"
    assert any(op != "snapshot" for _, op in second), "the added table did not stream after its snapshot"
    conn.close()


def _added_at(checkpoint: Path, table: str) -> int:
    """The ``_seq`` of the cut the added table's snapshot started at, as the query's offset log holds it."""
    for f in sorted((checkpoint / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if f.name.isdigit():
            offset = json.loads(f.read_text().splitlines()[2])
            for entry in offset.get("snapshot", {}).get("tables", {}).get(table, {}).get("late", []):
                if entry.get("all"):
                    return int(entry["seq"])
    raise AssertionError(f"no offset starts the snapshot of {table}")


def _query(dsn: str, tables: str, path: str | None = None, **options: str) -> Any:
    extra = {} if path is None else {"snapshot.path": path}
    return open_backend("postgres", {"dsn": dsn, "tables": tables, "layout": "json", **extra, **options})


def test_an_added_table_already_published_delivers_no_change_before_its_cut(postgres_dsn: str, tmp_path: Path) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 30)
    conn.execute("CREATE PUBLICATION shop FOR TABLE first, second")  # the user's: it carries both from the start
    names = {"publication.name": "shop", "slot.name": "shop", "snapshot.chunkRows": "10"}
    path = str(tmp_path / "snapshots")
    try:
        start = Planner(_query(postgres_dsn, "first", path, **names)).initial("latest")
        conn.execute("INSERT INTO second VALUES (5000, 'gone before the cut', 0)")  # above its last key at the cut
        conn.execute("DELETE FROM second WHERE id = 5000")
        conn.execute("UPDATE second SET n = 7 WHERE id < 5")
        conn.execute("UPDATE first SET n = 7 WHERE id < 5")
        both = _query(postgres_dsn, "first,second", path, **names)
        got = list(batches(both, start))
        conn.execute("INSERT INTO second VALUES (6000, 'after', 0)")
        got += list(batches(both, got[-1][0]))
        records = [r for _, b in got for r in b.select(["_table", "_key", "_op", "_row"]).to_pylist()]
        second = [r for r in records if r["_table"] == "public.second"]
        assert {json.loads(r["_key"])["id"] for r in second if r["_op"] != "snapshot"} == {6000}
        rows = {json.loads(r["_key"])["id"]: json.loads(r["_row"])["n"] for r in second if r["_op"] == "snapshot"}
        assert rows == {k: 7 if k < 5 else 0 for k in range(30)}
        assert sum(1 for r in records if r["_table"] == "public.first") == 5
    finally:
        connection.drop_slot(conn, "shop")
        conn.close()


def test_removed_table_stops_and_bad_additions_name_the_table_and_the_fix(postgres_dsn: str, tmp_path: Path) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 3)
    conn.execute("CREATE TABLE keyless (id bigint, v text)")
    path = str(tmp_path / "snapshots")
    both = _query(postgres_dsn, "first,second", path=path)
    start = Planner(both).initial("latest")
    slot = both.slot  # type: ignore[attr-defined]
    try:
        conn.execute("UPDATE first SET n = 1")
        conn.execute("UPDATE second SET n = 1")
        # Restarted with one table: the other's changes are no longer delivered, and no error.
        got = list(batches(_query(postgres_dsn, "first", path=path), start))
        tables = {t for _, b in got for t in b.column("_table").to_pylist()}
        assert tables == {"public.first"}
        assert got[-1][0]["source"]["tables"] == ["public.first"] and got[-1][0]["source"]["slot"] == slot
        with pytest.raises(OptionError, match="table 'public.missing' does not exist"):
            _query(postgres_dsn, "first,missing", path=path)
        with pytest.raises(NoPrimaryKeyError, match="keyless"):
            _query(postgres_dsn, "first,keyless", path=path)
        # A publication the user names must carry an added table already: the error says how.
        conn.execute("CREATE PUBLICATION mine FOR TABLE first, second")
        mine = _query(postgres_dsn, "first", path=path, **{"publication.name": "mine", "slot.name": "mine"})
        offset = Planner(mine).initial("latest")
        conn.execute("ALTER PUBLICATION mine DROP TABLE second")
        added = _query(postgres_dsn, "first,second", path=path, **{"publication.name": "mine", "slot.name": "mine"})
        with pytest.raises(OptionError, match=r"ALTER PUBLICATION mine ADD TABLE public.second"):
            Planner(added).next(offset)
        # The typed layout cannot take a second table: a new query in the many-table layout can.
        typed = open_backend("postgres", {"dsn": postgres_dsn, "tables": "first", "slot.name": "typed"})
        offset = Planner(typed).initial("latest")
        with pytest.raises(OptionError, match="option layout=json"):
            Planner(_query(postgres_dsn, "first,second", path=path, **{"slot.name": "typed"})).next(offset)
        # snapshot.path is needed for the added table's chunks.
        with pytest.raises(OptionError, match="'snapshot.path' is required to add tables"):
            Planner(_query(postgres_dsn, "first,second", **{"slot.name": "mine", "publication.name": "mine"})).next(
                Planner(mine).initial("latest"))
    finally:
        for name in (slot, "mine", "typed"):
            connection.drop_slot(conn, name)
        conn.close()
