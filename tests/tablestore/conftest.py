"""Fixtures for the Tablestore pieces: a real local Tablestore server in a child process, per test.

``tablestore_server`` yields a :class:`cdc.servers.tablestore.TablestoreProcess`: ``endpoint``,
``instance``, ``access_key_id``, ``access_key_secret``, ``data_dir``; ``ots_client()`` (a real
``tablestore.OTSClient``); ``split(table, shard_id=None, split_key=None)``, ``merge(table,
shard_ids=None)``, ``shards(table)``; ``fault(kind, count=-1, seconds=0, path_prefix="")`` with kinds
``unavailable``/``drop``/``delay``, ``clear_faults()``, ``expire_client(client_id)``,
``trim(table, before_ms=None)`` (expire the change log: reads before it get ``OTSTrimmedDataAccess``); ``kill()`` (SIGKILL),
``stop()``, ``start()``, ``restart(crash=True)``. The server listens on 127.0.0.1 on a free port (the
same port across restarts) and is stopped at the end of the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.servers.tablestore import TablestoreProcess


@pytest.fixture
def tablestore_server(tmp_path: Path) -> Iterator[TablestoreProcess]:
    server = TablestoreProcess(
        tmp_path / "ots-data",
        instance="testinst",
        access_key_id="test-ak-id",
        access_key_secret="test-ak-secret",
        max_records_per_read=100,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
