"""A chunked snapshot through Spark into Delta, with a writer running and everything that can die dying once: a
task killed inside its chunk (retried: ``local[2,3]``), the driver killed (``kill -9`` of its process group)
after a batch's offsets were logged and before its chunks were read (the replay reads at a new cut, which the
next batch holds back), PostgreSQL killed and restarted while a batch waits to read its chunks (their cut is
gone with the server: the query fails naming the lost cut, and its restart in the same driver replays the
batch; that driver, the one restarted after the kill, is the test's own Spark session). At the end both Delta
tables (the sink's default mode and its pipelined mode) equal ``SELECT *``. (A replay of a batch the sinks
committed yields the rows its first complete reads kept: the contract suite's ChunkedSnapshotContract shows it
without a driver process.)"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.backends.postgres import connection
from tests.backends.postgres.chunked import KINDS, Table, big_value

ROOT = Path(__file__).resolve().parents[3]
CHILD = ROOT / "tests" / "drivers" / "chunked_snapshot_child.py"
HOOKS = ROOT / "tests" / "drivers" / "task_kill"


class Writer(threading.Thread):
    """Random changes while the query runs (reconnecting across a server restart): inserts, updates of the small
    and the TOASTed column, key changes, deletes, and transactions that touch many chunks."""

    def __init__(self, dsn: str, rows: int, rekey_toasted: bool) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows, self.rekey_toasted = dsn, rows, rekey_toasted
        self.stop = threading.Event()
        self.done = 0

    def run(self) -> None:
        rng = random.Random(7)
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True)
                self._one(conn, rng)
                self.done += 1
            except psycopg.OperationalError:
                conn = None
                time.sleep(0.2)
            except psycopg.errors.UniqueViolation:
                pass
            time.sleep(0.005)

    def _one(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        k = rng.randrange(self.rows + 300)
        op = rng.random()
        if op < 0.2:
            conn.execute("INSERT INTO crashed VALUES (%s, 0, %s) ON CONFLICT DO NOTHING", (k, f"w{k}"))
        elif op < 0.5:
            conn.execute("UPDATE crashed SET n = n + 1 WHERE k = %s", (k,))
        elif op < 0.6:
            conn.execute("UPDATE crashed SET big = %s WHERE k = %s", (big_value(rng), k))
        elif op < 0.75:
            toasted = "" if self.rekey_toasted else " AND length(big) < 100"
            conn.execute(f"UPDATE crashed SET k = %s WHERE k = %s{toasted}".encode(), (rng.randrange(self.rows + 300), k))
        elif op < 0.9:
            conn.execute("DELETE FROM crashed WHERE k = %s", (k,))
        else:
            with conn.transaction():  # one transaction across the whole key range, so across chunks
                conn.execute("UPDATE crashed SET n = n + 10 WHERE k %% 97 = %s", (rng.randrange(97),))


def _start(dsn: str, tmp: Path, *args: str, kill_task: bool = False) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOKS), str(ROOT)]))
    if kill_task:
        env["CDC_TEST_KILL_TASK"] = str(tmp / "kill-a-task")
    (tmp / "marks" / "holding").unlink(missing_ok=True)
    (tmp / "marks" / "release").unlink(missing_ok=True)
    log = (tmp / "child.log").open("ab")
    return subprocess.Popen([sys.executable, str(CHILD), dsn, str(tmp / "lake"), str(tmp / "checkpoint"),
                             str(tmp / "snapshots"), str(tmp / "marks"), *args], cwd=ROOT, env=env,
                            start_new_session=True, stdout=log, stderr=log)


def _wait_mark(tmp: Path, name: str, proc: subprocess.Popen[bytes] | None = None,
               query: Query | None = None, timeout: float = 240) -> str:
    """The text of ``marks/name`` once the driver (a child process, or a query in this process) wrote it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (tmp / "marks" / name).exists():
            time.sleep(0.2)  # written whole
            return (tmp / "marks" / name).read_text()
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the child exited ({proc.returncode}) before {name}: {(tmp / 'child.log').read_text()[-3000:]}")
        if query is not None and not query.is_alive():
            pytest.fail(f"the query ended before {name}: {query.error!r}")
        time.sleep(0.2)
    if proc is not None:
        os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"no {name} from the driver: {(tmp / 'child.log').read_text()[-3000:]}")


class Query(threading.Thread):
    """:func:`chunked_snapshot_child.stream` in this process's Spark session: the driver restarted after the
    kill -9 (only the kill needs a process of its own)."""

    def __init__(self, spark: Any, dsn: str, tmp: Path, *args: Any) -> None:
        super().__init__(daemon=True)
        self.spark, self.dsn, self.tmp, self.args = spark, dsn, tmp, args
        self.error: BaseException | None = None

    def run(self) -> None:
        from tests.drivers.chunked_snapshot_child import stream

        t = self.tmp
        try:
            stream(self.spark, self.dsn, str(t / "lake"), str(t / "checkpoint"), str(t / "snapshots"), str(t / "marks"),
                   *self.args)
        except BaseException as exc:  # the test's assertion names it
            self.error = exc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers: a real crash
    proc.wait(30)


def _delta(path: Path) -> dict[int, tuple[int, str]]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(path)).to_pyarrow_table(columns=["k", "n", "big"]).to_pylist()
    return {r["k"]: (r["n"], r["big"]) for r in rows}


@pytest.mark.slow
def test_chunked_snapshot_into_delta_survives_every_crash(spark: Any, postgres_server: Any, postgres_dsn: str,
                                                          tmp_path: Path) -> None:
    import cdc.model

    (tmp_path / "marks").mkdir()
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    table = Table(conn, "crashed", KINDS["bigint"])
    table.load(3000, random.Random(3))
    conn.execute("ANALYZE crashed")
    # Re-keying a row whose TOASTed value stays needs the change model's key-change link (_old_key).
    writer = Writer(postgres_dsn, 3000, rekey_toasted=hasattr(cdc.model, "OLD_KEY"))
    writer.start()
    try:
        # A task dies inside its chunk (retried), then the driver dies before batch 2 reads its chunks.
        (tmp_path / "kill-a-task").write_text("")
        child = _start(postgres_dsn, tmp_path, "--hold", "before", "2", kill_task=True)
        assert _wait_mark(tmp_path, "holding", proc=child) == "before 2"
        _kill(child)
        assert not (tmp_path / "kill-a-task").exists(), "no task was killed inside its chunk"
        # The restarted driver (this process's session) replays batch 2; PostgreSQL dies while batch 4 waits to
        # read its chunks: their cut goes with it, the query fails.
        (tmp_path / "marks" / "holding").unlink()
        query = Query(spark, postgres_dsn, tmp_path, "before", 4, False, True)
        query.start()
        assert _wait_mark(tmp_path, "holding", query=query) == "before 4"
        postgres_server.kill()
        postgres_server.start()
        (tmp_path / "marks" / "release").write_text("")
        failed = _wait_mark(tmp_path, "failed", query=query)
        assert "CutLostError" in failed, f"the query went on without its cut, or failed otherwise: {failed[-3000:]}"
        time.sleep(1)
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.done > 100
    # The query restarted in the same driver replays batch 4 at a new cut, then finishes.
    (tmp_path / "marks" / "resume").write_text("")
    query.join(600)
    assert not query.is_alive() and query.error is None, query.error
    batches = [int(line.split()[1]) for line in (tmp_path / "marks" / "batches.txt").read_text().splitlines()]
    assert max(batches) > 4 and batches.count(2) >= 2 and batches.count(4) >= 2
    with psycopg.connect(postgres_dsn) as check:
        expected = {r[0]: (r[1], r[2]) for r in check.execute("SELECT k, n, big FROM crashed")}
    for mode in ("default", "pipelined"):
        assert _delta(tmp_path / "lake" / mode) == expected, mode
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        connection.drop_slot(admin, "crashed")
    conn.close()
