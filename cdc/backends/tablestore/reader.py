"""Reading planned ranges: the executor side of ``backend=tablestore`` (picklable).

A range ``[start, end)`` (positions of :mod:`.positions`) is read from ``start.token``: drop
``start.skip`` records and take exactly ``end.n - start.n`` records along the ``next_token`` chain. Since
the record sequence after a token never changes, these are the planned records even when the server cuts
its responses differently now (the reader never needs to meet the end's token). The last record's key must
equal ``end.last``: a mismatch (a server that broke the token rule) is an error, never a silently
different batch. Records that expired since planning fail the read (the batch can no longer be produced).

A batch read's end may be left to the reader (``last = ["~head", micros]``, see
:data:`~.positions.HEAD_BOUND`): it then takes the records up to the head it finds, stopping at the first
one committed after micros (a base-data channel: up to its end), and at least the ``end.n - start.n``
records the plan saw.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from cdc.backend import Position, RangeReader
from cdc.backends.tablestore import handover
from cdc.backends.tablestore.connection import RecordPage, TunnelClient
from cdc.backends.tablestore.errors import ResourceGoneError, TunnelExpiredError, tunnel_expired
from cdc.backends.tablestore.plainbuffer import decode_row
from cdc.backends.tablestore.positions import FINISHED, HEAD_BOUND, TIME_BOUND, Pos, count_within, order_key
from cdc.backends.tablestore.records import RecordLayout, skip_past_page
from cdc.errors import PositionError

log = logging.getLogger(__name__)


class TunnelSession:
    """One tunnel client id plus the calls both the driver and executors make."""

    def __init__(
        self,
        client: TunnelClient,
        tunnel_id: str,
        client_id: str | None,
        timeout_s: int,
        label: str = "",
        query_tag: str | None = None,
    ) -> None:
        self.client = client
        self.tunnel_id = tunnel_id
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.label = label or f"tunnel {tunnel_id!r}"
        self.query_tag = query_tag
        self._lock = threading.Lock()

    def ensure_client(self) -> str:
        with self._lock:
            if self.client_id is None:
                try:
                    tag = handover.this_process(self.query_tag).tag()
                    self.client_id = self.client.connect(self.tunnel_id, self.timeout_s, client_tag=tag)
                except TunnelExpiredError as exc:
                    raise tunnel_expired(self.label, exc) from None
                log.info("connected to tunnel %s as client %s", self.tunnel_id, self.client_id)
            return self.client_id

    def reconnect(self, stale: str) -> str:
        with self._lock:
            if self.client_id == stale:
                self.client_id = None
        return self.ensure_client()

    def call(self, fn: Any, *args: Any) -> Any:
        cid = self.ensure_client()
        try:
            try:
                return fn(self.tunnel_id, cid, *args)
            except ResourceGoneError:
                log.info("tunnel client %s expired; reconnecting", cid)
                return fn(self.tunnel_id, self.reconnect(cid), *args)
        except TunnelExpiredError as exc:
            raise tunnel_expired(self.label, exc) from None

    def read(self, channel: str, token: str) -> RecordPage:
        page: RecordPage = self.call(self.client.read_records, channel, token)
        return page


class TablestoreRangeReader(RangeReader):
    """Reads planned ranges on executors (see the module docstring). Picklable."""

    def __init__(
        self,
        client: TunnelClient,
        tunnel_id: str,
        client_id: str | None,
        timeout_s: int,
        layout: RecordLayout,
        base_channels: frozenset[str],
        query_tag: str | None = None,
    ) -> None:
        self.client = client
        self.tunnel_id = tunnel_id
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.layout = layout
        self.base_channels = base_channels
        self.query_tag = query_tag

    def _session(self) -> TunnelSession:
        return TunnelSession(self.client, self.tunnel_id, self.client_id, self.timeout_s, query_tag=self.query_tag)

    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        s, e = Pos.parse(channel, start), Pos.parse(channel, end)
        count = e.n - s.n
        if count < 0:
            raise PositionError(f"channel {channel!r}: range end {end!r} lies before its start {start!r}")
        if e.last is not None and e.last[0] == HEAD_BOUND:
            yield from self._read_to_head(channel, s, count, e.last[1])
            return
        if count == 0:
            return
        session = self._session()
        base = channel in self.base_channels
        token, skip, produced = s.token, s.skip, 0
        last_record: Any = None
        # The next response is fetched while this one is decoded (the HTTP wait releases the GIL).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tablestore-prefetch") as pool:
            pending: Future[RecordPage] | None = None
            while produced < count:
                if token == FINISHED:
                    raise PositionError(
                        f"channel {channel!r}: the range [{start!r}, {end!r}) runs past the channel's end"
                    )
                page = pending.result() if pending is not None else session.read(channel, token)
                pending = None
                records = page.records
                if skip > len(records):
                    token, skip = skip_past_page(channel, start, page, token, skip)
                    continue
                take = list(records[skip : skip + count - produced])
                more = produced + len(take) < count
                at_head = page.next_token == token and skip + len(take) >= len(records)
                if more and not at_head and page.next_token != FINISHED:
                    pending = pool.submit(session.read, channel, page.next_token)
                if take:
                    yield self.layout.to_batch(channel, base, s.n + produced, take)
                    produced += len(take)
                    last_record = take[-1]
                if produced < count:
                    if at_head:
                        raise PositionError(
                            f"channel {channel!r}: only {produced} of the range's {count} records exist "
                            f"(range [{start!r}, {end!r}))"
                        )
                    token, skip = page.next_token, 0
        if e.last is not None and last_record is not None:
            got = order_key(decode_row(last_record.record), base)
            if got != e.last:
                raise PositionError(
                    f"channel {channel!r}: the range [{start!r}, {end!r}) now ends at record {got!r}, not the "
                    f"planned {e.last!r} (the server broke the token rule)"
                )

    def _read_to_head(self, channel: str, s: Pos, planned: int, micros: int) -> Iterator[pa.RecordBatch]:
        """A batch read's range whose end is left to the reader (see the module docstring)."""
        session = self._session()
        base = channel in self.base_channels
        bound = (TIME_BOUND, micros)
        token, skip, produced = s.token, s.skip, 0
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tablestore-prefetch") as pool:
            pending: Future[RecordPage] | None = None
            while True:
                page = pending.result() if pending is not None else session.read(channel, token)
                pending = None
                records = page.records
                if skip > len(records):
                    token, skip = skip_past_page(channel, s.to_json(), page, token, skip)
                    continue
                avail = len(records) - skip
                take = avail if base or avail == 0 else count_within(records, skip, base, bound)
                last_page = take < avail or page.finished or page.next_token == token
                if not last_page:
                    pending = pool.submit(session.read, channel, page.next_token)
                if take:
                    yield self.layout.to_batch(channel, base, s.n + produced, list(records[skip : skip + take]))
                    produced += take
                if last_page:
                    break
                token, skip = page.next_token, 0
        if produced < planned:
            raise PositionError(
                f"channel {channel!r}: only {produced} records from {s.to_json()!r} to the head, fewer than the "
                f"{planned} seen when planned (the server broke the token rule)"
            )
