"""Spark Connect: ``cdc.register``, the source and ``DeltaUpsertSink`` under ``SparkSession.builder.remote``
against the Connect server that ships in pyspark 4.2; and protobuf 6 beside the Tablestore SDK."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdc.backends.local import LocalLog
from cdc.servers.tablestore import TablestoreProcess
from sinks.delta.layout import DELETED_AT

CLIENT = Path(__file__).parents[1] / "drivers" / "connect_client.py"


def test_the_tablestore_sdk_and_the_connect_client_import_together(tablestore_server: TablestoreProcess) -> None:
    """The SDK declares protobuf<6 and the Connect client needs protobuf 6: both load in one interpreter
    (a fresh one, so nothing imported earlier decides), and the SDK round-trips a table call."""
    code = f"""
import google.protobuf, tablestore
from pyspark.sql.connect.session import SparkSession
from tablestore import Row, TableMeta, TableOptions, ReservedThroughput, CapacityUnit, OTSClient
from tablestore.retry import NoRetryPolicy
assert int(google.protobuf.__version__.split(".")[0]) >= 6, google.protobuf.__version__
c = OTSClient({tablestore_server.endpoint!r}, {tablestore_server.access_key_id!r},
              {tablestore_server.access_key_secret!r}, {tablestore_server.instance!r}, retry_policy=NoRetryPolicy())
c.create_table(TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0)))
c.put_row("t", Row([("id", 7)], [("v", "seven")]))
_, row, _ = c.get_row("t", [("id", 7)], max_version=1)
print(row.attribute_columns[0][1])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "seven"


def _burst(log: LocalLog, rows: dict[int, str], rng: random.Random, n: int) -> None:
    batch: list[dict[str, Any]] = []
    for _ in range(n):
        key = rng.randrange(120)
        if key in rows and rng.random() < 0.25:
            del rows[key]
            batch.append({"id": key, "_op": "delete"})
        else:
            op = "update" if key in rows else "insert"
            rows[key] = f"v{rng.randrange(10**6)}"
            batch.append({"id": key, "v": rows[key], "_op": op})
    log.append(batch)


def _run_client(url: str, log: LocalLog, table: Path, ck: Path, result: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(CLIENT), url, str(log.path), str(table), str(ck), str(result)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen: dict[str, Any] = json.loads(result.read_text())
    return seen


def _live(table: Path) -> dict[int, str]:
    """The table's live rows through delta-rs (another reader than the one the client used)."""
    data = DeltaTable(str(table)).to_pyarrow_table()
    if DELETED_AT in data.column_names:  # tombstones, where the table keeps them
        data = data.filter(data[DELETED_AT].is_null())
    return dict(zip(data["id"].to_pylist(), data["v"].to_pylist(), strict=True))


@pytest.mark.slow
def test_source_and_sink_under_connect_exactly_once_across_restarts(connect_server: Any, tmp_path: Path) -> None:
    rng = random.Random(13)
    rows: dict[int, str] = {}
    log = LocalLog.create(tmp_path / "log", [("id", pa.int64()), ("v", pa.string())], keys=["id"], channels=2)
    for _ in range(3):
        _burst(log, rows, rng, 200)
    table, ck = tmp_path / "table", tmp_path / "ck"
    first = _run_client(connect_server.url, log, table, ck, tmp_path / "r1.json")
    assert first["session"].startswith("pyspark.sql.connect")
    assert first["batches"] >= 2  # maxRecordsPerTrigger=150 over 600 changes
    assert dict(map(tuple, first["rows"])) == rows == _live(table)

    for _ in range(2):
        _burst(log, rows, rng, 200)
    second = _run_client(connect_server.url, log, table, ck, tmp_path / "r2.json")
    assert second["query_id"] == first["query_id"]  # the checkpoint keeps the query id
    assert dict(map(tuple, second["rows"])) == rows == _live(table)
    # Both runs committed under one application id, derived from the query id that Connect exposes.
    app = f"cdc-tunnel-{first['query_id']}"
    assert DeltaTable(str(table)).transaction_version(app) == second["batches"] - 1
