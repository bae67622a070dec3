"""The official Java Tablestore SDK's ``TunnelWorker`` (Maven ``com.aliyun.openservices:tablestore``, pinned in
``tests/sdks/java/pom.xml``) consuming a BaseAndStream tunnel of the local server, the way the service's
users run it: the SDK's own heartbeats, channel state machine, reads and checkpoints. It is an independent
reader of the tunnel protocol, so the server is not proven only by our own tunnel client, which could share
our misreadings.

The same writes go to one table with two tunnels: the Java worker reads one while the writes, a split and
a merge happen (killed between them, and restarted); our backend reads the other. Per key, both deliver
the same changes in the same order, and replaying either gives the rows GetRange returns.
``make java-sdk`` builds the program (``make test`` does it first).
"""

from __future__ import annotations

import base64
import json
import os
import random
import select
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import tablestore as ots

from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World, drain

JAVA_DIR = Path(__file__).parent / "java"
MAIN_CLASS = "cdctunnel.sdk.TunnelWorkerMain"
# Every attribute type the tunnel carries; the SDK's PlainBuffer reader checks each cell's encoding.
COLUMN_TYPES = {"v": "string", "n": "long", "d": "double", "f": "boolean", "b": "binary"}
CATALOG = json.dumps(
    {"columns": {"id": {"type": "long"}} | {c: {"type": t} for c, t in COLUMN_TYPES.items()}}
)
# (record type, sequence timestamp and row index (None in base data), ((column, column type, value), ...)):
# one change as both readers report it
Change = tuple[str, int | None, int | None, tuple[tuple[str, str, Any], ...]]
IGNORE = ots.Condition(ots.RowExistenceExpectation.IGNORE)


def _classpath() -> str:
    listed = JAVA_DIR / "target" / "classpath.txt"
    classes = JAVA_DIR / "target" / "classes" / "cdctunnel" / "sdk" / "TunnelWorkerMain.class"
    if not (listed.is_file() and classes.is_file()):
        pytest.fail(f"the Java SDK program is not built in {JAVA_DIR}: run `make java-sdk`", pytrace=False)
    return f"{JAVA_DIR / 'target' / 'classes'}{os.pathsep}{listed.read_text().strip()}"


class JavaWorker:
    """One run of the Java program: started, then stopped through stdin or killed with SIGKILL."""

    def __init__(self, server: TablestoreProcess, table: str, records: Path, log: Path) -> None:
        java = shutil.which("java")
        if java is None:
            pytest.fail("`java` is not on PATH: the Java SDK test needs Java 17", pytrace=False)
        env = {
            **os.environ,
            "OTS_ENDPOINT": server.endpoint,
            "OTS_INSTANCE": server.instance,
            "OTS_ACCESS_KEY_ID": server.access_key_id,
            "OTS_ACCESS_KEY_SECRET": server.access_key_secret,
            "OTS_TABLE": table,
            "OTS_TUNNEL_NAME": "java",
            "RECORDS_FILE": str(records),
            # TunnelClient skips the response checks by default; on, they prove our responses' signatures.
            "RESPONSE_VALIDATION": "true",
            # The SDK's minimum interval; a dead worker's channels go to the next one after the timeout.
            "HEARTBEAT_INTERVAL_SEC": "5",
            "HEARTBEAT_TIMEOUT_SEC": "10",
            "CHECKPOINT_INTERVAL_MS": "100",
        }
        self.log = log
        self._stderr: IO[str] = log.open("a")
        self.proc = subprocess.Popen(
            [java, "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp", _classpath(), MAIN_CLASS],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        # The SDK retries a failing ConnectTunnel for ever: give up after a while rather than hang.
        first = self._line("connected", timeout=60).split()
        if first[:1] != ["working"]:
            self.kill()
            pytest.fail(f"the Java worker did not start; its log:\n{log.read_text()[-4000:]}", pytrace=False)
        self.tunnel_id = first[1]

    def _line(self, what: str, timeout: float = 30.0) -> str:
        """The program's next line of standard output (it prints whole lines and flushes)."""
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.kill()
            pytest.fail(f"the Java worker never {what}; its log:\n{self.log.read_text()[-4000:]}")
        return self.proc.stdout.readline()

    def _command(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._line(f"answered {line!r}")

    def describe(self) -> dict[str, Any]:
        """DescribeTunnel as the Java SDK parses it."""
        described: dict[str, Any] = json.loads(self._command("describe"))
        return described

    def delete_version(self, key: int, column: str, ts: int) -> None:
        """UpdateRow deleting one version of a cell, encoded by the Java SDK."""
        assert self._command(f"delete-version {key} {column} {ts}").strip() == "ok", self.log.read_text()[
            -4000:
        ]

    def kill(self) -> None:
        """SIGKILL: no shutdown call reaches the server; the client expires after its heartbeat timeout."""
        self.proc.kill()
        self.proc.wait(10)
        self._stderr.close()

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.close()
        code = self.proc.wait(30)
        self._stderr.close()
        assert code == 0, f"the Java worker exited with {code}; its log:\n{self.log.read_text()[-4000:]}"


@pytest.fixture
def java_workers() -> Iterator[list[JavaWorker]]:
    """The workers a test starts: any still running when it ends (a failed assertion) is killed."""
    workers: list[JavaWorker] = []
    yield workers
    for worker in workers:
        if worker.proc.poll() is None:
            worker.kill()


def _java_changes(records: Path) -> tuple[list[dict[str, Any]], int]:
    """The records the worker wrote, each once (a restarted worker redelivers what followed its last
    checkpoint: identical records, dropped here), and the number of such redeliveries."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    first: list[dict[str, Any]] = []
    redelivered = 0
    # The worker may be writing: only whole lines (it writes a batch's lines in one write).
    for line in records.read_text().split("\n")[:-1]:
        rec = json.loads(line)
        seq = rec["seq"]
        ident = (rec["channel"], json.dumps(rec["pk"]), seq["epoch"], seq["timestamp"], seq["rowIndex"])
        if ident in seen:
            assert seen[ident] == rec, f"a redelivered record differs: {seen[ident]} then {rec}"
            redelivered += 1
            continue
        seen[ident] = rec
        first.append(rec)
    return first, redelivered


def _plain(value: Any) -> Any:
    """A value as the Java program writes it (double and binary tagged, binary in base64)."""
    if isinstance(value, float):
        return {"double": value}
    if isinstance(value, bytes | bytearray):
        return {"blob": base64.b64encode(bytes(value)).decode("ascii")}
    return value


def _java_per_key(records: list[dict[str, Any]], stamps: bool = False) -> dict[int, list[Change]]:
    """Per key, the changes in delivery order; with ``stamps``, each PUT cell's value is (value, cell
    timestamp), to replay against GetRange's timestamps."""
    per_key: dict[int, list[Change]] = {}
    for rec in records:
        cols = tuple(
            sorted(
                (c["name"], c["type"], (c["value"], c["ts"]) if stamps else c["value"])
                for c in rec["columns"]
            )
        )
        base = rec["channel"].endswith("-base")  # base data carries no sequence info
        seq = (None, None) if base else (rec["seq"]["timestamp"], rec["seq"]["rowIndex"])
        per_key.setdefault(rec["pk"]["id"], []).append((rec["type"], *seq, cols))
    return per_key


def _backend_per_key(rows: list[dict[str, Any]]) -> dict[int, list[Change]]:
    per_key: dict[int, list[Change]] = {}
    for r in rows:
        cols = []
        for name in COLUMN_TYPES:
            kind = r[f"__ots_column_type_{name}"]
            if kind is not None:
                cols.append((name, kind, _plain(r[name]) if kind == "PUT" else None))
        stamp = r["__ots_record_timestamp__"]
        row_index = None if stamp is None else r["_seq"] % 1024  # _seq: timestamp * 1024 + row index
        per_key.setdefault(r["id"], []).append(
            (r["__ots_record_type__"], stamp, row_index, tuple(sorted(cols)))
        )
    return per_key


def _replay(per_key: dict[int, list[Change]]) -> dict[int, dict[str, Any]]:
    """The rows the changes leave: PUT replaces a row, UPDATE sets and deletes columns, DELETE removes it."""
    rows: dict[int, dict[str, Any]] = {}
    for key, changes in per_key.items():
        row: dict[str, Any] | None = None
        for kind, _, _, cols in changes:
            if kind == "DELETE":
                row = None
                continue
            row = {} if kind == "PUT" or row is None else row
            for name, col_type, value in cols:
                if col_type == "PUT":
                    row[name] = value
                else:
                    row.pop(name, None)
        if row is not None:
            rows[key] = row
    return rows


def _get_range(w: World, stamps: bool = False) -> dict[int, dict[str, Any]]:
    start: Any = [("id", ots.INF_MIN)]
    rows: dict[int, dict[str, Any]] = {}
    while start is not None:
        _, start, page, _ = w.sdk.get_range(
            w.table, ots.Direction.FORWARD, start, [("id", ots.INF_MAX)], max_version=1, limit=50
        )
        for row in page:
            rows[row.primary_key[0][1]] = {
                name: (_plain(value), ts) if stamps else _plain(value)
                for name, value, ts in row.attribute_columns
            }
    return rows


def _checkpoints(server: TablestoreProcess, tunnel_id: str) -> dict[str, tuple[str, int]]:
    """Each channel's (checkpoint token, sequence number) as the server stores them (read-only)."""
    db = sqlite3.connect(f"file:{server.data_dir / 'tablestore.sqlite'}?mode=ro", uri=True)
    try:
        cur = db.execute("SELECT channel_id, checkpoint, seqno FROM channels WHERE tunnel_id=?", (tunnel_id,))
        return {channel: (token, seqno) for channel, token, seqno in cur}
    finally:
        db.close()


def _wait(what: str, done: Callable[[], bool], log: Path, timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; the Java worker's log:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_java_tunnel_worker_matches_our_backend(
    tablestore_server: TablestoreProcess, tmp_path: Path, java_workers: list[JavaWorker]
) -> None:
    server = tablestore_server
    w = World(server, tunnel_type="BaseAndStream", extra_options={"catalog": CATALOG})
    w.put_many([(k, f"base{k}") for k in range(0, 1000, 10)])
    w.create_tunnel()  # ours: World's tunnel "cdc", read through the backend
    rng = random.Random(16)
    step = iter(range(1_000_000))

    def writes(n: int) -> int:
        """``n`` random writes; returns how many row changes they made."""
        changes = 0
        for _ in range(n):
            key, i = rng.randrange(0, 1000, 5), next(step)
            op = rng.random()
            if op < 0.3:
                w.put(key, f"p{i}", i if rng.random() < 0.5 else None)
            elif op < 0.45:
                cols = [
                    ("v", f"t{i}"),
                    ("d", i / 7),
                    ("f", i % 2 == 0),
                    ("b", bytearray(f"\x00{i}\xff", "latin-1")),
                ]
                w.sdk.put_row(w.table, ots.Row([("id", key)], cols), IGNORE)
            elif op < 0.65:
                w.update(key, f"u{i}")
            elif op < 0.75:
                row = ots.Row([("id", key)], {"put": [("d", -i / 3), ("f", True)], "delete_all": ["b", "v"]})
                w.sdk.update_row(w.table, row, IGNORE)
            elif op < 0.85:
                w.delete(key)
            else:  # one BatchWriteRow: one commit timestamp, the rows told apart by their row index
                w.put_many([(k, f"m{i}") for k in sorted(rng.sample(range(0, 1000, 5), 4))])
                changes += 3
            changes += 1
        return changes

    records, log = tmp_path / "java-records.jsonl", tmp_path / "java-worker.log"
    records.touch()

    def delivered() -> int:
        return len(_java_changes(records)[0])

    worker = JavaWorker(server, w.table, records, log)  # creates the tunnel "java" through the SDK
    java_workers.append(worker)
    java_tunnel = worker.tunnel_id
    _wait("the base data", lambda: delivered() >= 100, log)
    writes(40)
    left, right = w.split()
    writes(20)
    # The split's children open a heartbeat after their parent finishes; the SDK checkpoints a channel on a
    # read after the interval. Once both children have checkpointed, write more and kill the worker at once:
    # the restarted one must resume from those checkpoints, not from the children's start.
    _wait(
        "the split's children to checkpoint",
        lambda: all(_checkpoints(server, java_tunnel)[c][1] >= 1 for c in (left, right)),
        log,
    )
    unread_at_most = writes(20)
    before_kill = _checkpoints(server, java_tunnel)
    worker.kill()
    assert delivered() > 140, "the worker was meant to die after reading the split's children"
    writes(30)  # while no worker runs

    worker = JavaWorker(server, w.table, records, log)  # finds the tunnel by ListTunnel
    java_workers.append(worker)
    assert worker.tunnel_id == java_tunnel
    writes(20)
    merged = w.merge([left, right])
    writes(30)
    # DELETE_ONE_VERSION cells: the Java SDK writes them (the Python SDK cannot), both tunnels carry them.
    stamped = _get_range(w, stamps=True)
    for key in [k for k, row in sorted(stamped.items()) if "n" in row][:3]:
        worker.delete_version(key, "n", stamped[key]["n"][1])

    backend = w.backend()
    ours = [r for _, t in drain(backend, limit=50) for r in t.to_pylist()]
    backend.close()
    assert sum(r["__ots_column_type_n"] == "DELETE_ONE_VERSION" for r in ours) == 3
    _wait("every change", lambda: delivered() >= len(ours), log, timeout=60)
    # The SDK checkpoints after processing a read once the interval has passed, so the merged channel's
    # checkpoint moves on the read after its last records (an empty one).
    _wait("the merged channel's checkpoint", lambda: _checkpoints(server, java_tunnel)[merged][1] >= 1, log)
    described = worker.describe()
    worker.stop()
    after = _checkpoints(server, java_tunnel)
    java, redelivered = _java_changes(records)

    # Checkpoints: before the kill, the base channel and the split's parent had finished and the children
    # had moved past their start; the restarted worker finished the children and moved the merged channel;
    # sequence numbers only advance. It redelivered at most what followed the children's checkpoints.
    parents = {c for c in before_kill if c not in (left, right, merged)}
    assert len(parents) == 2 and all(before_kill[c][0] == "finished" for c in parents)
    assert all(before_kill[c][0] not in ("", "finished") for c in (left, right))
    for channel, (_, seqno) in before_kill.items():
        assert after[channel][1] >= seqno
    assert redelivered <= unread_at_most
    # DescribeTunnel as the SDK parses it: the finished channels terminated, the merged one open, owned by
    # the restarted worker.
    assert (described["tunnelId"], described["stage"], described["expired"]) == (
        java_tunnel,
        "ProcessStream",
        False,
    )
    statuses = {c["id"]: (c["type"], c["status"], bool(c["clientId"])) for c in described["channels"]}
    assert statuses == {
        **{
            c: ("BaseData" if c.endswith("-base") else "Stream", "TERMINATED", False)
            for c in after
            if c != merged
        },
        merged: ("Stream", "OPEN", True),
    }
    # The SDK logs and retries what it does not accept (a refused checkpoint, a heartbeat error): none.
    complaints = [line for line in log.read_text().splitlines() if " WARN " in line or " ERROR " in line]
    assert [line for line in complaints if "Unexpected shutdown, do resources clear" not in line] == []
    assert after[left][0] == after[right][0] == "finished"
    assert after[merged][1] >= 1 and after[merged][0] not in ("", "finished")

    # Per key, the same changes in the same order; replayed, the rows GetRange returns.
    assert len(java) == len(ours)
    java_keys, our_keys = _java_per_key(java), _backend_per_key(ours)
    assert java_keys == our_keys
    table = _get_range(w)
    assert _replay(java_keys) == table
    assert _replay(our_keys) == table
    # The cells' timestamps as the Java SDK read them are the ones the table keeps.
    assert _replay(_java_per_key(java, stamps=True)) == _get_range(w, stamps=True)
    # Within a channel the Java SDK reads stream records in (epoch, timestamp, row index) order.
    by_channel: dict[str, list[tuple[int, int, int]]] = {}
    for rec in java:
        s = rec["seq"]
        if not rec["channel"].endswith("-base"):
            by_channel.setdefault(rec["channel"], []).append((s["epoch"], s["timestamp"], s["rowIndex"]))
    assert set(by_channel) >= {left, right, merged}
    assert all(seqs == sorted(seqs) for seqs in by_channel.values())
    print(f"java: {len(java)} changes, {redelivered} redelivered after the restart; ours: {len(ours)}")
