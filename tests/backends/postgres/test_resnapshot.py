"""Re-snapshotting a table of a running query on a signal (``cdc postgres resnapshot``), against the session's
PostgreSQL: the table is read again in chunks while its changes and the other tables' keep streaming; the
signal's place in the WAL makes a re-planned batch decide the same; a restarted driver resumes the re-snapshot;
signals for other queries or tables are ignored; the command refuses a table that cannot be read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner

from cdc.backend import open_backend
from cdc.backends.postgres import connection, signals
from cdc.backends.postgres.cli import cli
from cdc.planner import Planner
from cdc.snapshots.state import SnapshotState
from cdc.testing import batches
from cdc.testing.harness import read_batch

_TABLES = ("first", "second")


def _create(conn: psycopg.Connection[Any], rows: int) -> None:
    for t in _TABLES:
        conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text, n int)".encode())
        conn.execute(f"INSERT INTO {t} SELECT g, 'v' || g, 0 FROM generate_series(0, %s - 1) g".encode(), (rows,))


def _query(dsn: str, path: Path, **options: str) -> Any:
    return open_backend("postgres", {"dsn": dsn, "tables": "first,second", "layout": "json", "slot.name": "rs",
                                     "snapshot.path": str(path), "snapshot.chunkRows": "10",
                                     "snapshot.chunksPerBatch": "2", **options})


def _records(got: list[tuple[dict[str, Any], Any]]) -> list[dict[str, Any]]:
    return [r for _, b in got for r in b.select(["_table", "_key", "_op", "_seq", "_row"]).to_pylist()]


def _state(offset: dict[str, Any]) -> SnapshotState | None:
    return SnapshotState.from_json(offset["snapshot"]) if "snapshot" in offset else None


def test_a_signalled_table_is_read_again_in_chunks_while_every_change_streams(postgres_dsn: str, tmp_path: Path) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 45)
    query = _query(postgres_dsn, tmp_path / "snapshots")
    try:
        start = Planner(query).initial("latest")
        conn.execute("UPDATE first SET n = 1 WHERE id < 3")  # before the signal: delivered as changes
        conn.execute("DELETE FROM first WHERE id = 40")
        runner = CliRunner()
        out = runner.invoke(cli, ["resnapshot", "--dsn", postgres_dsn, "--table", "first"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["resnapshot"] == "public.first"
        conn.execute("DELETE FROM first WHERE id = 41")  # after the signal, before the cut: a delete is never held
        conn.execute("UPDATE second SET n = 2 WHERE id < 4")
        planner = Planner(query)
        first_end = planner.next(start)
        again = Planner(_query(postgres_dsn, tmp_path / "snapshots")).next(start)  # the driver planned it again
        for end in (first_end, again):
            state = _state(end)
            assert state is not None and list(state.tables) == ["public.first"]
            cursor = state.tables["public.first"]
            assert state.cut is not None and cursor.refresh == state.cut.seq and not cursor.late
        got = [(first_end, read_batch(query, start, first_end))]
        got += list(batches(query, first_end))
        records = _records(got)
        first = [r for r in records if r["_table"] == "public.first"]
        changes = [(json.loads(r["_key"])["id"], r["_op"]) for r in first if r["_op"] not in ("snapshot", "refresh")]
        assert changes == [(0, "update"), (1, "update"), (2, "update"), (40, "delete"), (41, "delete")]
        snapshot = sorted(json.loads(r["_key"])["id"] for r in first if r["_op"] == "snapshot")
        assert snapshot == [k for k in range(45) if k not in (40, 41)]
        cut = _state(first_end).tables["public.first"].refresh  # type: ignore[union-attr]
        assert all(r["_seq"] >= cut for r in first if r["_op"] == "snapshot")
        # One refresh record, after the last chunk's rows, in that chunk's batch, carrying the first cut's _seq.
        assert [(r["_op"], r["_seq"], r["_row"]) for r in first[-1:]] == [("refresh", cut, None)]
        assert sum(1 for r in first if r["_op"] == "refresh") == 1
        assert json.loads(first[-1]["_key"]) == {"id": None}
        assert sum(1 for r in records if r["_table"] == "public.second") == 4
        # Finished: every table read and nothing held back (the state leaves the offset with the next batch
        # that reads something: no batch of its own).
        last = _state(got[-1][0])
        assert last is None or all(t.done and not t.late for t in last.tables.values()), "the re-snapshot never finished"
        assert sum(1 for end, _ in got if _state(end) is not None and _state(end).chunks()) == 3  # type: ignore[union-attr]
        # Nothing more: the signal lies before the query's position now.
        assert list(batches(query, got[-1][0])) == []
    finally:
        query.close()
        connection.drop_slot(conn, "rs")
        conn.close()


def test_a_restarted_driver_resumes_the_resnapshot_and_stray_signals_are_ignored(
    postgres_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 45)
    path = tmp_path / "snapshots"
    query = _query(postgres_dsn, path)
    try:
        start = Planner(query).initial("latest")
        signals.emit_resnapshot(conn, "public.second", slot="another query's slot")
        signals.emit_resnapshot(conn, "public.elsewhere")  # not a table of this query
        conn.execute("SELECT pg_logical_emit_message(true, 'cdc-tunnel', 'not json')")
        conn.execute("SELECT pg_logical_emit_message(true, 'another-tool', '{\"resnapshot\": \"public.first\"}')")
        conn.execute("UPDATE first SET n = 1 WHERE id = 0")
        got = list(batches(query, start))
        assert [r["_op"] for r in _records(got)] == ["update"], "a stray signal was taken"
        assert "not a table of this query" in caplog.text and "not a signal of this release" in caplog.text
        signals.emit_resnapshot(conn, "public.second", slot="rs")
        end = Planner(query).next(got[-1][0])
        read_batch(query, got[-1][0], end)
        query.close()  # the driver is killed after the first batch of the re-snapshot: a new one goes on
        conn.execute("DELETE FROM second WHERE id = 44")
        restarted = _query(postgres_dsn, path)
        rest = list(batches(restarted, end))
        rows = sorted(json.loads(r["_key"])["id"] for r in _records(rest) if r["_op"] == "snapshot")
        assert rows == list(range(20, 44)), "the restarted driver did not resume at the next chunk"
        assert [r["_op"] for r in _records(rest) if r["_op"] != "snapshot"] == ["delete", "refresh"]
        restarted.close()
    finally:
        connection.drop_slot(conn, "rs")
        conn.close()


def test_the_command_refuses_a_table_it_cannot_resnapshot(postgres_dsn: str) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    conn.execute("CREATE TABLE keyless (id bigint, v text)")
    conn.execute("CREATE TABLE keyed (id bigint PRIMARY KEY)")
    runner = CliRunner()
    missing = runner.invoke(cli, ["resnapshot", "--dsn", postgres_dsn, "--table", "public.missing"])
    assert missing.exit_code == 2 and "table 'public.missing' does not exist" in missing.output
    keyless = runner.invoke(cli, ["resnapshot", "--dsn", postgres_dsn, "--table", "keyless"])
    assert keyless.exit_code == 2 and "'public.keyless' has no primary key" in keyless.output
    slot = runner.invoke(cli, ["resnapshot", "--dsn", postgres_dsn, "--table", "keyed", "--slot", "nope"])
    assert slot.exit_code == 2 and "no replication slot 'nope'" in slot.output
    role = f"plain_{conn.info.dbname}"  # roles are the server's: one per test database
    conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'plain'".encode())
    conn.execute(f"GRANT SELECT ON keyed TO {role}".encode())
    plain = psycopg.conninfo.make_conninfo(postgres_dsn, user=role, password="plain")
    allowed = runner.invoke(cli, ["resnapshot", "--dsn", plain, "--table", "keyed"])  # PUBLIC may, by default
    assert allowed.exit_code == 0, allowed.output
    conn.execute("REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC")  # this database's
    refused = runner.invoke(cli, ["resnapshot", "--dsn", plain, "--table", "keyed"])
    assert refused.exit_code == 1 and "GRANT EXECUTE ON FUNCTION pg_logical_emit_message" in refused.output
    conn.close()


def test_a_resnapshot_makes_the_delta_tables_equal_to_the_source_while_a_writer_runs(
    spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    from deltalake import DeltaTable, write_deltalake

    from cdc.cli import main
    from sinks.routing import RoutingDeltaSink
    from tests.backends.postgres.test_added_tables import Writer

    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 60)
    conn.execute("INSERT INTO first SELECT g, 'quiet', 0 FROM generate_series(1000, 1009) g")  # the writer's are < 200
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "checkpoint")
    delivered: dict[int, list[tuple[str, str]]] = {}

    def batch(df: Any, batch_id: int) -> None:
        changes = df.toArrow()
        RoutingDeltaSink(lake, engine="delta-rs").write(changes, batch_id, "q")
        delivered[batch_id] = list(zip(changes.column("_table").to_pylist(), changes.column("_op").to_pylist(),
                                       strict=True))

    def run() -> None:
        reader = (spark.readStream.format("cdc").option("backend", "postgres").option("dsn", postgres_dsn)
                  .option("tables", "first,second").option("layout", "json").option("slot.name", "lake")
                  .option("startingOffsets", "snapshot").option("snapshot.path", str(tmp_path / "snapshots"))
                  .option("snapshot.chunkRows", "20").option("snapshot.chunksPerBatch", "2")
                  .option("snapshot.cutTimeout", "2").load())
        reader.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint).trigger(
            availableNow=True).start().awaitTermination()

    def tamper(path: str) -> None:
        """Rows deleted, a row changed and rows the source never had added, in the Delta table directly."""
        table = DeltaTable(path)
        table.delete("id >= 1002 AND id <= 1004")
        table.update(predicate="id = 1005", updates={"v": "'tampered'"})
        extra = DeltaTable(path).to_pyarrow_table().slice(0, 2)
        extra = extra.set_column(extra.schema.get_field_index("id"), "id", pa.array([7001, 7002], pa.int64()))
        write_deltalake(path, extra.cast(pa.schema(DeltaTable(path).schema().to_arrow())), mode="append")

    writer = Writer(postgres_dsn)
    writer.start()
    try:
        run()
        first = f"{lake}/public.first"
        tamper(first)
        before = len(delivered)
        signal = CliRunner().invoke(main, ["postgres", "resnapshot", "--dsn", postgres_dsn, "--table", "first",
                                           "--slot", "lake"])
        assert signal.exit_code == 0, signal.output
        run()
    finally:
        writer.stop.set()
        writer.join(30)
    run()
    assert writer.done > 50
    for t in _TABLES:
        got = CliRunner().invoke(main, ["verify", f"public.{t}", f"{lake}/public.{t}", "--dsn", postgres_dsn,
                                        "--slot", "lake", "--chunk-rows", "40"], catch_exceptions=False)
        assert got.exit_code == 0, f"{t}: {got.output}"
    later = [delivered[b] for b in sorted(delivered) if b >= before]
    chunks = [b for b in later if ("public.first", "snapshot") in b]
    assert len(chunks) >= 2, "the re-snapshot was not read in chunks"
    assert [op for b in later for t, op in b if op == "refresh"] == ["refresh"]
    # The other table streamed alongside: batches that read a chunk of first carry changes of second too.
    assert sum(1 for b in chunks if any(t == "public.second" for t, _ in b)) >= len(chunks) // 2
    conn.close()


def test_a_typed_query_resnapshots_its_table_and_ends_with_a_refresh_record(postgres_dsn: str, tmp_path: Path) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 25)
    query = open_backend("postgres", {"dsn": postgres_dsn, "tables": "first", "slot.name": "typed_rs",
                                      "snapshot.path": str(tmp_path / "snapshots"), "snapshot.chunkRows": "10"})
    try:
        start = Planner(query).initial("latest")
        signals.emit_resnapshot(conn, "public.first")
        conn.execute("DELETE FROM first WHERE id = 24")
        records = [r for _, b in batches(query, start) for r in b.select(["_op", "_seq", "id", "v"]).to_pylist()]
        assert [r["id"] for r in records if r["_op"] == "snapshot"] == list(range(24))
        assert [r["_op"] for r in records if r["_op"] != "snapshot"] == ["delete", "refresh"]
        refresh = records[-1]
        assert refresh["_op"] == "refresh" and refresh["v"] is None
        assert refresh["_seq"] == min(r["_seq"] for r in records if r["_op"] == "snapshot")
    finally:
        query.close()
        connection.drop_slot(conn, "typed_rs")
        conn.close()


def test_a_signal_during_the_tables_first_snapshot_is_ignored(
    postgres_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    _create(conn, 30)
    query = _query(postgres_dsn, tmp_path / "snapshots", **{"snapshot.chunksPerBatch": "1"})
    try:
        start = Planner(query).initial("snapshot")
        signals.emit_resnapshot(conn, "public.first")
        got = list(batches(query, start))
        assert "the snapshot of the table is still in progress" in caplog.text
        records = _records(got)
        assert sorted(json.loads(r["_key"])["id"] for r in records if r["_table"] == "public.first") == list(range(30))
        assert all(r["_op"] == "snapshot" for r in records)
    finally:
        query.close()
        connection.drop_slot(conn, "rs")
        conn.close()
