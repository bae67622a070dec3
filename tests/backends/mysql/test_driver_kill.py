"""The driver killed with ``kill -9`` between logging a batch's end offset and writing its output, while a writer
changes the table and the binary log rotates: the restarted driver replays the logged batch from its offsets, and
the output after restarts equals ``SELECT *`` (nothing lost, nothing twice)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.feather as feather

from tests.backends.mysql.harness import MySQLHarness, connect
from tests.backends.postgres.fold import fold_typed


def test_driver_killed_mid_stream_replays_exactly(mysql_dsn: str, tmp_path: Path) -> None:
    h = MySQLHarness(mysql_dsn)
    h.txn_size = 7
    h.append(300)
    stop = threading.Event()

    def writer() -> None:
        conn = connect(mysql_dsn)
        i = 0
        with conn.cursor() as cur:
            while not stop.is_set() and i < 150:
                i += 1
                cur.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i % 300,))
                cur.execute("INSERT INTO items VALUES (%s, 'w\\\\\"', 0)", (1000 + i,))
                cur.execute("DELETE FROM items WHERE id = %s", (i * 7 % 300,))
                if i % 40 == 0:
                    cur.execute("FLUSH BINARY LOGS")
        conn.close()

    def run(*extra: str) -> int:
        cmd = [sys.executable, "-m", "tests.backends.mysql.driver", mysql_dsn, str(tmp_path / "work"), *extra]
        return subprocess.run(cmd, cwd=Path(__file__).parents[3], timeout=300).returncode

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert run("--die-after", "2") == -9  # killed after logging batch 2, before its output
        assert not (tmp_path / "work" / "out-2.arrow").exists()
    finally:
        stop.set()
        thread.join()
    assert run() == 0
    outs = sorted((tmp_path / "work").glob("out-*.arrow"), key=lambda p: int(p.stem.split("-")[1]))
    tables = [feather.read_table(str(p)) for p in outs]
    positions = [p for t in tables for p in t.column("_position").to_pylist()]
    assert positions == sorted(set(positions))  # in order, none twice
    expected = {(r[0],): {"id": r[0], "v": r[1], "n": r[2]} for r in h.rows("SELECT * FROM items")}
    assert fold_typed(tables, ("id",)) == expected
    h.close()
