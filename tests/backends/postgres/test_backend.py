"""backend=postgres against a real PostgreSQL: options, tables, types, TOAST, transactions and budgets,
data loss, the snapshot hand-off, many tables, a server kill -9."""

from __future__ import annotations

import datetime as dt
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from cdc.backend import open_backend
from cdc.backends.postgres import connection
from cdc.backends.postgres.errors import NoPrimaryKeyError
from cdc.errors import DataLossError, MalformedRecordError, OptionError, SchemaChangedError
from cdc.planner import Planner
from cdc.testing import batches, drain, read_range
from tests.backends.postgres.fold import fold_json, fold_typed
from tests.backends.postgres.harness import PostgresHarness


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query.encode()).fetchall()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"tables": "t"}, "option 'dsn' is required"),
        ({"dsn": "postgresql://x/y"}, "option 'tables' is required"),
        ({"dsn": "postgresql://x/y", "tables": "a.b.c"}, "option 'tables'"),
        ({"dsn": "postgresql://x/y", "tables": "t", "slot.name": "Bad-Name"}, "option 'slot.name'"),
        ({"dsn": "postgresql://x/y", "tables": "t", "slotname": "s"}, "did you mean 'slot.name'"),
    ],
)
def test_bad_options_name_the_option(raw: dict[str, str], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        open_backend("postgres", raw)


def test_password_never_in_errors(postgres_dsn: str) -> None:
    with pytest.raises(OptionError) as info:
        open_backend("postgres", {"dsn": postgres_dsn.replace("cdc@", "cdc:s3cret@"), "tables": "t", "x": "1"})
    assert "s3cret" not in str(info.value)


def test_table_without_primary_key_is_refused_by_name(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE keyed (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE loose (id int, v text)")
    with pytest.raises(NoPrimaryKeyError, match="'public.loose' has no primary key") as info:
        open_backend("postgres", {"dsn": postgres_dsn, "tables": "keyed,loose"})
    assert info.value.table == "public.loose"
    with pytest.raises(OptionError, match="'public.missing' does not exist"):
        open_backend("postgres", {"dsn": postgres_dsn, "tables": "missing"})


def test_typed_columns_and_key_changes(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE typed (a int, b text, i2 smallint, i8 bigint, f4 real, f8 float8, ok bool, "
            "amount numeric(10,2), big numeric, day date, at timestamptz, naive timestamp, raw bytea, "
            "u uuid, doc jsonb, PRIMARY KEY (b, a))"
        )
    h = PostgresHarness(postgres_dsn, tables=("typed",), create=False)
    try:
        h.execute(
            "INSERT INTO typed VALUES (1, 'x', 2, 3, 1.5, 2.25, true, 12.34, 1e40, '2024-02-29', "
            "'2024-01-02 03:04:05.5+02', '2024-01-02 03:04:05', '\\x0102', "
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": 1}')"
        )
        h.execute("UPDATE typed SET a = 2 WHERE a = 1")  # a key change: delete of (x, 1), insert of (x, 2)
        backend = h.backend()
        schema = backend.schema()
        assert [f.name for f in schema][5:10] == ["_unchanged", "_old_key", "a", "b", "i2"]
        assert schema.field("_old_key").type == pa.struct([pa.field("b", pa.string()), pa.field("a", pa.int32())])
        assert str(schema.field("amount").type) == "decimal128(10, 2)" and str(schema.field("big").type) == "string"
        # Planning counts in SQL from the messages' first bytes: the key change counts as two records.
        assert backend.plan("changes", backend.earliest("changes")).records == 3
        rows = [r for t in drain(backend) for r in t.to_pylist()]
        assert [(r["_op"], r["a"]) for r in rows] == [("insert", 1), ("delete", 1), ("insert", 2)]
        first = rows[0]
        assert first["amount"] == Decimal("12.34") and first["big"].startswith("1000000")
        assert first["at"] == dt.datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=dt.UTC)
        assert first["naive"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
        assert first["day"] == dt.date(2024, 2, 29) and first["raw"] == b"\x01\x02" and first["ok"] is True
        assert first["doc"] == '{"k": 1}' and first["f4"] == 1.5 and first["i8"] == 3
        assert rows[1]["b"] == "x" and rows[1]["i2"] is None  # a delete carries the key only
        # The insert half names the key it replaces, in the primary key's order (b, a)
        assert [r["_old_key"] for r in rows] == [None, None, {"b": "x", "a": 1}]
        assert [r["_seq"] for r in rows] == sorted(r["_seq"] for r in rows)
    finally:
        h.close()


def test_unchanged_toasted_column_is_named_not_nulled(postgres_dsn: str) -> None:
    """REPLICA IDENTITY DEFAULT: an update's unchanged TOASTed column is named in _unchanged (null, never a
    made-up value), on a key change too (whose insert names the old key); FULL: the logged old row completes
    both, so every record is a whole row."""
    h = PostgresHarness(postgres_dsn)
    try:
        big = "".join(chr(65 + (i * 7919) % 26) for i in range(200_000))  # incompressible enough to be TOASTed
        h.execute("INSERT INTO items VALUES (1, %s, 0)", (big,))
        h.execute("UPDATE items SET n = 5 WHERE id = 1")
        h.execute("UPDATE items SET id = 2 WHERE id = 1")
        rows = [r for t in drain(h.backend()) for r in t.to_pylist()]
        assert [r["_op"] for r in rows] == ["insert", "update", "delete", "insert"]
        assert rows[1]["_unchanged"] == ["v"] and rows[1]["v"] is None and rows[1]["n"] == 5
        assert rows[0]["_unchanged"] is None and rows[0]["v"] == big
        assert [r["_old_key"] for r in rows] == [None, None, None, {"id": 1}]
        assert rows[3]["_unchanged"] == ["v"] and rows[3]["v"] is None and rows[3]["n"] == 5
        assert fold_typed([t for t in drain(h.backend())], ("id",)) == {(2,): {"id": 2, "v": big, "n": 5}}
        h.execute("ALTER TABLE items REPLICA IDENTITY FULL")
        h.execute("UPDATE items SET n = 6 WHERE id = 2")
        h.execute("UPDATE items SET id = 3 WHERE id = 2")
        rows = [r for t in drain(h.backend()) for r in t.to_pylist()][4:]
        assert [(r["_op"], r["id"], r["v"] == big, r["_unchanged"], r["_old_key"]) for r in rows] == [
            ("update", 2, True, None, None), ("delete", 2, False, None, None), ("insert", 3, True, None, {"id": 2})]
    finally:
        h.close()


def test_a_transaction_is_never_split_and_a_large_one_is_taken_whole(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        h.txn_size = 4
        h.append(12)  # three transactions of four
        h.txn_size = 30
        h.append(30)
        backend = h.backend()
        sizes = [t.num_rows for t in drain(backend, limit=6)]
        assert sizes == [4, 4, 4, 30]
        ends = [end["channels"]["changes"]["pos"] if isinstance(end.get("channels"), dict) else None
                for end, _ in batches(backend, limit=6)]
        assert all(e is not None and e & 0xFFFFF == 0 for e in ends)  # every end lies between transactions
    finally:
        h.close()


def test_schema_change_stops_a_typed_query(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        h.append(2)
        backend = h.backend()
        h.execute("ALTER TABLE items ADD COLUMN extra int")
        h.execute("INSERT INTO items VALUES (100, 'x', 1, 7)")
        start = backend.earliest("changes")
        end = backend.plan("changes", start).end
        with pytest.raises(SchemaChangedError, match="restart the query"):
            read_range(backend, "changes", start, end)
        assert "extra" in h.backend().schema().names  # a restart reads the new schema
    finally:
        h.close()


def test_lost_slot_is_data_loss_and_failondataloss_false_skips(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        h.append(3)
        backend = h.backend()
        start = Planner(backend).initial("earliest")
        connection.drop_slot(h.conn, backend.slot)  # type: ignore[attr-defined]
        connection.ensure_slot(h.conn, backend.slot)  # type: ignore[attr-defined]
        h.append(2)
        with pytest.raises(DataLossError, match="past the needed position"):
            Planner(backend).next(start)
        end = Planner(backend, fail_on_data_loss=False).next(start)
        rows = sum(read_range(backend, r.channel, r.start, r.end).num_rows for r in Planner.ranges(start, end))
        assert rows == 2
    finally:
        h.close()


def test_many_tables_carry_table_key_and_row_as_json(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn, tables=("orders", "customers"))
    try:
        h.execute("INSERT INTO orders VALUES (1, 'o', 1)")
        h.execute("INSERT INTO customers VALUES (1, 'c', 2)")
        h.execute("ALTER TABLE customers ADD COLUMN city text")
        h.execute("INSERT INTO customers VALUES (2, 'd', 3, 'Oslo')")
        h.execute("DELETE FROM orders WHERE id = 1")
        tables = list(drain(h.backend()))
        rows = [r for t in tables for r in t.to_pylist()]
        assert [(r["_table"], r["_op"]) for r in rows] == [
            ("public.orders", "insert"), ("public.customers", "insert"), ("public.customers", "insert"),
            ("public.orders", "delete")]
        assert rows[0]["_key"] == '{"id":1}'
        assert fold_json(tables) == {
            ("public.customers", '{"id":1}'): {"id": 1, "v": "c", "n": 2},
            ("public.customers", '{"id":2}'): {"id": 2, "v": "d", "n": 3, "city": "Oslo"},  # the added column
        }
    finally:
        h.close()


def test_snapshot_hand_off_is_exact_under_concurrent_writes(postgres_dsn: str, tmp_path: Path) -> None:
    h = PostgresHarness(postgres_dsn, **{"snapshot.path": str(tmp_path / "snap"), "snapshot.chunkRows": "500",
                                         "slot.name": "snap_exact", "snapshot.mode": "exported"})
    try:
        h.execute("INSERT INTO items SELECT g, 'v' || g, 0 FROM generate_series(1, 3000) g")
        h.execute("ANALYZE items")  # chunks are sized from the catalog's row estimate
        stop = threading.Event()

        def writer() -> None:
            with psycopg.connect(postgres_dsn, autocommit=True) as conn:
                i = 0
                while not stop.is_set():
                    i += 1
                    conn.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i % 3000 + 1,))
                    conn.execute("INSERT INTO items VALUES (%s, 'w', 0)", (10_000 + i,))
                    conn.execute("DELETE FROM items WHERE id = %s", (i * 7 % 3000 + 1,))

        connection.drop_slot(h.conn, "snap_exact")  # the harness made it: a snapshot starts with its own export
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            backend = h.backend()
            planner = Planner(backend)
            start = planner.initial("snapshot")
            chunks = [c for c in start["channels"] if c.startswith("snapshot:")]
            assert len(chunks) >= 3  # cut into several chunks, read in parallel
            got = []
            for end, table in batches(backend, start, limit=700):  # until the changes flow, writes going on
                got.append((end, table))
                if "snapshot" not in table.column("_op").to_pylist() and len(got) > 8:
                    break
        finally:
            stop.set()
            thread.join()
        got += list(batches(backend, got[-1][0]))
        tables = [t for _, t in got]
        ops = [op for t in tables for op in t.column("_op").to_pylist()]
        assert ops.index("snapshot") == 0 and "snapshot" not in ops[ops.count("snapshot"):]  # snapshot first
        snap_seq = max(s for t in tables for s, o in zip(t.column("_seq").to_pylist(), t.column("_op").to_pylist(),
                                                          strict=True) if o == "snapshot")
        change_seqs = [s for t in tables for s, o in zip(t.column("_seq").to_pylist(), t.column("_op").to_pylist(),
                                                         strict=True) if o != "snapshot"]
        assert change_seqs and min(change_seqs) > snap_seq  # no snapshot row can overwrite a newer change
        expected = {(r[0],): {"id": r[0], "v": r[1], "n": r[2]} for r in _rows(postgres_dsn, "SELECT * FROM items")}
        assert fold_typed(tables, ("id",)) == expected  # no gap, no duplicate
        again = open_backend("postgres", h.options)  # a restarted driver reuses the materialised snapshot
        assert again.snapshot().chunks == tuple(chunks)
    finally:
        h.close()


def test_postgres_kill_9_mid_stream_loses_and_duplicates_nothing(postgres_server: Any, postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        h.txn_size = 5
        h.append(20)
        backend = h.backend()
        planner = Planner(backend)
        start = planner.initial("earliest")
        end = planner.next(start, 10)
        first = [read_range(backend, r.channel, r.start, r.end) for r in planner.ranges(start, end)]
        postgres_server.kill()
        postgres_server.start()
        h.conn = psycopg.connect(postgres_dsn, autocommit=True)
        h.append(10)
        backend = h.backend()
        replay = [read_range(backend, r.channel, r.start, r.end) for r in Planner.ranges(start, end)]
        assert [t.equals(u) for t, u in zip(first, replay, strict=True)] == [True]
        backend.acknowledge({"changes": end["channels"]["changes"]["pos"]})
        rest = list(drain(backend, end))
        ids = [i for t in first + rest for i in t.column("id").to_pylist()]
        assert sorted(ids) == list(range(30))
    finally:
        h.close()


@pytest.mark.parametrize("mode", ["chunked", "exported"])
def test_snapshot_rows_are_typed_like_changes(postgres_dsn: str, tmp_path: Path, mode: str) -> None:
    # The snapshot reads typed tables through COPY ... (FORMAT csv) and Arrow's CSV parser; the same rows
    # read as changes go through pgoutput and psycopg's loaders: both must give the same values.
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kinds (id int PRIMARY KEY, s text, e text, ok bool, amount numeric(8,3), "
                     "big numeric, day date, at timestamptz, naive timestamp, f float8)")
    h = PostgresHarness(postgres_dsn, tables=("kinds",), create=False,
                        **{"snapshot.path": str(tmp_path / "snap"), "slot.name": "kinds_changes",
                           "snapshot.mode": mode})
    try:
        h.execute("INSERT INTO kinds VALUES (1, 'a,\"b\"\nc', '', true, -12.345, 12345678901234567890.5, "
                  "'2024-02-29', '2024-01-02 03:04:05.123456+02', '1999-12-31 23:59:59', 0.1), "
                  "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
                  "(3, 'NULL', 'N/A', false, 0, 'NaN', '2024-03-01', NULL, NULL, 'Infinity')")
        changes = [r for t in drain(h.backend()) for r in t.to_pylist()]
        snap = open_backend("postgres", {**h.options, "slot.name": "kinds_snap"})
        planner = Planner(snap)
        start = planner.initial("snapshot")
        rows = [r for _, t in batches(snap, start) for r in t.to_pylist()]
        connection.drop_slot(h.conn, "kinds_snap")
        strip = ("_op", "_seq", "_commit_ts", "_channel", "_position", "_unchanged")
        assert [r["_op"] for r in rows] == ["snapshot"] * 3
        assert [{k: v for k, v in r.items() if k not in strip} for r in rows] == [
            {k: v for k, v in r.items() if k not in strip} for r in changes]
        assert rows[0]["e"] == "" and rows[1]["e"] is None and rows[0]["s"] == 'a,"b"\nc'
        assert (rows[2]["s"], rows[2]["e"]) == ("NULL", "N/A")  # text, not the CSV reader's null markers
    finally:
        h.close()


@pytest.mark.parametrize(("kind", "value"), [("numeric(8,2)", "NaN"), ("timestamptz", "infinity"),
                                             ("timestamp", "-infinity"), ("date", "infinity")])
def test_a_snapshot_value_its_arrow_type_cannot_hold_fails_the_snapshot_naming_the_column(
    postgres_dsn: str, tmp_path: Path, kind: str, value: str
) -> None:
    # No decimal128 holds 'NaN', no Arrow timestamp or date holds 'infinity': the snapshot fails naming the
    # column, never a wrong value (the driver's binary values for infinity wrap around when moved to 1970).
    name = "odd_" + kind.split("(")[0]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v {kind}, pad text)")
        conn.execute(f"INSERT INTO {name} SELECT g, NULL, repeat('p', 200) FROM generate_series(1, 20000) g")
        conn.execute(f"INSERT INTO {name} VALUES (0, %s, 'x')", (value,))
    backend = open_backend("postgres", {"dsn": postgres_dsn, "tables": name, "slot.name": f"{name}_snap",
                                        "snapshot.path": str(tmp_path / "snap"), "snapshot.mode": "exported"})
    try:
        with pytest.raises(MalformedRecordError, match=f"column 'v' of table public.{name}"):
            backend.snapshot()
        assert not (tmp_path / "snap" / f"{name}_snap" / "manifest.json").exists()
    finally:
        backend.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            connection.drop_slot(conn, f"{name}_snap")


@pytest.mark.parametrize("mode", ["chunked", "exported"])
def test_a_fresh_snapshot_query_exports_one_snapshot(postgres_dsn: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Spark asks a new query's stream reader for its initial offset twice for the first batch (when it plans
    the batch's end, and when it runs the batch from its start): one snapshot all the same (one export in the
    exported mode, one start of the chunked snapshot), one slot, whichever of the two calls the backend answers."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from cdc.backends.postgres import backend as pg_backend
    from cdc.backends.postgres.snapshot import PostgresChunkedSnapshot
    from cdc.source import CdcStreamReader, _Config

    h = PostgresHarness(postgres_dsn, **{"snapshot.path": str(tmp_path / "snap"), "slot.name": "snap_once",
                                         "snapshot.mode": mode})
    try:
        connection.drop_slot(h.conn, "snap_once")  # the harness made it: a snapshot starts with its own export
        h.append(30)
        starts: list[Any] = []
        if mode == "exported":
            export = pg_backend.export_and_materialise
            monkeypatch.setattr(pg_backend, "export_and_materialise", lambda *a: starts.append(a) or export(*a))
            snapshot = pg_backend.PostgresBackend.snapshot
            monkeypatch.setattr(pg_backend.PostgresBackend, "snapshot",
                                lambda self: starts.append(1) or snapshot(self))
        else:
            begin = PostgresChunkedSnapshot.start
            monkeypatch.setattr(PostgresChunkedSnapshot, "start", lambda self: starts.append(1) or begin(self))
        config = _Config({**h.options, "backend": "postgres", "startingOffsets": "snapshot"})
        reader = CdcStreamReader(config, from_arrow_schema(h.backend().schema()))
        try:
            first = reader.initialOffset()
            assert reader.initialOffset() == first
        finally:
            reader.stop()
        assert len(starts) == (2 if mode == "exported" else 1)
        assert _rows(postgres_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'snap_once'") == [(1,)]
        assert [p.name for p in (tmp_path / "snap").iterdir()] == ["snap_once"]
    finally:
        h.close()


def test_chunk_reads_share_one_driver_database_and_leave_no_connection(postgres_dsn: str) -> None:
    # The ADBC driver's database object reads the server's type catalog when made (~25 ms): one per process,
    # shared by every chunk's connection, none of which outlives its read.
    from psycopg import sql

    from cdc.backends.postgres import catalog, chunks

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE shared_db (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO shared_db SELECT g, 'v' || g FROM generate_series(1, 10) g")
        info = catalog.describe(conn, "public.shared_db")
        # Sessions by process id: another test's session may still be ending (a count would catch it leaving).
        sessions = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        open_before = {pid for (pid,) in conn.execute(sessions).fetchall()}
        reads = [chunks.read_arrow(postgres_dsn, None, info, sql.SQL("id <= 5"), (), info.arrow_schema())]
        made = chunks._DATABASES[postgres_dsn]
        reads += [chunks.read_arrow(postgres_dsn, None, info, sql.SQL("id <= 5"), (), info.arrow_schema())
                  for _ in range(2)]
        # A closed connection's server process ends a moment after the client closed it: wait for that, so
        # only a session still open (a read that left its connection behind) fails.
        deadline = time.monotonic() + 10
        while (left := {pid for (pid,) in conn.execute(sessions).fetchall()} - open_before) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [r.num_rows for r in reads] == [5, 5, 5]
    assert left == set()  # no read left a session behind
    assert chunks._DATABASES[postgres_dsn] is made  # made once
