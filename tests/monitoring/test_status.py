"""``cdc status``: the table per channel from a checkpoint (laid out as Spark's OffsetSeqLog writes it) and
the change log's heads; on an S3-compatible store (moto's server on loopback: no real S3 here); and
``--watch`` refreshing under a pseudo-terminal. The live-query case is in test_monitor_spark.py."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyarrow import fs

from cdc.backends.local import LocalLog
from cdc.cli import main

ROOT = Path(__file__).resolve().parents[2]


def write_offsets(ck: Path, batch: int, offset: dict, committed: bool = True) -> None:
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    (ck / "commits").mkdir(parents=True, exist_ok=True)
    (ck / "offsets" / str(batch)).write_text(
        "\n".join(["v1", json.dumps({"batchWatermarkMs": 0}), json.dumps(offset)])
    )
    if committed:
        (ck / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


@pytest.fixture
def query(tmp_path: Path) -> tuple[LocalLog, Path]:
    """A log whose c1 split after the query's last batch: c0 and c1 part read, c1's children waiting."""
    log = LocalLog.create(tmp_path / "log", [("id", pa.int64())], ["id"], channels=2)
    log.append([{"id": i} for i in range(10)], channel="c0")
    log.append([{"id": i} for i in range(10, 15)], channel="c1")
    write_offsets(tmp_path / "ck", 3, {"channels": {"c0": {"pos": 4}, "c1": {"pos": 5}}, "turn": 3})
    log.split("c1")
    return log, tmp_path / "ck"


def rows(output: str) -> dict[str, list[str]]:
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and cells[0].startswith("c") and cells[0][1:].isdigit():
            out[cells[0]] = cells[1:]
    return out


def test_status_shows_each_channels_lag_and_state(query: tuple[LocalLog, Path]) -> None:
    log, ck = query
    result = CliRunner().invoke(
        main,
        ["status", str(ck), "-o", "backend=local", "-o", f"path={log.path}", "-o", "maxRecordsPerTrigger=5"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "batch 3 (committed)" in result.output
    table = rows(result.output)
    assert table["c0"][:4] == ["reading", "4", "10", "6"]
    assert table["c1"][:4] == ["finished", "5", "5", "0"]
    assert table["c2"][:4] == table["c3"][:4] == ["waiting-for-parents", "-", "0", "0"]


def test_status_refuses_a_malformed_option(query: tuple[LocalLog, Path]) -> None:
    _, ck = query
    result = CliRunner().invoke(main, ["status", str(ck), "-o", "path"])
    assert result.exit_code != 0 and "expected key=value" in result.output
    result = CliRunner().invoke(main, ["status", str(ck), "-o", "backend=local", "-o", "pth=/x"])
    assert result.exit_code != 0 and "'pth'" in result.output and "did you mean 'path'" in result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_server() -> Iterator[str]:
    """moto's S3-compatible server on loopback (a stand-in for an object store, which cannot run here)."""
    port = _free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_status_reads_a_checkpoint_on_an_object_store(
    query: tuple[LocalLog, Path], s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, ck = query
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(key, value)
    s3 = fs.S3FileSystem(
        endpoint_override=s3_server, scheme="http", region="us-east-1", allow_bucket_creation=True
    )
    s3.create_dir("checkpoints")
    fs.copy_files(str(ck), "checkpoints/orders", destination_filesystem=s3)
    uri = f"s3://checkpoints/orders?endpoint_override={s3_server}&scheme=http&region=us-east-1"
    result = CliRunner().invoke(
        main, ["status", uri, "-o", "backend=local", "-o", f"path={log.path}"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert rows(result.output)["c0"][:4] == ["reading", "4", "10", "6"]


@pytest.mark.slow
def test_watch_refreshes_under_a_terminal(query: tuple[LocalLog, Path]) -> None:
    log, ck = query
    pid, fd = pty.fork()
    if pid == 0:  # the child: cdc status --watch on the pseudo-terminal
        os.environ.update({"PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "xterm"})
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "cdc",
                "status",
                str(ck),
                "-o",
                "backend=local",
                "-o",
                f"path={log.path}",
                "--watch",
                "--interval",
                "0.3",
            ],
        )
    seen = b""

    def read_until(marker: bytes, timeout: float) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break
        assert marker in seen, seen.decode(errors="replace")[-2000:]

    try:
        read_until(b"waiting-for-parents", 60)
        assert b"\x1b[" in seen  # a live display: the terminal is redrawn in place
        log.append([{"id": i} for i in range(100, 130)], channel="c0")  # c0's head moves from 10 to 40
        read_until(b"  40 ", 30)
        os.kill(pid, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
