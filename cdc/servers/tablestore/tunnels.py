"""Tunnels and their channels: creation (snapshot and stream start positions), status, lineage, expiry.

Base-data channels (``BaseData`` / ``BaseAndStream``) read a snapshot of one shard's rows taken when the
tunnel was created (materialised then, so reads are repeatable); stream channels read one shard's change
log from the position it had when the tunnel was created (or from its start for shards opened later). The
hand-off is exact: the snapshot and the stream start positions are taken under the same lock.

A channel's **parents** are the channels of the shards it was split/merged from (the shards tell the
tunnels through :class:`~.shards.ShardListener`); for the stream channels of a ``BaseAndStream`` tunnel's
first shards, every base-data channel (the stage switch). A channel is ``WAIT`` until every parent's
checkpoint is ``"finished"``.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Sequence
from typing import Any

from .clients import Clients
from .database import Database
from .errors import OTSError, param_invalid
from .rows import ACTION_PUT
from .shards import Shards
from .tables import Tables, now_ms
from .tokens import FINISHED, make_token, parse_token

log = logging.getLogger(__name__)

TUNNEL_TYPES = ("BaseData", "Stream", "BaseAndStream")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tunnels(
    tunnel_id TEXT PRIMARY KEY, tbl TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    stage TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS channels(
    tunnel_id TEXT NOT NULL, channel_id TEXT NOT NULL, kind TEXT NOT NULL, shard_id TEXT NOT NULL,
    parents TEXT NOT NULL, start_pos INTEGER NOT NULL, checkpoint TEXT NOT NULL, seqno INTEGER NOT NULL,
    owner TEXT, version INTEGER NOT NULL, ord INTEGER NOT NULL, PRIMARY KEY(tunnel_id, channel_id));
CREATE TABLE IF NOT EXISTS base(tunnel_id TEXT NOT NULL, channel_id TEXT NOT NULL, idx INTEGER NOT NULL,
    record BLOB NOT NULL, PRIMARY KEY(tunnel_id, channel_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS expired_tunnels(tunnel_id TEXT PRIMARY KEY, reason TEXT NOT NULL);
"""
_CHANNEL_COLUMNS = "channel_id, kind, shard_id, parents, start_pos, checkpoint, seqno, owner, version"


class Tunnels:
    """Tunnel catalog and channel state; follows the shards (a :class:`~.shards.ShardListener`)."""

    def __init__(self, db: Database, tables: Tables, shards: Shards, clients: Clients) -> None:
        self.db = db
        self.tables = tables
        self.shards = shards
        self.clients = clients
        db.create(_SCHEMA)
        shards.subscribe(self)
        clients.on_gone(self.release_client)

    # ------------------------------------------------------------------ shard events
    def children_opened(
        self, db: sqlite3.Connection, table: str, parents: list[str], children: list[str]
    ) -> None:
        """Every stream tunnel that has a parent's channel gets the children's channels (in WAIT)."""
        for (tunnel_id,) in db.execute(
            "SELECT tunnel_id FROM tunnels WHERE tbl=? AND type IN ('Stream', 'BaseAndStream')", (table,)
        ).fetchall():
            present = {
                r[0]
                for r in db.execute(
                    "SELECT channel_id FROM channels WHERE tunnel_id=? AND kind='Stream'", (tunnel_id,)
                )
            }
            tunnel_parents = [p for p in parents if p in present]
            if not tunnel_parents:
                continue  # the tunnel never had the parent (created after it was sealed)
            for child in children:
                self._insert_channel(db, tunnel_id, child, "Stream", child, tunnel_parents, 0)

    def log_trimmed(self, db: sqlite3.Connection, shard_id: str, upto: int) -> None:
        """A BaseAndStream tunnel still in its base-data stage that loses undelivered records expires.

        As when the service's incremental logs outlive the 7-day retention before the full data was
        consumed: ``OTSTunnelExpired`` from then on.
        """
        for (tunnel_id,) in db.execute(
            "SELECT c.tunnel_id FROM channels c JOIN tunnels t ON t.tunnel_id=c.tunnel_id "
            "WHERE c.shard_id=? AND c.kind='Stream' AND c.start_pos<? AND t.type='BaseAndStream' "
            "AND t.stage='ProcessBaseData'",
            (shard_id, upto),
        ).fetchall():
            db.execute(
                "INSERT OR IGNORE INTO expired_tunnels VALUES (?, ?)",
                (
                    tunnel_id,
                    f"the incremental log of shard {shard_id} expired before the tunnel finished its base data",
                ),
            )
            log.info("tunnel %s expired: its stream log was trimmed during its base-data stage", tunnel_id)

    def release_client(self, db: sqlite3.Connection, client_id: str) -> None:
        db.execute("UPDATE channels SET owner=NULL WHERE owner=?", (client_id,))

    # ------------------------------------------------------------------ tunnels
    def _insert_channel(
        self,
        db: sqlite3.Connection,
        tunnel_id: str,
        channel_id: str,
        kind: str,
        shard_id: str,
        parents: list[str],
        start: int,
    ) -> None:
        order = db.execute(
            "SELECT COALESCE(MAX(ord), 0) + 1 FROM channels WHERE tunnel_id=?", (tunnel_id,)
        ).fetchone()[0]
        db.execute(
            "INSERT INTO channels VALUES (?, ?, ?, ?, ?, ?, ?, 0, NULL, 0, ?)",
            (
                tunnel_id,
                channel_id,
                kind,
                shard_id,
                json.dumps(parents),
                start,
                make_token(channel_id, start),
                order,
            ),
        )

    def create(self, table: str, name: str, tunnel_type: str) -> str:
        if tunnel_type not in TUNNEL_TYPES:
            raise param_invalid(f"tunnel type {tunnel_type!r}: expected BaseData, Stream or BaseAndStream")
        if not name:
            raise param_invalid("tunnel name is empty")
        with self.db.txn() as db:
            self.tables.get(table)
            if db.execute("SELECT 1 FROM tunnels WHERE tbl=? AND name=?", (table, name)).fetchone():
                raise OTSError("OTSTunnelExist", f"tunnel {name!r} already exists on table {table}", 409)
            tunnel_id = str(uuid.uuid4())
            stage = "ProcessStream" if tunnel_type == "Stream" else "ProcessBaseData"
            db.execute(
                "INSERT INTO tunnels VALUES (?, ?, ?, ?, ?, ?)",
                (tunnel_id, table, name, tunnel_type, stage, now_ms()),
            )
            base_ids: list[str] = []
            shards = self.shards.open_shards(table)
            if tunnel_type in ("BaseData", "BaseAndStream"):
                for shard in shards:
                    channel_id = f"{shard.shard_id}-base"
                    base_ids.append(channel_id)
                    hi_clause, args = ("AND k<?", (shard.hi,)) if shard.hi is not None else ("", ())
                    # One statement copies the shard's rows: the snapshot costs no round trip per row.
                    db.execute(
                        "INSERT INTO base SELECT ?, ?, ROW_NUMBER() OVER (ORDER BY k), row FROM rows "
                        f"WHERE tbl=? AND k>=? {hi_clause}",
                        (tunnel_id, channel_id, table, shard.lo, *args),
                    )
                    self._insert_channel(db, tunnel_id, channel_id, "BaseData", shard.shard_id, [], 0)
            if tunnel_type in ("Stream", "BaseAndStream"):
                for shard in shards:
                    self._insert_channel(
                        db,
                        tunnel_id,
                        shard.shard_id,
                        "Stream",
                        shard.shard_id,
                        base_ids,
                        self.shards.last_seq(shard.shard_id),
                    )
        log.info("created %s tunnel %s (%s) on table %s", tunnel_type, name, tunnel_id, table)
        return tunnel_id

    def get(self, tunnel_id: str) -> tuple[str, str, str, str, str, int]:
        """``(tunnel_id, table, name, type, stage, created_ms)``; OTSParameterInvalid if unknown."""
        r = self.db.execute(
            "SELECT tunnel_id, tbl, name, type, stage, created_ms FROM tunnels WHERE tunnel_id=?",
            (tunnel_id,),
        ).fetchone()
        if r is None:
            raise param_invalid(f"tunnel {tunnel_id!r} does not exist")
        return r  # type: ignore[no-any-return]

    def find(self, table: str, name: str, tunnel_id: str | None) -> str:
        with self.db.lock:
            if tunnel_id:
                self.get(tunnel_id)
                return tunnel_id
            r = self.db.execute(
                "SELECT tunnel_id FROM tunnels WHERE tbl=? AND name=?", (table, name)
            ).fetchone()
            if r is None:
                raise param_invalid(f"tunnel {name!r} does not exist on table {table!r}")
            return str(r[0])

    def delete(self, tunnel_id: str) -> None:
        with self.db.txn() as db:
            self.get(tunnel_id)
            self._drop(db, tunnel_id)

    def _drop(self, db: sqlite3.Connection, tunnel_id: str) -> None:
        for sql in (
            "DELETE FROM base WHERE tunnel_id=?",
            "DELETE FROM channels WHERE tunnel_id=?",
            "DELETE FROM tunnels WHERE tunnel_id=?",
            "DELETE FROM expired_tunnels WHERE tunnel_id=?",
        ):
            db.execute(sql, (tunnel_id,))
        self.clients.drop_tunnel(db, tunnel_id)

    def drop_table(self, db: sqlite3.Connection, table: str) -> None:
        for (tunnel_id,) in db.execute("SELECT tunnel_id FROM tunnels WHERE tbl=?", (table,)).fetchall():
            self._drop(db, tunnel_id)

    def info(self, tunnel_id: str) -> dict[str, Any]:
        with self.db.lock:
            tid, table, name, ttype, stage, created = self.get(tunnel_id)
            return {
                "tunnel_id": tid,
                "table": table,
                "name": name,
                "type": ttype,
                "stage": stage,
                "created_ms": created,
                "stream_id": self.tables.get(table).stream.get("stream_id", ""),
                "expired": self._expiry(tid) is not None,
            }

    def _expiry(self, tunnel_id: str) -> str | None:
        r = self.db.execute("SELECT reason FROM expired_tunnels WHERE tunnel_id=?", (tunnel_id,)).fetchone()
        return None if r is None else str(r[0])

    def check_not_expired(self, tunnel_id: str) -> None:
        reason = self._expiry(tunnel_id)
        if reason is not None:
            raise OTSError("OTSTunnelExpired", f"tunnel {tunnel_id} has expired: {reason}", 400)

    def list_all(self, table: str | None) -> list[dict[str, Any]]:
        with self.db.lock:
            if table:
                self.tables.get(table)
                ids = [
                    r[0]
                    for r in self.db.execute(
                        "SELECT tunnel_id FROM tunnels WHERE tbl=? ORDER BY created_ms", (table,)
                    )
                ]
            else:
                ids = [r[0] for r in self.db.execute("SELECT tunnel_id FROM tunnels ORDER BY created_ms")]
            return [self.info(t) for t in ids]

    def describe(self, tunnel_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        with self.db.lock:
            self.clients.expire()
            channels = self.channels(tunnel_id)
            for c in channels:
                c["consume_point_ns"] = self.consume_point_ns(c)
            return self.info(tunnel_id), channels

    def advance_stage(self, db: sqlite3.Connection, tunnel_id: str) -> None:
        """A BaseAndStream tunnel moves to ProcessStream once every base-data channel is finished."""
        _, _, _, ttype, stage, _ = self.get(tunnel_id)
        if ttype != "BaseAndStream" or stage != "ProcessBaseData":
            return
        pending = db.execute(
            "SELECT COUNT(*) FROM channels WHERE tunnel_id=? AND kind='BaseData' AND checkpoint<>?",
            (tunnel_id, FINISHED),
        ).fetchone()[0]
        if pending == 0:
            db.execute("UPDATE tunnels SET stage='ProcessStream' WHERE tunnel_id=?", (tunnel_id,))

    # ------------------------------------------------------------------ channels
    @staticmethod
    def _channel_dict(r: Sequence[Any]) -> dict[str, Any]:
        return {
            "channel_id": r[0],
            "kind": r[1],
            "shard_id": r[2],
            "parents": json.loads(r[3]),
            "start_pos": r[4],
            "checkpoint": r[5],
            "seqno": r[6],
            "owner": r[7],
            "version": r[8],
        }

    def _set_status(self, c: dict[str, Any], finished: set[str]) -> None:
        c["sealed"] = c["kind"] == "BaseData" or self.shards.is_sealed(c["shard_id"])
        c["held_from"] = c["start_pos"]  # the first position still readable (records after it are held)
        if c["kind"] != "BaseData":
            trimmed = self.shards.trimmed_upto(c["shard_id"])
            if trimmed is not None:
                c["held_from"] = max(c["start_pos"], trimmed)
        if c["checkpoint"] == FINISHED:
            c["status"] = "TERMINATED"
        elif any(p not in finished for p in c["parents"]):
            c["status"] = "WAIT"
        elif c["owner"] and self.clients.alive(c["owner"]):
            c["status"] = "OPEN"
        else:
            c["status"] = "CLOSE"

    def channels(self, tunnel_id: str) -> list[dict[str, Any]]:
        """Every channel of the tunnel with its status, in creation order."""
        rows = self.db.execute(
            f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE tunnel_id=? ORDER BY ord", (tunnel_id,)
        ).fetchall()
        chans = [self._channel_dict(r) for r in rows]
        finished = {c["channel_id"] for c in chans if c["checkpoint"] == FINISHED}
        for c in chans:
            self._set_status(c, finished)
        return chans

    def channel(self, tunnel_id: str, channel_id: str) -> dict[str, Any]:
        """One channel with its status (without describing the whole tunnel: reads stay O(1))."""
        r = self.db.execute(
            f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE tunnel_id=? AND channel_id=?",
            (tunnel_id, channel_id),
        ).fetchone()
        if r is None:
            raise param_invalid(f"channel {channel_id!r} does not exist in tunnel {tunnel_id}")
        c = self._channel_dict(r)
        finished: set[str] = set()
        if c["parents"]:
            marks = ",".join("?" * len(c["parents"]))
            finished = {
                row[0]
                for row in self.db.execute(
                    f"SELECT channel_id FROM channels WHERE tunnel_id=? AND checkpoint=? AND channel_id IN ({marks})",
                    (tunnel_id, FINISHED, *c["parents"]),
                )
            }
        self._set_status(c, finished)
        return c

    def set_owner(
        self,
        db: sqlite3.Connection,
        tunnel_id: str,
        channel_id: str,
        owner: str | None,
        version: int | None = None,
    ) -> None:
        if version is None:
            db.execute(
                "UPDATE channels SET owner=? WHERE tunnel_id=? AND channel_id=?",
                (owner, tunnel_id, channel_id),
            )
        else:
            db.execute(
                "UPDATE channels SET owner=?, version=? WHERE tunnel_id=? AND channel_id=?",
                (owner, version, tunnel_id, channel_id),
            )

    def give_back(self, db: sqlite3.Connection, tunnel_id: str, channel_id: str, client_id: str) -> None:
        """Release a channel if ``client_id`` holds it."""
        db.execute(
            "UPDATE channels SET owner=NULL WHERE tunnel_id=? AND channel_id=? AND owner=?",
            (tunnel_id, channel_id, client_id),
        )

    def consume_point_ns(self, channel: dict[str, Any]) -> int:
        """The channel's consumption point, as the service reports it in ``channel_rpo``: nanoseconds since
        the epoch before which every change has been checkpointed. SDKs show ``now - point`` as the RPO.

        It is the commit time of the first change after the checkpoint (less one microsecond), or now when
        nothing is left to consume; base-data channels carry no commit times and report 0, like the service.
        """
        now = time.time_ns()
        if channel["kind"] == "BaseData":
            return 0
        if channel["checkpoint"] == FINISHED:
            return now
        try:
            after = parse_token(channel["checkpoint"], channel["channel_id"])
        except OTSError:
            after = channel["start_pos"]
        r = self.db.execute(
            "SELECT ts FROM log WHERE shard_id=? AND seq>? ORDER BY seq LIMIT 1", (channel["shard_id"], after)
        ).fetchone()
        return now if r is None else (int(r[0]) - 1) * 1000

    def save_checkpoint(
        self, db: sqlite3.Connection, tunnel_id: str, channel_id: str, token: str, seqno: int, owner: str
    ) -> None:
        db.execute(
            "UPDATE channels SET checkpoint=?, seqno=?, owner=? WHERE tunnel_id=? AND channel_id=?",
            (token, seqno, owner, tunnel_id, channel_id),
        )

    def read_base(
        self, tunnel_id: str, channel_id: str, after: int, limit: int
    ) -> list[tuple[int, int, bytes]]:
        """Up to ``limit`` snapshot records ``(idx, PUT, record)`` after position ``after``."""
        return self.db.execute(
            "SELECT idx, ?, record FROM base WHERE tunnel_id=? AND channel_id=? AND idx>? ORDER BY idx LIMIT ?",
            (ACTION_PUT, tunnel_id, channel_id, after, limit),
        ).fetchall()

    def base_end(self, tunnel_id: str, channel_id: str) -> int:
        return int(
            self.db.execute(
                "SELECT COALESCE(MAX(idx), 0) FROM base WHERE tunnel_id=? AND channel_id=?",
                (tunnel_id, channel_id),
            ).fetchone()[0]
        )
