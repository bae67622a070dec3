"""Test helper: one table on a running local Tablestore server, written through the real SDK, with a
tunnel read through the backend, and the server's admin calls for splits and merges.

The server itself comes from the fixture in ``tests/backends/tablestore/conftest.py`` (the server helper's);
:class:`World` only needs its endpoint, instance, keys and admin calls.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tablestore as ots

from cdc.backends.tablestore import TablestoreBackend, TunnelClient
from cdc.backends.tablestore.options import TablestoreOptions
from cdc.options import parse
from cdc.testing import batches

_names = itertools.count()


CATALOG = json.dumps({"columns": {"id": {"type": "long"}, "v": {"type": "string"}, "n": {"type": "long"}}})


@dataclass
class World:
    """A table ``id INTEGER`` with value columns ``v`` (string) and ``n`` (long), and one tunnel."""

    server: Any
    tunnel_type: str = "Stream"
    table: str = field(default_factory=lambda: f"t{next(_names)}")
    tunnel: str = "cdc"
    extra_options: dict[str, str] = field(default_factory=dict)
    key_range: tuple[int, int] = (0, 1000)

    def __post_init__(self) -> None:
        s = self.server
        self.sdk = ots.OTSClient(s.endpoint, s.access_key_id, s.access_key_secret, s.instance)
        self.sdk.create_table(
            ots.TableMeta(self.table, [("id", "INTEGER")]),
            ots.TableOptions(),
            ots.ReservedThroughput(ots.CapacityUnit(0, 0)),
        )
        self.client = TunnelClient(s.endpoint, s.instance, s.access_key_id, s.access_key_secret)
        self.tunnel_id: str | None = None

    def create_tunnel(self) -> str:
        self.tunnel_id = self.client.create_tunnel(self.table, self.tunnel, self.tunnel_type)
        return self.tunnel_id

    def options(self, **extra: str) -> dict[str, str]:
        s = self.server
        return {
            "endpoint": s.endpoint,
            "instance.name": s.instance,
            "table.name": self.table,
            "tunnel.name": self.tunnel,
            "access.key.id": s.access_key_id,
            "access.key.secret": s.access_key_secret,
            "catalog": CATALOG,
            "tunnel.client.timeoutSeconds": "20",
            **self.extra_options,
            **extra,
        }

    def backend(self, **extra: str) -> TablestoreBackend:
        if self.tunnel_id is None:
            self.create_tunnel()
        return TablestoreBackend(parse(TablestoreOptions, self.options(**extra), what="backend 'tablestore'"))

    # ------------------------------------------------------------------ writes through the real SDK
    def put(self, key: int, v: str, n: int | None = None) -> None:
        cols: list[tuple[str, Any]] = [("v", v)] + ([("n", n)] if n is not None else [])
        self.sdk.put_row(
            self.table, ots.Row([("id", key)], cols), ots.Condition(ots.RowExistenceExpectation.IGNORE)
        )

    def update(self, key: int, v: str) -> None:
        row = ots.Row([("id", key)], {"put": [("v", v)], "delete_all": ["n"]})
        self.sdk.update_row(self.table, row, ots.Condition(ots.RowExistenceExpectation.IGNORE))

    def delete(self, key: int) -> None:
        self.sdk.delete_row(
            self.table, ots.Row([("id", key)]), ots.Condition(ots.RowExistenceExpectation.IGNORE)
        )

    def put_many(self, rows: Sequence[tuple[int, str]]) -> None:
        """BatchWriteRow in chunks of 200 (the service's limit)."""
        for i in range(0, len(rows), 200):
            items = [
                ots.PutRowItem(
                    ots.Row([("id", k)], [("v", v)]), ots.Condition(ots.RowExistenceExpectation.IGNORE)
                )
                for k, v in rows[i : i + 200]
            ]
            req = ots.BatchWriteRowRequest()
            req.add(ots.TableInBatchWriteRowItem(self.table, items))
            result = self.sdk.batch_write_row(req)
            assert result.is_all_succeed()

    # ------------------------------------------------------------------ partitions
    def split(self, shard_id: str | None = None) -> list[str]:
        """Split at the shard's median row, or (fewer than two rows) mid-way through its share of
        ``key_range``."""
        try:
            return list(self.server.split(self.table, shard_id)["children"])
        except RuntimeError as exc:
            if "give split_key" not in str(exc):
                raise
        shard = next(
            s for s in self.server.shards(self.table) if shard_id in (None, s["shard_id"]) and not s["sealed"]
        )
        lo = shard["lo"][0] if shard["lo"] and isinstance(shard["lo"][0], int) else self.key_range[0]
        hi = shard["hi"][0] if shard["hi"] and isinstance(shard["hi"][0], int) else self.key_range[1]
        return list(self.server.split(self.table, shard["shard_id"], [(lo + hi) // 2])["children"])

    def merge(self, shard_ids: Sequence[str] | None = None) -> str:
        return str(self.server.merge(self.table, None if shard_ids is None else list(shard_ids))["child"])

    def open_shards(self) -> list[str]:
        return [s["shard_id"] for s in self.server.shards(self.table) if not s["sealed"]]


drain = batches  # (end offset, records) per batch, read through a pickled reader
