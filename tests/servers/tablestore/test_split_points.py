"""ComputeSplitPointsBySize on the local server: split points by stored size, as PlainBuffer primary keys in
increasing order, with location hints covering every range; the ranges they cut cover the table exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from tablestore import (
    INF_MAX,
    INF_MIN,
    CapacityUnit,
    Direction,
    OTSClient,
    ReservedThroughput,
    Row,
    TableMeta,
    TableOptions,
)
from tablestore.protobuf import table_store_pb2 as pb

from cdc.backends.tablestore.connection import TunnelClient
from cdc.backends.tablestore.errors import TablestoreError
from cdc.backends.tablestore.plainbuffer import decode_rows
from cdc.servers.tablestore import LocalTablestore


def _split(
    client: TunnelClient, table: str, size: int, unit: int | None = 1
) -> pb.ComputeSplitPointsBySizeResponse:
    req = pb.ComputeSplitPointsBySizeRequest(table_name=table, split_size=size)
    if unit is not None:
        req.split_size_unit_in_byte = unit
    return client.call("/ComputeSplitPointsBySize", req, pb.ComputeSplitPointsBySizeResponse)


def test_split_points_cut_the_table_into_ranges_of_about_the_asked_size(tmp_path: Path) -> None:
    with LocalTablestore(tmp_path) as server:
        sdk = OTSClient(server.endpoint, server.access_key_id, server.access_key_secret, server.instance)
        sdk.create_table(
            TableMeta("t", [("g", "STRING"), ("id", "INTEGER")]),
            TableOptions(),
            ReservedThroughput(CapacityUnit(0, 0)),
        )
        for i in range(120):
            sdk.put_row("t", Row([("g", f"g{i % 3}"), ("id", i)], [("v", "x" * 100)]))
        client = TunnelClient(
            server.endpoint, server.instance, server.access_key_id, server.access_key_secret
        )

        whole = _split(client, "t", 1, unit=None)  # in 100 MB when no unit is given: far more than the table
        assert list(whole.split_points) == []
        assert [(loc.location, loc.repeat) for loc in whole.locations] == [("", 1)]
        assert [(c.name, c.type) for c in whole.schema] == [("g", pb.STRING), ("id", pb.INTEGER)]
        assert (
            len(_split(client, "t", 1).split_points) == 119
        )  # a 1-byte split: a point before every row but one

        resp = _split(client, "t", 3000)  # ~175 stored bytes a row: a point every ~17 rows
        points = [decode_rows(p)[0].primary_key for p in resp.split_points]
        assert 5 <= len(points) <= 8, points
        assert all(len(p) == 2 for p in points)
        keys = [tuple(v for _, v in p) for p in points]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        assert sum(loc.repeat for loc in resp.locations) == len(points) + 1

        # the ranges [INF_MIN, p1), [p1, p2), ..., [pn, INF_MAX) hold every row once, in order
        bounds = [
            [("g", INF_MIN), ("id", INF_MIN)],
            *[list(p) for p in points],
            [("g", INF_MAX), ("id", INF_MAX)],
        ]
        seen, sizes = [], []
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            _, nxt, rows, _ = sdk.get_range("t", Direction.FORWARD, lo, hi, max_version=1)
            assert nxt is None
            sizes.append(len(rows))
            seen += [tuple(v for _, v in r.primary_key) for r in rows]
        _, _, everything, _ = sdk.get_range("t", Direction.FORWARD, bounds[0], bounds[-1], max_version=1)
        assert seen == [tuple(v for _, v in r.primary_key) for r in everything] and len(seen) == 120
        assert max(sizes[:-1]) - min(sizes[:-1]) <= 1  # rows are the same size: ranges are too

        with pytest.raises(TablestoreError, match="split size"):
            _split(client, "t", 0)
        with pytest.raises(TablestoreError):
            _split(client, "missing", 3000)
        client.close()
