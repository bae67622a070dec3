"""The ``cdc`` source over a Tablestore tunnel inside real Spark: base data then changes, a server killed
(SIGKILL) and restarted under a running query, splits and merges, the query stopped and restarted from
its checkpoint; every change arrives exactly once and in order per key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cdc.servers.tablestore import TablestoreProcess
from tests.backends.tablestore.world import World
from tests.streaming import (
    kill_driver,
    run_available_now,
    start_driver,
    start_query,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_stream_survives_server_kill_and_query_restart(
    spark: Any, tablestore_server: TablestoreProcess, tmp_path: Path
) -> None:
    server = tablestore_server
    w = World(server, tunnel_type="BaseAndStream", key_range=(0, 300))
    expected: dict[int, list[tuple[str, str | None]]] = {}
    w.put_many([(k, f"b{k}") for k in range(200)])
    for k in range(200):
        expected[k] = [("snapshot", f"b{k}")]
    w.create_tunnel()
    out, ck = tmp_path / "out", tmp_path / "ck"

    def start() -> Any:
        options = {"backend": "tablestore", "maxRecordsPerTrigger": 120, **w.options(**{"retry.maxAttempts": "40"})}
        return start_query(spark, options, out, ck, processingTime="500 milliseconds")

    def count() -> int:
        try:
            return int(spark.read.parquet(str(out)).count())
        except Exception:  # noqa: BLE001 - nothing committed yet
            return 0

    def write(tag: str, keys: range) -> None:
        for k in keys:
            if k % 7 == 3:
                w.delete(k)
                expected.setdefault(k, []).append(("delete", None))
            else:
                w.update(k, f"{tag}{k}")
                expected.setdefault(k, []).append(("update", f"{tag}{k}"))

    def total() -> int:
        return sum(len(v) for v in expected.values())

    q = start()
    try:
        wait_for(lambda: count() >= 200, 120, "the base data")
        write("u", range(0, 200, 2))
        server.kill()  # under the running query
        time.sleep(1.5)
        server.start()
        write("v", range(0, 250, 3))
        w.split()
        write("x", range(0, 250, 5))
        wait_for(lambda: count() == total(), 120, "the changes after the server restart")
    finally:
        q.stop()
    assert q.exception() is None

    # the query is down: more changes, a merge, then the query restarts from its checkpoint
    write("y", range(1, 250, 4))
    shards = sorted(
        (s for s in server.shards(w.table) if not s["sealed"]),
        key=lambda s: -1 if not s["lo"] else s["lo"][0],
    )
    w.merge([shards[0]["shard_id"], shards[1]["shard_id"]])
    write("z", range(0, 250, 6))
    q = start()
    try:
        wait_for(lambda: count() == total(), 120, "the changes after the query restart")
        time.sleep(2)  # and nothing more arrives
    finally:
        q.stop()
    assert q.exception() is None

    got = spark.read.parquet(str(out)).select("_channel", "_position", "_seq", "_op", "id", "v").collect()
    assert len(got) == len({(r["_channel"], r["_position"]) for r in got}) == total()
    per_key: dict[int, list[tuple[int, str, str | None]]] = {}
    for r in got:
        per_key.setdefault(r["id"], []).append((r["_seq"], r["_op"], r["v"]))
    assert {k: [(op, v) for _, op, v in sorted(rs)] for k, rs in per_key.items()} == expected


def test_kill_9_of_driver_and_server_then_restart_is_exactly_once(
    spark: Any, tablestore_server: TablestoreProcess, tmp_path: Path
) -> None:
    server = tablestore_server
    w = World(server, tunnel_type="BaseAndStream", key_range=(0, 400))
    expected: dict[int, list[tuple[str, str | None]]] = {k: [("snapshot", f"b{k}")] for k in range(300)}
    w.put_many([(k, f"b{k}") for k in range(300)])
    w.create_tunnel()
    out, ck = tmp_path / "out", tmp_path / "ck"
    # Credentials from the standard environment variables (not options). A long client timeout: the
    # killed driver's tunnel client stays alive on the server for 3 minutes, holding the split parent,
    # so the restart must take it over (crash hand-over) rather than wait for it to expire.
    timeout_s = 180
    options = {
        "backend": "tablestore",
        "maxRecordsPerTrigger": 80,
        **{
            k: v
            for k, v in w.options(**{"tunnel.client.timeoutSeconds": str(timeout_s)}).items()
            if not k.startswith("access")
        },
    }
    env = {
        "ALIBABA_CLOUD_ACCESS_KEY_ID": server.access_key_id,
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": server.access_key_secret,
    }

    def update(tag: str, keys: range) -> None:
        for k in keys:
            w.update(k, f"{tag}{k}")
            expected.setdefault(k, []).append(("update", f"{tag}{k}"))

    proc = start_driver(options, out, ck, env)
    try:
        wait_for(
            lambda: (
                (ck / "commits").exists()
                and len([p for p in (ck / "commits").iterdir() if p.name.isdigit()]) >= 3
            ),
            240,
            "three committed batches",
        )
        update("u", range(0, 300, 3))
        w.split()
        update("v", range(0, 300, 4))
    finally:
        kill_driver(proc)  # the driver and its Python workers die mid-stream
    killed = time.monotonic()
    server.kill()
    server.start()
    update("x", range(1, 300, 5))
    # The restart is this process's Spark session (only the kill needs a process of its own; the killed driver
    # read with the credentials of the environment variables, this one gets them as options).
    creds = {"access.key.id": server.access_key_id, "access.key.secret": server.access_key_secret}
    assert run_available_now(spark, {**options, **creds}, out, ck) is None
    took = time.monotonic() - killed
    print(
        f"restart after kill -9: the AvailableNow run finished {took:.1f}s after the kill (client timeout {timeout_s}s)"
    )
    assert took < timeout_s, "the restart waited for the dead driver's tunnel client to expire"

    got = spark.read.parquet(str(out)).select("_channel", "_position", "_seq", "_op", "id", "v").collect()
    assert len(got) == len({(r["_channel"], r["_position"]) for r in got}), "duplicates after kill -9"
    per_key: dict[int, list[tuple[int, str, str | None]]] = {}
    for r in got:
        per_key.setdefault(r["id"], []).append((r["_seq"], r["_op"], r["v"]))
    assert {k: [(op, v) for _, op, v in sorted(rs)] for k, rs in per_key.items()} == expected


def test_fail_on_data_loss_in_spark(spark: Any, tablestore_server: TablestoreProcess, tmp_path: Path) -> None:
    """Records the service expired before the query read them: the query fails with a DataLossError
    naming the tunnel and the option; with failOnDataLoss=false it skips to the first record still held."""
    server = tablestore_server
    w = World(server, tunnel_type="Stream")
    w.create_tunnel()
    w.put_many([(k, "a") for k in range(20)])
    out, ck = tmp_path / "out", tmp_path / "ck"

    def run(**extra: str) -> Any:
        return run_available_now(spark, {"backend": "tablestore", **w.options(), **extra}, out, ck, timeout=180)

    assert run() is None
    w.put_many([(k, "lost") for k in range(100, 110)])
    time.sleep(0.01)
    server.trim(w.table)
    w.put_many([(k, "new") for k in range(200, 205)])
    error = run()
    assert error is not None
    assert (
        "OTSTrimmedDataAccess" in str(error)
        and "failOnDataLoss=false" in str(error)
        and "'cdc'" in str(error)
    )
    assert run(failOnDataLoss="false") is None
    got = spark.read.parquet(str(out)).select("_position", "id", "v").collect()
    assert sorted((r["id"], r["v"]) for r in got) == [(k, "a") for k in range(20)] + [
        (k, "new") for k in range(200, 205)
    ]
    assert sorted(r["_position"] for r in got) == list(range(25))  # positions go on after the skip
