"""The local server under concurrent clients, and killed (SIGKILL) in the middle of a write stream."""

from __future__ import annotations

import threading
from typing import Any

from tablestore import (
    INF_MAX,
    INF_MIN,
    BatchWriteRowRequest,
    CapacityUnit,
    Condition,
    Direction,
    PutRowItem,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    TableInBatchWriteRowItem,
    TableMeta,
    TableOptions,
)

from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.plainbuffer import decode_row
from cdc.servers.tablestore import TablestoreProcess
from tests.servers.tablestore.tunnel_client import tunnel_of

IGNORE = Condition(RowExistenceExpectation.IGNORE)


def _keys(client: Any) -> list[int]:
    start, out = [("id", INF_MIN)], []
    while start is not None:
        _, start, rows, _ = client.get_range("t", Direction.FORWARD, start, [("id", INF_MAX)], max_version=1)
        out.extend(r.primary_key[0][1] for r in rows)
    return out


def _stream_ids(server: TablestoreProcess, tunnel_id: str) -> list[int]:
    tunnel = tunnel_of(server)
    client_id = tunnel.connect(tunnel_id)
    ids: list[int] = []
    for channel in tunnel.describe(tunnel_id).channels:
        records, _ = tunnel.read_all(tunnel_id, client_id, channel.channel_id, channel.start_token)
        ids.extend(decode_row(r.record).primary_key[0][1] for r in records)
    return ids


def _batch(first: int, size: int) -> BatchWriteRowRequest:
    request = BatchWriteRowRequest()
    items = [PutRowItem(Row([("id", i)], [("v", i)]), IGNORE) for i in range(first, first + size)]
    request.add(TableInBatchWriteRowItem("t", items))
    return request


def test_concurrent_writers_and_readers(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    client.create_table(
        TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )
    tunnel_id = tunnel_of(tablestore_server).create("t", "cdc", pb.Stream)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            own = tablestore_server.ots_client()
            for b in range(10):
                assert own.batch_write_row(_batch(w * 10_000 + b * 50, 50)).is_all_succeed()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(10):
                _stream_ids(tablestore_server, tunnel_id)
                _keys(tablestore_server.ots_client())
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    expected = sorted(w * 10_000 + i for w in range(4) for i in range(500))
    assert _keys(client) == expected
    assert sorted(_stream_ids(tablestore_server, tunnel_id)) == expected


def test_kill_during_writes_loses_no_acknowledged_write(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    client.create_table(
        TableMeta("t", [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )
    tunnel_id = tunnel_of(tablestore_server).create("t", "cdc", pb.Stream)
    acked: list[int] = []
    started = threading.Event()

    def writer() -> None:
        own = tablestore_server.ots_client()
        first = 0
        try:
            while True:
                own.batch_write_row(_batch(first, 20))
                acked.extend(range(first, first + 20))
                first += 20
                if first >= 400:
                    started.set()  # kill while writes keep coming
        except Exception:  # noqa: BLE001 - the kill ends the stream of writes
            return

    thread = threading.Thread(target=writer)
    thread.start()
    started.wait(30)
    tablestore_server.kill()
    thread.join(30)
    tablestore_server.start()
    client = tablestore_server.ots_client()
    keys = _keys(client)
    assert set(acked) <= set(keys), "an acknowledged write was lost"
    assert len(keys) % 20 == 0 and keys == list(range(len(keys)))  # a batch is applied whole or not at all
    assert sorted(_stream_ids(tablestore_server, tunnel_id)) == keys  # the change log agrees with the table
