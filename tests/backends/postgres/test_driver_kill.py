"""A driver kill -9 during the snapshot phase: killed while materialising (before the manifest), the restart
exports a new snapshot; killed later, the replayed snapshot batch reads the materialised chunks. Either way
the output after restarts equals ``SELECT *`` (no gap, no duplicate), with writes going on meanwhile."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pyarrow.feather as feather
import pytest

from tests.backends.postgres.fold import fold_typed


@pytest.mark.slow
def test_driver_killed_during_snapshot_phase_replays_exactly(postgres_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v text, n int)")
        conn.execute("INSERT INTO items SELECT g, 'v' || g, 0 FROM generate_series(1, 2000) g")
        conn.execute("ANALYZE items")
    stop = threading.Event()

    def writer() -> None:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                conn.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i % 2000 + 1,))
                conn.execute("INSERT INTO items VALUES (%s, 'w', 0)", (5000 + i,))
                conn.execute("DELETE FROM items WHERE id = %s", (i * 13 % 2000 + 1,))

    def run(*extra: str) -> int:
        cmd = [sys.executable, "-m", "tests.backends.postgres.snapshot_driver", postgres_dsn,
               str(tmp_path / "snap"), str(tmp_path / "work"), *extra]
        return subprocess.run(cmd, cwd=Path(__file__).parents[3], timeout=300).returncode

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert run("--die-materialising") == -9  # killed after writing a chunk file, before the manifest
        assert list((tmp_path / "snap" / "killed_driver").rglob("*.arrow"))
        assert not (tmp_path / "snap" / "killed_driver" / "manifest.json").exists()
        assert not (tmp_path / "work" / "initial").exists()
        assert run("--die-after", "1") == -9  # killed after logging snapshot batch 1, before its output
        assert not (tmp_path / "work" / "out-1.arrow").exists()
        assert run("--die-after", "3") == -9  # the restart replays batch 1, dies again in the snapshot phase
    finally:
        stop.set()
        thread.join()
    assert run() == 0
    outs = sorted((tmp_path / "work").glob("out-*.arrow"), key=lambda p: int(p.stem.split("-")[1]))
    tables = [feather.read_table(str(p)) for p in outs]
    assert sum("snapshot" in t.column("_op").to_pylist() for t in tables) >= 4  # the kills hit the snapshot
    with psycopg.connect(postgres_dsn) as conn:
        expected = {(r[0],): {"id": r[0], "v": r[1], "n": r[2]} for r in conn.execute("SELECT * FROM items")}
        conn.execute("SELECT pg_drop_replication_slot('killed_driver')")
    assert fold_typed(tables, ("id",)) == expected
