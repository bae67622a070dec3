"""Chunked snapshots under the faults and inputs that test the design: a transaction committed in the WAL but not
yet visible (synchronous replication to an absent standby), a write transaction that holds cuts back, the WAL
the slot retains while a large table is read with a writer running, and bad input."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc.backend import open_backend
from cdc.backends.postgres import connection
from cdc.backends.postgres.errors import NoPrimaryKeyError, ReplicationCapacityError
from cdc.errors import OptionError
from cdc.offsets import Offset
from cdc.planner import Planner, positions
from cdc.testing.contract import fold
from cdc.testing.harness import read_batch


def _options(dsn: str, tmp_path: Path, slot: str, **more: str) -> dict[str, str]:
    return {"dsn": dsn, "tables": "items", "slot.name": slot, "snapshot.path": str(tmp_path / "snap"), **more}


def _items(dsn: str, rows: int) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text, n int)")
    conn.execute("INSERT INTO items SELECT g, 'v' || g, 0 FROM generate_series(1, %s) g", (rows,))
    return conn


def _table(conn: psycopg.Connection[Any]) -> dict[Any, dict[str, Any]]:
    return {(r[0],): {"id": r[0], "v": r[1], "n": r[2]} for r in conn.execute("SELECT id, v, n FROM items")}


def _drain(backend: Any, planner: Planner, start: dict[str, Any], out: list[Any]) -> dict[str, Any]:
    for _ in range(500):
        end = planner.next(start)
        if end == start:
            state = Offset.from_json(end).snapshot
            if state is None or not state.pending:
                return end
            continue
        out.append(read_batch(backend, start, end))
        backend.acknowledge(positions(end))
        start = end
    raise AssertionError("never finished")


def test_a_commit_not_yet_visible_holds_the_cut_back_and_changes_flow_meanwhile(postgres_dsn: str,
                                                                                  tmp_path: Path) -> None:
    # With synchronous replication to a standby that never answers, a commit is written to the WAL, then waits,
    # invisible to every other snapshot. A chunk read at "an LSN taken before its query" would miss it while
    # the change log counts it as before that LSN. A cut's exported snapshot is built from the WAL itself, and
    # PostgreSQL creates it only once every transaction committed before its point is visible: the cut waits
    # (past snapshot.cutTimeout the batch delivers changes only), and the chunk read later includes the commit.
    admin = _items(postgres_dsn, 40)
    backend = open_backend("postgres", _options(postgres_dsn, tmp_path, "invisible", **{
        "snapshot.chunkRows": "10", "snapshot.chunksPerBatch": "1", "snapshot.cutTimeout": "1"}))
    planner = Planner(backend)
    stuck = psycopg.connect(postgres_dsn, autocommit=True)
    pid = stuck.info.backend_pid
    try:
        start = planner.initial("snapshot")
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'absent_standby'")
        admin.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        writer = threading.Thread(target=lambda: stuck.execute("UPDATE items SET n = 999 WHERE id IN (5, 35)"))
        writer.start()
        for _ in range(100):
            waiting = admin.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if waiting and waiting[0] == "SyncRep":
                break
            time.sleep(0.1)
        else:
            pytest.fail("the writer never waited for the standby")
        # Forced: the commit is in the flushed WAL, yet a snapshot taken now does not see it.
        flushed = connection.flush_lsn(admin)
        assert admin.execute("SELECT n FROM items WHERE id = 5").fetchone() == (0,)
        began = time.monotonic()
        end = planner.next(start)
        assert time.monotonic() - began >= 1.0
        assert Offset.from_json(end).snapshot.cut is None  # type: ignore[union-attr]  # no cut: changes only
        assert Offset.from_json(end).positions()["changes"] >> 20 <= flushed
        delivered = [read_batch(backend, start, end)]
        admin.execute("SELECT pg_cancel_backend(%s)", (pid,))  # the commit stands, locally: now it is visible
        writer.join(30)
        assert not writer.is_alive()
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        admin.execute("SELECT pg_reload_conf()")
        assert admin.execute("SELECT n FROM items WHERE id = 5").fetchone() == (999,)
        _drain(backend, planner, end, delivered)
        assert fold(delivered, ["id"]) == _table(admin)
    finally:
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        admin.execute("SELECT pg_reload_conf()")
        backend.close()
        stuck.close()
        connection.drop_slot(admin, "invisible")
        admin.close()


def test_a_long_write_transaction_delays_cuts_not_changes_and_a_key_change_waits_for_a_cut(
    postgres_dsn: str, tmp_path: Path
) -> None:
    admin = _items(postgres_dsn, 30)
    backend = open_backend("postgres", _options(postgres_dsn, tmp_path, "long_txn", **{
        "snapshot.chunkRows": "10", "snapshot.chunksPerBatch": "1", "snapshot.cutTimeout": "0.5"}))
    planner = Planner(backend)
    long = psycopg.connect(postgres_dsn)
    try:
        start = planner.initial("snapshot")
        long.execute("INSERT INTO items VALUES (1000, 'open', 0)")  # a write transaction left open: cuts wait
        admin.execute("UPDATE items SET n = 1 WHERE id = 3")
        admin.execute("INSERT INTO items VALUES (500, 'new', 0)")
        admin.execute("UPDATE items SET id = 600 WHERE id = 25")  # a key change: only deliverable at a cut
        admin.execute("UPDATE items SET n = 2 WHERE id = 4")
        end = planner.next(start)
        state = Offset.from_json(end).snapshot
        assert state is not None and state.cut is None  # changes only
        got = read_batch(backend, start, end)
        assert got.column("id").to_pylist() == [500]  # 3 is held back (its chunk is to come); the rest waits
        assert planner.next(end) == end  # the key change stays behind while no cut can be taken
        long.commit()
        delivered = [got]
        _drain(backend, planner, end, delivered)
        assert fold(delivered, ["id"]) == _table(admin)
    finally:
        long.close()
        backend.close()
        connection.drop_slot(admin, "long_txn")
        admin.close()


def test_the_wal_retained_during_a_large_snapshot_stays_bounded(postgres_dsn: str, tmp_path: Path) -> None:
    # One million rows read in chunks of 100k, a writer running throughout, every batch committed (the slot is
    # acknowledged as Spark commits): what the slot retains is the WAL of the batches in flight, not of the
    # whole snapshot, whatever the table's size.
    admin = _items(postgres_dsn, 1_000_000)
    admin.execute("VACUUM ANALYZE items")
    backend = open_backend("postgres", _options(postgres_dsn, tmp_path, "retained", **{
        "snapshot.chunkRows": "100000", "snapshot.chunksPerBatch": "1"}))
    planner = Planner(backend)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("UPDATE items SET n = n + 1, v = repeat('w', 200) WHERE id = %s",
                             (written[0] * 7919 % 1_000_000 + 1,))
                written[0] += 1

    retained = []
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        start = planner.initial("snapshot")
        began = connection.flush_lsn(admin)
        rows = 0
        while Offset.from_json(start).snapshot is not None and Offset.from_json(start).snapshot.pending:  # type: ignore[union-attr]
            end = planner.next(start)
            if end == start:
                continue
            rows += read_batch(backend, start, end).num_rows
            backend.acknowledge(positions(end))
            start = end
            retained.append(int(admin.execute(
                "SELECT pg_current_wal_lsn() - restart_lsn FROM pg_replication_slots WHERE slot_name = 'retained'"
            ).fetchone()[0]))  # type: ignore[index]
        during = connection.flush_lsn(admin) - began
    finally:
        stop.set()
        thread.join()
        backend.close()
        connection.drop_slot(admin, "retained")
        admin.close()
    assert rows >= 1_000_000 and len(retained) >= 10 and written[0] > 100
    # Bounded by a batch's WAL: not growing with the snapshot, and far below the WAL written meanwhile (all of
    # which an exported snapshot's slot would retain until its last chunk is delivered).
    print(f"retained after each batch (MB): {[round(r / 2**20, 2) for r in retained]}; WAL written during the "
          f"snapshot {during / 2**20:.1f} MB by {written[0]} writer updates")
    assert max(retained[-5:]) < 4 * max(retained[:5]) + (1 << 20), retained
    assert max(retained) < during / 3, (retained, during)


def test_bad_input_is_refused_naming_it(postgres_dsn: str, tmp_path: Path) -> None:
    admin = _items(postgres_dsn, 5)
    for value in ("0", "10000001"):
        with pytest.raises(OptionError, match="snapshot.chunkRows"):
            open_backend("postgres", _options(postgres_dsn, tmp_path, "bad", **{"snapshot.chunkRows": value}))
    with pytest.raises(OptionError, match="snapshot.mode"):
        open_backend("postgres", _options(postgres_dsn, tmp_path, "bad", **{"snapshot.mode": "copy"}))
    with pytest.raises(OptionError, match="snapshot.path"):
        open_backend("postgres", {"dsn": postgres_dsn, "tables": "items"}).chunked_snapshot()
    # A table without a primary key: refused by name (its changes could not be keyed, nor its rows chunked).
    admin.execute("CREATE TABLE loose (k text, v int)")
    with pytest.raises(NoPrimaryKeyError, match="'public.loose' has no primary key"):
        open_backend("postgres", {**_options(postgres_dsn, tmp_path, "bad"), "tables": "loose"})
    # No replication slot to spare for the cuts: refused before anything is created, naming the setting.
    slots = int(admin.execute("SELECT current_setting('max_replication_slots')::int - "
                              "(SELECT count(*) FROM pg_replication_slots)").fetchone()[0])  # type: ignore[index]
    names = [f"filler_{i}" for i in range(slots - 1)]
    for name in names:
        admin.execute("SELECT pg_create_physical_replication_slot(%s)", (name,))
    try:
        backend = open_backend("postgres", _options(postgres_dsn, tmp_path, "short"))
        with pytest.raises(ReplicationCapacityError, match=r"max_replication_slots = \d+ with \d+ in use \(needs 2 more\)"):
            Planner(backend).initial("snapshot")
        backend.close()
        assert connection.state(admin, "short") is None
    finally:
        for name in names:
            admin.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        admin.close()


def test_a_key_change_out_of_a_chunk_read_late_is_completed_at_a_cut(postgres_dsn: str, tmp_path: Path) -> None:
    # A replayed batch whose cut was gone reads its (last) chunk at a later cut. A key change committed between
    # the two cuts moves a row out of that chunk to a key above the table's largest (never held), leaving its
    # TOASTed column unchanged: the next batch, which has no chunk left, must read the new key's row at a cut
    # of its own (the old key's changes up to the later cut are held back: the re-read chunk includes them).
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text, n int)")
    conn.execute("ALTER TABLE items ALTER COLUMN v SET STORAGE EXTERNAL")  # out of line, not compressed
    conn.execute("INSERT INTO items SELECT g, repeat('x', 9000) || g, 0 FROM generate_series(1, 20) g")
    options = _options(postgres_dsn, tmp_path, "late_rekey", **{"snapshot.chunkRows": "20"})
    backend = open_backend("postgres", options)
    planner = Planner(backend)
    start = planner.initial("snapshot")
    end = planner.next(start)
    assert Offset.from_json(end).snapshot.chunks()  # type: ignore[union-attr]
    backend.close()  # the driver dies after logging the batch, before any read of it
    conn.execute("UPDATE items SET id = 100, n = 1 WHERE id = 5")  # v is left unchanged (TOASTed)
    replay = open_backend("postgres", options)
    try:
        out = [read_batch(replay, start, end)]  # at a later cut, which includes the key change
        replay.acknowledge(positions(end))
        _drain(replay, Planner(replay), end, out)
        assert fold(out, ["id"]) == _table(conn)
    finally:
        replay.close()
        conn.close()


def test_chunks_are_bounded_on_skewed_keys_and_found_by_index_scans(postgres_dsn: str) -> None:
    # Keys crowded at both ends of a wide domain (what splitting a key range by its min and max gets wrong):
    # every chunk holds exactly snapshot.chunkRows rows but the last (never over twice the size), its bounds
    # are found by index scans (no sequential scan of the table, whatever its size), nothing past the largest
    # key taken at the start is chunked (rows inserted at the tail meanwhile arrive as changes).
    from cdc.backends.postgres import keys
    from cdc.backends.postgres.catalog import describe

    for kind in ("bigint", "text", "uuid", "composite"):
        columns, values = {
            "bigint": ("k bigint PRIMARY KEY", "CASE WHEN g % 10 = 0 THEN 1000000000000 + g ELSE g END"),
            "text": ("k text PRIMARY KEY",
                     "CASE WHEN g % 10 = 0 THEN 'zz' || repeat('q''\\', 20) || g ELSE 'a' || lpad(g::text, 6, '0') END"),
            "uuid": ("k uuid PRIMARY KEY",
                     "CASE WHEN g % 10 = 0 THEN ('ffffffff-ffff-ffff-ffff-' || lpad(to_hex(g), 12, '0'))::uuid "
                     "ELSE ('00000000-0000-0000-0000-' || lpad(to_hex(g), 12, '0'))::uuid END"),
            "composite": ("a int, b text, PRIMARY KEY (a, b)", "CASE WHEN g % 10 = 0 THEN 2 ELSE 1 END, g::text"),
        }[kind]
        table = f"skewed_{kind}"
        chunk_rows, total = 1000, 20_000
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} ({columns}, v int)".encode())
            conn.execute(f"INSERT INTO {table} SELECT {values}, g FROM generate_series(1, {total}) g".encode())
            conn.execute(f"ANALYZE {table}".encode())
            info = describe(conn, f"public.{table}")
            cols = keys.key_columns(conn, info)
            counters = "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = %s"
            with conn.transaction():  # the counters of this backend's transaction, and what it has not reported yet
                before = conn.execute(counters, (table,)).fetchone()
                last = keys.last_key(conn, info, cols)
                assert last is not None and before is not None
                bounds = keys.next_bounds(conn, info, cols, None, last, chunk_rows, 10_000)
                after_scans = conn.execute(counters, (table,)).fetchone()
            assert after_scans is not None and after_scans[0] == before[0], (before, after_scans)
            assert after_scans[1] - before[1] >= len(bounds), (before, after_scans)
            if kind == "bigint":  # rows at the tail after the start: beyond the planned maximum key
                conn.execute(f"INSERT INTO {table} SELECT 2000000000000 + g, 0 FROM generate_series(1, 5000) g".encode())
            sizes, after = [], None
            for upto in bounds:
                cond, params = keys.range_condition(cols, after, upto)
                query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(sql.Identifier(table), cond)
                sizes.append(conn.execute(query, params).fetchone()[0])  # type: ignore[index]
                after = upto
        assert bounds[-1] == last and sum(sizes) == total, (sizes, bounds[-1], last)
        assert all(s == chunk_rows for s in sizes[:-1]) and 0 < sizes[-1] <= chunk_rows, sizes
