"""The official Node.js Tablestore SDK (npm ``tablestore``, pinned in ``tests/sdks/node/``) against the local
server: an independent encoder of the wire format, so that the server is not proven only by the Python SDK
and our own client, which could share our misreadings of the protocol.

``tests/sdks/node/table_api.js`` asserts each call against its own model of the table; this side then reads
the table the Node SDK wrote with the Python SDK and compares the two readings. ``make node-sdk`` installs
the SDK (``make test`` does it first).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tablestore import INF_MAX, INF_MIN, Direction

from cdc.servers.tablestore import TablestoreProcess

NODE_DIR = Path(__file__).parent / "node"
TABLE = "node_sdk"


def _plain(value: Any) -> Any:
    """A value as table_api.js writes it out (int64 as a decimal string, binary as base64)."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return {"int": str(value)}
    if isinstance(value, float):
        return {"double": value}
    if isinstance(value, bytes | bytearray):
        return {"blob": base64.b64encode(bytes(value)).decode("ascii")}
    raise AssertionError(f"unexpected value type {type(value).__name__}: {value!r}")


def _python_sdk_rows(server: TablestoreProcess) -> list[dict[str, Any]]:
    client = server.ots_client()
    start: Any = [("pk_int", INF_MIN), ("pk_str", INF_MIN)]
    end = [("pk_int", INF_MAX), ("pk_str", INF_MAX)]
    rows: list[dict[str, Any]] = []
    while start is not None:
        _, start, page, _ = client.get_range(TABLE, Direction.FORWARD, start, end, max_version=1, limit=50)
        for row in page:
            rows.append(
                {
                    "pk": [[name, _plain(value)] for name, value in row.primary_key],
                    "attrs": {name: _plain(value) for name, value, _ts in row.attribute_columns},
                }
            )
    return rows


def _run_node(server: TablestoreProcess) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "`node` is not on PATH: the Node.js SDK test needs Node.js 18+ (and `make node-sdk`)",
            pytrace=False,
        )
    if not (NODE_DIR / "node_modules" / "tablestore").is_dir():
        pytest.fail(
            f"the Node.js Tablestore SDK is not installed in {NODE_DIR}: run `make node-sdk`", pytrace=False
        )
    env = {
        **os.environ,
        "OTS_ENDPOINT": server.endpoint,
        "OTS_INSTANCE": server.instance,
        "OTS_ACCESS_KEY_ID": server.access_key_id,
        "OTS_ACCESS_KEY_SECRET": server.access_key_secret,
        "OTS_TABLE": TABLE,
    }
    proc = subprocess.run(
        [node, "table_api.js"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        pytest.fail(f"table_api.js exited with {proc.returncode}; its stderr:\n{proc.stderr}", pytrace=False)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_node_sdk_table_api(tablestore_server: TablestoreProcess) -> None:
    result = _run_node(tablestore_server)

    # 15 integers x 2 strings by putRow, one deleteRow, 5 batch puts and one batch delete.
    assert len(result["rows"]) == 33
    # The scans ran 4, 3 and 7 rows a page: paging, not one answer.
    assert result["pages"]["full"] >= 9
    assert result["pages"]["bounded"] >= 5
    assert result["pages"]["backward"] >= 5
    assert _python_sdk_rows(tablestore_server) == result["rows"]
