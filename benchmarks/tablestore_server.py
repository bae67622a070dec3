"""Throughput of the local Tablestore server itself, so it is known not to bottleneck demos and benchmarks.

Measures, in one run: writes/s through the real SDK's ``BatchWriteRow`` (200 rows per call), records/s
served by ``/tunnel/readrecords`` over HTTP (signed requests, protobuf + PlainBuffer responses, records
decoded by the project's PlainBuffer reader), and, as the reference, records/s of the same reads made
in-process on the server's store (no HTTP, no decoding). The server runs as a child process, so the
client's Python work does not share its GIL. Last line: ``ratio <http/in-process>``.

    python benchmarks/tablestore_server.py [--quick] [--rows N]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import click
from record import append_record
from tablestore import (
    BatchWriteRowRequest,
    CapacityUnit,
    Condition,
    OTSClient,
    PutRowItem,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    TableInBatchWriteRowItem,
    TableMeta,
    TableOptions,
)
from tablestore.auth import RequestContext

from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.plainbuffer import decode_row
from cdc.servers.tablestore import LocalTablestore, TablestoreProcess


def _call(ots: OTSClient, name: str, request, response_type):  # type: ignore[no-untyped-def]
    uri = pb.URIS[name]
    body = request.SerializeToString()
    context = RequestContext(ots.credentials_provider.get_credentials())
    headers = ots.protocol._make_request_headers(body, uri, ots._signer, context)
    status, _, _, res_body = ots.connection.send_receive(uri, headers, body)
    if status >= 300:
        raise RuntimeError(pb.Error.FromString(res_body))
    return response_type.FromString(res_body)


def _read_http(ots: OTSClient, tunnel_id: str, client_id: str, channel: Any, decode: bool) -> int:
    token, count = channel.start_token, 0
    while True:
        request = pb.ReadRecordsRequest(
            tunnel_id=tunnel_id, client_id=client_id, channel_id=channel.channel_id, token=token
        )
        resp = _call(ots, "readrecords", request, pb.ReadRecordsResponse)
        if decode:
            for record in resp.records:
                decode_row(record.record)
        count += len(resp.records)
        if not resp.records:
            return count
        token = resp.next_token


@click.command()
@click.option("--quick", is_flag=True, help="Small run (well under a minute).")
@click.option("--rows", default=None, type=int, help="Rows to write (default 100000, --quick 20000).")
def main(quick: bool, rows: int | None) -> None:
    total = rows or (20_000 if quick else 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        with TablestoreProcess(data_dir) as server:  # a separate process: client and server don't share a GIL
            ots = server.ots_client()
            ots.create_table(
                TableMeta("bench", [("id", "INTEGER")]),
                TableOptions(),
                ReservedThroughput(CapacityUnit(0, 0)),
            )
            create = pb.CreateTunnelRequest(
                tunnel=pb.Tunnel(table_name="bench", tunnel_name="bench", tunnel_type=pb.Stream)
            )
            tunnel_id = _call(ots, "create", create, pb.CreateTunnelResponse).tunnel_id
            ignore = Condition(RowExistenceExpectation.IGNORE)
            started = time.perf_counter()
            for base in range(0, total, 200):
                request = BatchWriteRowRequest()
                items = [
                    PutRowItem(
                        Row([("id", i)], [("name", f"name-{i}"), ("amount", i * 1.5), ("n", i)]), ignore
                    )
                    for i in range(base, min(base + 200, total))
                ]
                request.add(TableInBatchWriteRowItem("bench", items))
                ots.batch_write_row(request)
            write_s = time.perf_counter() - started
            print(f"BatchWriteRow (real SDK, 200 rows/call): {total / write_s:,.0f} rows/s")

            client_id = _call(
                ots, "connect", pb.ConnectRequest(tunnel_id=tunnel_id), pb.ConnectResponse
            ).client_id
            describe = pb.DescribeTunnelRequest(table_name="", tunnel_name="", tunnel_id=tunnel_id)
            channel = _call(ots, "describe", describe, pb.DescribeTunnelResponse).channels[0]
            started = time.perf_counter()
            served = _read_http(ots, tunnel_id, client_id, channel, decode=False)
            http_s = time.perf_counter() - started
            started = time.perf_counter()
            decoded = _read_http(ots, tunnel_id, client_id, channel, decode=True)
            decode_s = time.perf_counter() - started
            assert served == decoded == total, (served, decoded, total)
            print(
                f"readrecords over HTTP (server's rate, {server.max_records_per_read}/call): {total / http_s:,.0f} records/s"
            )
            print(f"readrecords over HTTP + PlainBuffer decode: {total / decode_s:,.0f} records/s")

        with LocalTablestore(data_dir) as local:  # same data, in-process: the storage's own rate
            started = time.perf_counter()
            token, reference = channel.start_token, 0
            while True:
                result = local.store.read_records(tunnel_id, client_id, channel.channel_id, token)
                reference += len(result.records)
                if not result.records:
                    break
                token = result.next_token
            store_s = time.perf_counter() - started
        assert reference == total, (reference, total)
        print(f"readrecords in-process on the store (reference): {total / store_s:,.0f} records/s")
        append_record("tablestore_server", {"readrecords over HTTP": (total / http_s, "records/s"), "in-process store": (total / store_s, "records/s")}, ratio=store_s / http_s, params={"records": total})
        print(f"ratio {(total / http_s) / (total / store_s):.3f}")


if __name__ == "__main__":
    main()
