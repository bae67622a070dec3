"""The server's state, composed of parts that share one database and its lock (:mod:`.database`).

* :mod:`.tables` - the schema catalog;   :mod:`.rows` - rows, reads and writes;
* :mod:`.shards` - partitions, their change logs, split/merge/trim;
* :mod:`.tunnels` - tunnels and channels (they follow the shards through a listener);
* :mod:`.clients` - tunnel clients and their expiry;   :mod:`.sessions` - a client's calls;
* :mod:`.tokens`, :mod:`.errors`.

:class:`Store` wires them together and is what the HTTP layer (:mod:`.service`, :mod:`.server`) calls.
Every method raises :class:`~.errors.OTSError` for service errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdc.backends.tablestore.plainbuffer import PrimaryKeyValue, Row

from .clients import Clients
from .database import Database
from .rows import Rows, WriteOp, WriteResult
from .sessions import ReadResult, Sessions
from .shards import Shards
from .tables import TableInfo, Tables
from .tunnels import Tunnels


class Store:
    """All state of one data directory."""

    def __init__(self, data_dir: Path, instance: str, max_records_per_read: int = 1000) -> None:
        self.instance = instance
        self.db = Database(data_dir)
        self.tables = Tables(self.db)
        self.partitions = Shards(self.db, self.tables)
        self.rows = Rows(self.db, self.tables, self.partitions)
        self.partitions.rows = self.rows
        self.clients = Clients(self.db)
        self.tunnels = Tunnels(self.db, self.tables, self.partitions, self.clients)
        self.sessions = Sessions(self.db, self.tunnels, self.clients, self.partitions, max_records_per_read)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ tables and rows
    def create_table(
        self,
        name: str,
        pk: list[tuple[str, str, bool]],
        defined: list[tuple[str, int]],
        options: dict[str, Any],
        stream: dict[str, Any],
    ) -> None:
        with self.db.txn() as db:
            self.tables.add(db, name, pk, defined, options, stream)
            self.partitions.open_root(db, name)

    def list_tables(self) -> list[str]:
        return self.tables.names()

    def table(self, name: str) -> TableInfo:
        return self.tables.get(name)

    def delete_table(self, name: str) -> None:
        with self.db.txn() as db:
            self.tables.get(name)
            self.tunnels.drop_table(db, name)
            self.rows.drop_table(db, name)
            self.partitions.drop_table(db, name)
            self.tables.drop(db, name)

    def get_row(self, table: str, pk: Sequence[tuple[str, PrimaryKeyValue]]) -> Row | None:
        return self.rows.get_row(table, pk)

    def get_range(
        self,
        table: str,
        start: Sequence[tuple[str, PrimaryKeyValue]],
        end: Sequence[tuple[str, PrimaryKeyValue]],
        forward: bool,
        limit: int,
    ) -> tuple[list[Row], bytes | None]:
        return self.rows.get_range(table, start, end, forward, limit)

    def split_points(self, table: str, split_bytes: int) -> list[Row]:
        return self.rows.split_points(table, split_bytes)

    def write(self, table: str, ops: Sequence[WriteOp]) -> list[WriteResult]:
        return self.rows.write(table, ops)

    # ------------------------------------------------------------------ shards (admin)
    def shards(self, table: str) -> list[dict[str, Any]]:
        return self.partitions.describe(table)

    def split(
        self, table: str, shard_id: str | None = None, split_key: Sequence[Any] | None = None
    ) -> dict[str, Any]:
        return self.partitions.split(table, shard_id, split_key)

    def merge(self, table: str, shard_ids: Sequence[str] | None = None) -> dict[str, Any]:
        return self.partitions.merge(table, shard_ids)

    def trim(self, table: str, before_ms: int) -> dict[str, int]:
        return self.partitions.trim(table, before_ms)

    # ------------------------------------------------------------------ tunnels and clients
    def create_tunnel(self, table: str, name: str, tunnel_type: str) -> str:
        return self.tunnels.create(table, name, tunnel_type)

    def find_tunnel(self, table: str, name: str, tunnel_id: str | None) -> str:
        return self.tunnels.find(table, name, tunnel_id)

    def delete_tunnel(self, tunnel_id: str) -> None:
        self.tunnels.delete(tunnel_id)

    def list_tunnels(self, table: str | None) -> list[dict[str, Any]]:
        return self.tunnels.list_all(table)

    def describe_tunnel(self, tunnel_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return self.tunnels.describe(tunnel_id)

    def expire_client(self, client_id: str) -> None:
        self.clients.expire_now(client_id)

    def connect(self, tunnel_id: str, timeout_s: int, tag: str | None) -> str:
        return self.sessions.connect(tunnel_id, timeout_s, tag)

    def heartbeat(
        self, tunnel_id: str, client_id: str, reported: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int, int]]:
        return self.sessions.heartbeat(tunnel_id, client_id, reported)

    def shutdown(self, tunnel_id: str, client_id: str) -> None:
        self.sessions.shutdown(tunnel_id, client_id)

    def get_checkpoint(self, tunnel_id: str, client_id: str, channel_id: str) -> tuple[str, int]:
        return self.sessions.get_checkpoint(tunnel_id, client_id, channel_id)

    def checkpoint(self, tunnel_id: str, client_id: str, channel_id: str, token: str, seqno: int) -> None:
        self.sessions.checkpoint(tunnel_id, client_id, channel_id, token, seqno)

    def read_records(self, tunnel_id: str, client_id: str, channel_id: str, token: str) -> ReadResult:
        return self.sessions.read_records(tunnel_id, client_id, channel_id, token)
