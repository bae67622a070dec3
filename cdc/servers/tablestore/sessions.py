"""What a connected tunnel client does: connect, heartbeat (channel hand-out), checkpoints, ReadRecords.

Heartbeat hands every free readable channel to the calling client and releases those it reports
``CLOSE``/``TERMINATED``; ReadRecords accepts any live client of the tunnel for any non-``WAIT`` channel;
Checkpoint needs the channel's owner, or a channel with no live owner (it then becomes the caller's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdc.backends.tablestore import tunnel_pb as tpb

from .clients import Clients
from .database import Database
from .errors import OTSError, param_invalid
from .shards import Shards
from .tokens import FINISHED, make_token, parse_token
from .tunnels import Tunnels

MAX_BYTES_PER_READ = 4 * 1024 * 1024


@dataclass
class ReadResult:
    records: list[tuple[int, bytes]]
    next_token: str
    more: bool


def _wait_error(channel_id: str) -> OTSError:
    return OTSError(
        "OTSPermissionDenied", f"channel {channel_id} is in WAIT: its parents are not finished", 403
    )


class Sessions:
    def __init__(
        self, db: Database, tunnels: Tunnels, clients: Clients, shards: Shards, max_records_per_read: int
    ) -> None:
        self.db = db
        self.tunnels = tunnels
        self.clients = clients
        self.shards = shards
        self.max_records_per_read = max_records_per_read

    def _live_client(self, tunnel_id: str, client_id: str) -> None:
        self.tunnels.get(tunnel_id)
        self.tunnels.check_not_expired(tunnel_id)
        self.clients.touch(tunnel_id, client_id)

    def connect(self, tunnel_id: str, timeout_s: int, tag: str | None) -> str:
        with self.db.txn() as db:
            self.tunnels.get(tunnel_id)
            self.tunnels.check_not_expired(tunnel_id)
            return self.clients.add(db, tunnel_id, timeout_s, tag)

    def heartbeat(
        self, tunnel_id: str, client_id: str, reported: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int, int]]:
        """Release the channels the client reports CLOSE/TERMINATED; hand it every free channel.

        Returns ``(channel_id, version, status)`` for the channels the client holds; channels whose
        checkpoint is ``"finished"`` are returned once as TERMINATED and released.
        """
        with self.db.lock:
            self._live_client(tunnel_id, client_id)
            with self.db.txn() as db:
                released = set()
                for channel_id, _version, status in reported:
                    if status in (tpb.CLOSE, tpb.TERMINATED):
                        released.add(channel_id)
                        self.tunnels.give_back(db, tunnel_id, channel_id, client_id)
                out: list[tuple[str, int, int]] = []
                for c in self.tunnels.channels(tunnel_id):
                    if c["status"] == "TERMINATED":
                        if c["owner"] == client_id:
                            self.tunnels.set_owner(db, tunnel_id, c["channel_id"], None)
                            out.append((c["channel_id"], c["version"], tpb.TERMINATED))
                    elif c["channel_id"] in released:
                        continue  # given back in this very heartbeat: left for other clients
                    elif c["status"] == "CLOSE" or (c["status"] == "OPEN" and c["owner"] == client_id):
                        version = c["version"] + (0 if c["owner"] == client_id else 1)
                        self.tunnels.set_owner(db, tunnel_id, c["channel_id"], client_id, version)
                        out.append((c["channel_id"], version, tpb.OPEN))
                return out

    def shutdown(self, tunnel_id: str, client_id: str) -> None:
        with self.db.lock:
            self._live_client(tunnel_id, client_id)
            with self.db.txn() as db:
                self.clients.remove(db, client_id)

    def get_checkpoint(self, tunnel_id: str, client_id: str, channel_id: str) -> tuple[str, int]:
        with self.db.lock:
            self._live_client(tunnel_id, client_id)
            c = self.tunnels.channel(tunnel_id, channel_id)
            return c["checkpoint"], c["seqno"]

    def checkpoint(self, tunnel_id: str, client_id: str, channel_id: str, token: str, seqno: int) -> None:
        with self.db.lock:
            self._live_client(tunnel_id, client_id)
            with self.db.txn() as db:
                c = self.tunnels.channel(tunnel_id, channel_id)
                if c["owner"] and c["owner"] != client_id and self.clients.alive(c["owner"]):
                    raise OTSError(
                        "OTSPermissionDenied",
                        f"channel {channel_id} is owned by another client ({c['owner']})",
                        403,
                    )
                if c["status"] == "WAIT":
                    raise _wait_error(channel_id)
                if seqno != c["seqno"] + 1:
                    raise OTSError(
                        "OTSSequenceNumberNotMatch",
                        f"sequence number {seqno} does not follow {c['seqno']} (expected {c['seqno'] + 1})",
                        400,
                    )
                if token == FINISHED:
                    if not c["sealed"]:
                        raise param_invalid(
                            f"channel {channel_id} is still open: it cannot be checkpointed as finished"
                        )
                else:
                    parse_token(token, channel_id)
                self.tunnels.save_checkpoint(db, tunnel_id, channel_id, token, seqno, client_id)
                if token == FINISHED:
                    self.tunnels.advance_stage(db, tunnel_id)

    def read_records(self, tunnel_id: str, client_id: str, channel_id: str, token: str) -> ReadResult:
        """At most ``max_records_per_read`` records (and about 4 MiB) after the token's position.

        ``next_token`` names the position after the last returned record (the same token when none), or
        is ``"finished"`` when the returned records reach the end of a sealed channel.
        """
        with self.db.lock:
            self._live_client(tunnel_id, client_id)
            c = self.tunnels.channel(tunnel_id, channel_id)
            if c["status"] == "WAIT":
                raise _wait_error(channel_id)
            if token == FINISHED:
                return ReadResult([], FINISHED, False)
            position = parse_token(token, channel_id)
            limit = self.max_records_per_read
            if c["kind"] == "BaseData":
                rows = self.tunnels.read_base(tunnel_id, channel_id, position, limit + 1)
                end = self.tunnels.base_end(tunnel_id, channel_id)
            else:
                trimmed = self.shards.trimmed_upto(c["shard_id"])
                if trimmed is not None and position < trimmed:
                    # What the service answers (its error-code reference, "HTTP 400 errors: stream"): the
                    # code is OTSTunnelServerUnavailable, the message starts with OTSTrimmedDataAccess.
                    raise OTSError(
                        "OTSTunnelServerUnavailable",
                        "OTSTrimmedDataAccess Requested stream data is already trimmed or does not exist. "
                        f"(channel {channel_id}: records up to position {trimmed} have expired; the token "
                        f"points at position {position})",
                        400,
                    )
                rows = self.shards.read_log(c["shard_id"], position, limit + 1)
                end = self.shards.last_seq(c["shard_id"])
            if position < c["start_pos"] or position > end:
                raise param_invalid(f"token position {position} is outside channel {channel_id}")
            more = len(rows) > limit
            rows = rows[:limit]
            size = 0
            for i, r in enumerate(rows):  # like the service, a response also stops at a size limit
                size += len(r[2])
                if size > MAX_BYTES_PER_READ and i > 0:
                    rows, more = rows[:i], True
                    break
            last = rows[-1][0] if rows else position
            if c["sealed"] and last == end:
                next_token = FINISHED
            else:
                next_token = make_token(channel_id, last) if rows else token
            return ReadResult([(r[1], bytes(r[2])) for r in rows], next_token, more)
