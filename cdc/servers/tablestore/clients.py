"""Tunnel clients: connected workers that expire ``timeout`` seconds after their last call.

Clients are stored, so they survive a restart until they time out. Whoever hands channels to clients
(the tunnels) subscribes to :meth:`Clients.on_gone` to free a client's channels when it expires or
shuts down.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable

from .database import Database
from .errors import OTSError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300

_SCHEMA = """
CREATE TABLE IF NOT EXISTS clients(client_id TEXT PRIMARY KEY, tunnel_id TEXT NOT NULL,
    timeout_s INTEGER NOT NULL, last_seen REAL NOT NULL, tag TEXT);
"""

GoneHook = Callable[[sqlite3.Connection, str], None]


class Clients:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)
        self._gone_hooks: list[GoneHook] = []

    def on_gone(self, hook: GoneHook) -> None:
        """Call ``hook(db, client_id)`` inside the transaction that removes a client."""
        self._gone_hooks.append(hook)

    def add(self, db: sqlite3.Connection, tunnel_id: str, timeout_s: int, tag: str | None) -> str:
        # like the service: the client tag (the Java worker's default: the hostname), then a random string
        client_id = f"{tag}{uuid.uuid4().hex[:16]}" if tag else f"{tunnel_id}-{uuid.uuid4().hex[:16]}"
        db.execute(
            "INSERT INTO clients VALUES (?, ?, ?, ?, ?)",
            (client_id, tunnel_id, timeout_s if timeout_s > 0 else DEFAULT_TIMEOUT_S, time.time(), tag),
        )
        return client_id

    def alive(self, client_id: str) -> bool:
        r = self.db.execute(
            "SELECT timeout_s, last_seen FROM clients WHERE client_id=?", (client_id,)
        ).fetchone()
        return r is not None and time.time() - r[1] <= r[0]

    def expire(self) -> None:
        """Remove every client whose timeout has passed (their channels are freed by the hooks)."""
        now = time.time()
        dead = [
            r[0]
            for r in self.db.execute("SELECT client_id, timeout_s, last_seen FROM clients")
            if now - r[2] > r[1]
        ]
        if dead:
            with self.db.txn() as db:
                for client_id in dead:
                    self.remove(db, client_id)
                    log.info("tunnel client %s expired", client_id)

    def remove(self, db: sqlite3.Connection, client_id: str) -> None:
        for hook in self._gone_hooks:
            hook(db, client_id)
        db.execute("DELETE FROM clients WHERE client_id=?", (client_id,))

    def expire_now(self, client_id: str) -> None:
        """Admin: make a client expire now (as if it missed its heartbeats)."""
        with self.db.txn() as db:
            db.execute("UPDATE clients SET last_seen=0 WHERE client_id=?", (client_id,))

    def touch(self, tunnel_id: str, client_id: str) -> None:
        """A call by ``client_id`` on ``tunnel_id``: OTSResourceGone unless it is a live client of it."""
        self.expire()
        r = self.db.execute("SELECT tunnel_id FROM clients WHERE client_id=?", (client_id,)).fetchone()
        if r is None or r[0] != tunnel_id:
            raise OTSError(
                "OTSResourceGone", f"tunnel client {client_id!r} does not exist or has expired", 410
            )
        self.db.execute("UPDATE clients SET last_seen=? WHERE client_id=?", (time.time(), client_id))

    def drop_tunnel(self, db: sqlite3.Connection, tunnel_id: str) -> None:
        db.execute("DELETE FROM clients WHERE tunnel_id=?", (tunnel_id,))
