"""``backend=tablestore``: a Tablestore Tunnel (BaseData, Stream or BaseAndStream) as a change log.

Channels are the tunnel's channels. A BaseData channel's records become ``snapshot`` changes; a stream
channel's PUT_ROW / UPDATE_ROW / DELETE_ROW become ``insert`` / ``update`` / ``delete``.

Files: :mod:`.records` (what a change says about the row: how records become change rows),
:mod:`.positions` (positions and ordering keys), :mod:`.reader` (reading planned ranges on executors),
this module (the driver: channels, lineage, planning, tunnel checkpoints).

Deterministic batches: the design
=================================

The tunnel hands out only opaque tokens: ``ReadRecords(token)`` returns some records and the token after
them, and how many records one call returns is the server's choice (a read at the head returns the few
that exist; the same token read later may return more). A batch's content must nevertheless be a pure
function of its offsets. What the design relies on (stated in :mod:`.tunnel_pb`): a token names a fixed
point of the channel's append-only log, ``next_token`` names the point right after the returned records,
so **the record sequence that follows a token, chaining ``next_token``, never changes**, however it is
cut into responses.

A position is therefore ``{"token": T, "skip": k, "n": n, "last": key}``: the gap ``k`` records after the
point ``T`` names; ``n`` counts the records before the gap since the query's origin (the channel's start
token), and ``last`` is the ordering key of the record just before the gap (stream records:
``[epoch, timestamp, row_index]`` from the sequence info; base-data records: the primary key, which is
how base ranges are exported), or null at the origin.

* **Planning** (driver) walks from ``start``: read ``start.token``, drop ``skip`` records, take up to the
  budget; a response consumed whole moves on to ``(next_token, 0)``, so positions stay close to the
  head and re-reads stay short. The end is where the walk stopped: inside a response ``(T, k')``, at
  the head, or ``{"token": "finished"}`` once a read answered ``next_token == "finished"``.
* **Reading** (executor) starts at ``start.token``, drops ``start.skip`` records and takes exactly
  ``end.n - start.n`` records along the ``next_token`` chain. Since the chain's sequence is fixed, the
  records are the planned ones even when the responses are cut differently now (the executor never
  needs to meet the end's token). The last record's key must equal ``end.last``: a mismatch (a server
  that broke the token rule) is an error, never a silently different batch.
* **Bounds** (``until``, e.g. ``Trigger.AvailableNow``) compare ordering keys, which are strictly
  increasing within a channel, so a bound works whatever origin it was computed from. A channel in
  ``WAIT`` cannot be read, so its ``latest`` is a time bound (``last = ["~time", micros]``: every record
  committed until then), which a later plan resolves against the records once the channel opens.
* **Planning re-reads little**: the driver keeps a summary (count, next token, last key) of every
  response it read; that summary stays true even if the token later returns more records, so a walk
  that consumes a response whole never reads it again (``latest`` and the next plan share the work).

Batch reads
-----------
A batch read to the head (``spark.read``, ``endingOffsets=latest``) has no offset log and nothing replays
it, so its end need not be counted on the driver, which would read every record once more than the
executors do (the walk runs at the server's rate: it cost as much as the whole read). Its end is left to
the reader (rule 6 of :mod:`cdc.backend`): :meth:`batch_read_end` is the time bound "every record committed
until now" (``last = ["~head", micros]``), the plan reads only the range's first response (data loss and
empty channels still surface on the driver) and the executor reads up to the head, stopping at the first
record committed after the bound. What a task retry reads: the same records, unless a record committed
before the bound became readable only after the first attempt passed the head (the local server makes a
record readable when it commits it); the bound is the driver's clock, so a driver clock behind the
service's leaves out the records of that difference. A budgeted plan (``maxRecordsPerChannel``) and every
streaming plan count their ends as above.

Channels, lineage and the tunnel's own state
--------------------------------------------
Channel statuses: ``WAIT`` (a child whose parents are not finished), ``OPEN``, ``CLOSING``, ``CLOSE``,
``TERMINATED``. The tunnel protocol has no lineage, so the local server reports the parents of a split or
merge child in the ``parent_channel_ids`` extension of ``ChannelInfo`` (and ``sealed``, ``start_token``;
see :mod:`.tunnel_pb`); for a BaseAndStream tunnel the backend also makes every BaseData channel a
parent of each root stream channel, so a key's snapshot always precedes its changes. The planner
(:mod:`cdc.planner`) then delivers a child only after every parent was completely delivered.

``acknowledge`` (Spark's commit) moves each channel's tunnel checkpoint to the committed position's
token (``"finished"`` for a finished channel) with sequence number ``current + 1``
(``OTSSequenceNumberNotMatch`` after a lost race: it re-reads the checkpoint and retries once). The one
exception: the service keeps a child in ``WAIT`` until its parents' checkpoints are ``"finished"``, and
Spark commits a batch only after the next one was planned; so when the planner asks for a ``WAIT``
child (it only does once every parent is completely delivered by durable, planned batches) the backend
checkpoints those parents ``"finished"`` right away instead of costing two more micro-batches.
Correctness never depends on the tunnel's checkpoints: Spark's offset log holds every position.

After a crash, the dead run's tunnel client keeps its channels until ``tunnel.client.timeoutSeconds``
pass, and until then their checkpoints cannot move (WAIT children wait). The backend tags its clients
with its process's identity and, when it connects (and when finishing a WAIT child's parents fails),
shuts down the clients holding channels that are provably leftovers: of a process on this host that is
gone, or of another process with the same ``tunnel.client.tag`` (see :mod:`.handover`).

A channel's earliest position is its ``start_token`` (local server), else the tunnel's checkpoint (the
real service cannot name a channel's beginning once its checkpoint moved).

Expired records and tunnels
---------------------------
The service drops stream records older than the stream's retention. Reading a token inside the dropped
part fails (HTTP 400 ``OTSTunnelServerUnavailable``, message ``OTSTrimmedDataAccess ...``; not retried):
:class:`~.errors.TrimmedDataError`, a :class:`~cdc.errors.DataLossError` naming the tunnel and channel.
A batch's plan always reads its start token (even when a summary of that response is cached), so the
loss surfaces while planning, where ``failOnDataLoss`` decides: by default the query fails; with
``failOnDataLoss=false`` the planner logs it and restarts the channel at :meth:`earliest` (the
``start_token``, which the local server moves to the first record still held), recording that position
in the offset (``from``) so replays read the same records; ``n`` goes on from where the loss was found,
so ``_position`` keeps increasing. Against the real service, which names no earliest held record, the
earliest is the tunnel's checkpoint, which may itself have expired: the skip then fails with the same
error. Records that expire between planning and reading fail the read (the batch can no longer be
produced). A tunnel whose incremental log expired before it was consumed (a BaseAndStream tunnel whose
base data took longer than the retention) answers ``OTSTunnelExpired``: nothing can be skipped to, so
that is a terminal :class:`~.errors.TunnelExpiredError` naming the tunnel and telling to recreate it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from cdc.backend import Backend, ChannelHead, ChannelInfo, PlannedRange, Position, RangeReader
from cdc.backends.tablestore import handover
from cdc.backends.tablestore.connection import RetrySettings, TunnelClient
from cdc.backends.tablestore.errors import (
    ObjectNotExistError,
    ParameterInvalidError,
    ResourceGoneError,
    SequenceNumberMismatchError,
    TablestoreError,
    TrimmedDataError,
    tunnel_expired,
)
from cdc.backends.tablestore.options import TablestoreOptions
from cdc.backends.tablestore.plainbuffer import decode_row
from cdc.backends.tablestore.positions import (
    FINISHED,
    HEAD_BOUND,
    TIME_BOUND,
    Pos,
    count_within,
    order_key,
    within,
)
from cdc.backends.tablestore.reader import TablestoreRangeReader, TunnelSession
from cdc.backends.tablestore.records import skip_past_page, table_layout
from cdc.errors import OptionError, PositionError
from cdc.options import BackendOptions

log = logging.getLogger(__name__)

_PAGE_CACHE_SIZE = 20_000


@dataclass(frozen=True)
class _PageSummary:
    """What planning needs of one ReadRecords response. Valid forever, even if the same token later
    returns more records: ``next_token`` names the point after these ``count`` records."""

    count: int
    next_token: str
    last: tuple[Any, ...]
    finished: bool


class TablestoreBackend(Backend):
    """Reads one tunnel of one Tablestore table. See the module docstring for positions and lineage."""

    name = "tablestore"
    orders_keys = True  # every key's changes reach the query in sequence order (see Backend.orders_keys)
    options_model = TablestoreOptions
    options: TablestoreOptions

    @classmethod
    def register_spark(cls, spark: Any) -> None:
        """``format("tablestore")``: a table's current rows, batch only, with filters pushed down."""
        from cdc.backends.tablestore.scan_source import TablestoreTableSource

        spark.dataSource.register(TablestoreTableSource)

    def __init__(self, options: TablestoreOptions) -> None:
        super().__init__(options)
        key_id, secret, token = options.credentials()
        self.client = TunnelClient(
            options.endpoint,
            options.instance_name,
            key_id,
            secret,
            sts_token=token,
            socket_timeout=options.socket_timeout,
            retry=RetrySettings(attempts=options.max_attempts),
        )
        self.table = options.table_name
        self.layout = table_layout(self.client, options)  # first: a missing table is reported as such
        self.tunnel_name, self.tunnel_id, self.tunnel_type = self._resolve_tunnel()
        self.session = TunnelSession(
            self.client, self.tunnel_id, None, options.client_timeout, self._label(), options.client_tag
        )
        self._channels: dict[str, Any] = {}  # channel id -> pb.ChannelInfo, from the last describe
        self._known_finished: set[str] = set()
        self._lost_at: dict[str, int] = {}  # channel -> n where expired records were found (see earliest)
        self._heads: dict[str, Position] = {}
        self._pages: OrderedDict[tuple[str, str], _PageSummary] = OrderedDict()
        self._seen_records = 0  # records the driver read while planning and their PlainBuffer bytes
        self._seen_bytes = 0
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _label(self) -> str:
        return f"tunnel {self.tunnel_name or self.tunnel_id!r} (id {self.tunnel_id}) of table {self.table!r}"

    def __repr__(self) -> str:
        return f"TablestoreBackend(table={self.table!r}, tunnel={self.tunnel_name or self.tunnel_id!r})"

    # ------------------------------------------------------------------ setup
    def _resolve_tunnel(self) -> tuple[str, str, str]:
        o = self.options
        if o.tunnel_id and not o.tunnel_name:
            for info in self.client.list_tunnels(self.table):
                if info.tunnel_id == o.tunnel_id:
                    if info.expired:
                        label = f"tunnel {info.tunnel_name!r} (id {info.tunnel_id}) of table {self.table!r}"
                        raise tunnel_expired(label, "ListTunnel")
                    return str(info.tunnel_name), str(info.tunnel_id), str(info.tunnel_type)
            raise OptionError(
                f"option 'tunnel.id': no tunnel {o.tunnel_id!r} on table {self.table!r}", "tunnel.id"
            )
        name = o.tunnel_name or ""
        try:
            resp = self.client.describe_tunnel(self.table, name, o.tunnel_id)
        except (ObjectNotExistError, ParameterInvalidError) as exc:
            if not o.create_tunnel:
                raise OptionError(
                    f"option 'tunnel.name': tunnel {name!r} of table {self.table!r} does not exist ({exc.code}); "
                    "set createTunnelIfMissing=true to create it",
                    "tunnel.name",
                ) from None
            tunnel_id = self.client.create_tunnel(self.table, name, o.tunnel_type)
            return name, tunnel_id, o.tunnel_type
        info = resp.tunnel
        if info.expired:
            raise tunnel_expired(
                f"tunnel {name or info.tunnel_id!r} (id {info.tunnel_id}) of table {self.table!r}",
                "DescribeTunnel",
            )
        if "tunnel_type" in o.model_fields_set and info.tunnel_type != o.tunnel_type:
            log.warning(
                "tunnel %s is of type %s; option 'tunnel.type' (%s) only applies to a tunnel created by "
                "createTunnelIfMissing",
                name,
                info.tunnel_type,
                o.tunnel_type,
            )
        if o.tunnel_id and info.tunnel_id != o.tunnel_id:
            raise OptionError(
                f"option 'tunnel.id': tunnel {name!r} has id {info.tunnel_id!r}, not {o.tunnel_id!r}",
                "tunnel.id",
            )
        return name, str(info.tunnel_id), str(info.tunnel_type)

    def _take_over_stale_clients(self) -> list[str]:
        """Shut down the tunnel clients a crashed run left holding channels (see :mod:`.handover`)."""
        me = handover.this_process(self.options.client_tag)
        ours = self.session.ensure_client()
        taken: list[str] = []
        owners = {c.client_id for c in self._describe().values() if c.client_id and c.client_id != ours}
        for owner in sorted(owners):
            why = handover.is_stale(owner, me)
            if why is None:
                continue
            try:
                self.client.shutdown(self.tunnel_id, owner)
            except ResourceGoneError:
                pass  # it expired meanwhile
            except TablestoreError as exc:
                log.warning("could not shut down the stale tunnel client %s (%s): %s", owner, why, exc)
                continue
            log.info("shut down tunnel client %s, left by an earlier run: %s", owner, why)
            taken.append(owner)
        if taken:
            self._describe()
        return taken

    def _start_heartbeat(self) -> None:
        if self._heartbeat is not None:
            return
        self._take_over_stale_clients()
        interval = max(1.0, self.options.client_timeout / 3)

        def beat() -> None:
            while not self._stop.wait(interval):
                try:
                    self.session.call(self.client.heartbeat, [])
                except Exception as exc:  # noqa: BLE001 - the next beat retries; reads reconnect on their own
                    log.warning("tunnel heartbeat failed: %s", exc)

        self._heartbeat = threading.Thread(target=beat, name="tablestore-tunnel-heartbeat", daemon=True)
        self._heartbeat.start()

    # ------------------------------------------------------------------ contract
    def schema(self) -> pa.Schema:
        return self.layout.arrow()

    def _describe(self) -> dict[str, Any]:
        resp = self.client.describe_tunnel(self.table, self.tunnel_name, self.tunnel_id)
        self._channels = {c.channel_id: c for c in resp.channels}
        return self._channels

    def _info(self, channel: str) -> Any:
        info = self._channels.get(channel) or self._describe().get(channel)
        if info is None:
            raise PositionError(f"tunnel {self.tunnel_name or self.tunnel_id!r} has no channel {channel!r}")
        return info

    def _is_base(self, info: Any) -> bool:
        return str(info.channel_type).lower() == "basedata" or self.tunnel_type == "BaseData"

    def list_channels(self) -> Sequence[ChannelInfo]:
        channels = self._describe()
        base = sorted(cid for cid, c in channels.items() if self._is_base(c))
        out = []
        for cid, c in channels.items():
            parents = tuple(c.parent_channel_ids)
            if not parents and self.tunnel_type == "BaseAndStream" and not self._is_base(c):
                parents = tuple(base)  # a key's snapshot precedes its changes
            finished = bool(c.sealed) or cid in self._known_finished or c.channel_status == "TERMINATED"
            out.append(ChannelInfo(cid, parents, finished))
        return out

    def earliest(self, channel: str) -> Position:
        # After a skip over expired records (failOnDataLoss=false) the count goes on from where the lost
        # range began, so _position stays increasing in the channel; the planner records the position
        # it skips to in the offset ("from"), so a replay never asks again.
        n = self._lost_at.get(channel, 0)
        info = self._describe().get(channel) if channel in self._lost_at else self._info(channel)
        if info is None:
            raise PositionError(f"tunnel {self.tunnel_name or self.tunnel_id!r} has no channel {channel!r}")
        if info.HasField("start_token") and info.start_token:
            return Pos(info.start_token, 0, n).to_json()
        token, _ = self.session.call(self.client.get_checkpoint, channel)
        return Pos(token, 0, n).to_json()

    def latest(self, channel: str) -> Position:
        info = self._info(channel)
        if info.channel_status == "WAIT" and not self._is_base(info):
            # A WAIT channel cannot be read, nor opened here (that would finish its parents' tunnel
            # checkpoints before the query delivered them). Its head is then "every record committed
            # until now": a time bound on the records' sequence timestamps.
            begin = Pos.parse(channel, self.earliest(channel))
            return Pos(begin.token, begin.skip, begin.n, (TIME_BOUND, time.time_ns() // 1000)).to_json()
        start = self._heads.get(channel) or self.earliest(channel)
        try:
            end = self._plan(channel, start, None, None, open_waiting=False).end
        except TrimmedDataError:  # the head walked from expired records: walk from the first held one
            end = self._plan(channel, self.earliest(channel), None, None, open_waiting=False).end
        self._heads[channel] = end
        return end

    def batch_read_end(self, channel: str) -> Position:
        """A batch read's end at the head, left to the reader (rule 6 of :mod:`cdc.backend`): every record
        committed until now. Only the plan's first response is read on the driver (see "Batch reads")."""
        begin = Pos.parse(channel, self.earliest(channel))
        return Pos(begin.token, begin.skip, begin.n, (HEAD_BOUND, time.time_ns() // 1000)).to_json()

    def parse_position(self, channel: str, value: Any) -> Position:
        return Pos.parse(channel, value).to_json()

    @classmethod
    def split_refusal(cls, options: BackendOptions) -> str | None:
        return (
            "a tunnel channel's positions are tokens the server hands out one response at a time, so a position "
            "inside a range is known only by reading up to it"
        )

    def reader(self) -> RangeReader:
        if not self._channels:
            self._describe()
        base = frozenset(cid for cid, c in self._channels.items() if self._is_base(c))
        return TablestoreRangeReader(
            self.client,
            self.tunnel_id,
            self.session.ensure_client(),
            self.options.client_timeout,
            self.layout,
            base,
            self.options.client_tag,
        )

    def average_record_bytes(self) -> float | None:
        """PlainBuffer bytes per record over the responses the driver read while planning."""
        return self._seen_bytes / self._seen_records if self._seen_records else 0.0

    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        try:
            return self._plan(channel, start, max_records, until, open_waiting=True)
        except TrimmedDataError as exc:
            s = Pos.parse(channel, start)
            self._lost_at[channel] = s.n
            lost = TrimmedDataError(
                f"tunnel {self.tunnel_name or self.tunnel_id!r}, channel {channel!r}: the records after position "
                f"{s.n} have expired on the service ({exc}); set failOnDataLoss=false to skip to the first "
                "record still held",
                exc.code,
                exc.http_status,
                exc.request_id,
            )
            lost.channel = channel
            raise lost from None

    def _plan(
        self,
        channel: str,
        start: Position,
        max_records: int | None,
        until: Position | None,
        *,
        open_waiting: bool,
    ) -> PlannedRange:
        s = Pos.parse(channel, start)
        bound = None if until is None else Pos.parse(channel, until)
        if s.token == FINISHED:
            return PlannedRange(start, 0, True)
        if bound is not None and bound.last is None:
            return PlannedRange(start, 0, False)  # the bound is the channel's origin: nothing before it
        info = self._info(channel)
        if info.channel_status == "WAIT" and not (open_waiting and self._open_waiting(channel)):
            return PlannedRange(start, 0, False)
        self._start_heartbeat()
        base = self._is_base(info)
        token, skip, n, last = s.token, s.skip, s.n, s.last
        taken = 0
        to_head = None  # a batch read's end left to the reader: stop walking once a record was taken
        if bound is not None and bound.last is not None and bound.last[0] == HEAD_BOUND:
            micros = bound.last[1]
            if max_records is None:
                to_head = Pos(s.token, s.skip, s.n, (HEAD_BOUND, micros))
            # what the reader will take, resolved here when a budget needs the count
            bound = None if base else Pos(bound.token, bound.skip, bound.n, (TIME_BOUND, micros))

        def stop(finished: bool = False) -> PlannedRange:
            if taken == 0 and not finished:
                return PlannedRange(start, 0, False)
            if bound is not None and last == bound.last and n == bound.n:
                return PlannedRange(until, taken, finished)
            # (a bound counted from another origin, e.g. computed before a skip over expired records,
            # is met by its ordering key; the end then counts from this range's origin)
            end = Pos(FINISHED if finished else token, 0 if finished else skip, n, last)
            return PlannedRange(end.to_json(), taken, finished)

        # A batch's plan reads its start token even when a summary of it is known: a summary stays true,
        # but the records it describes may have expired since (OTSTrimmedDataAccess), and that data loss
        # must surface here, where failOnDataLoss decides, not in an executor.
        verify = open_waiting
        while True:
            summary = None if verify else self._pages.get((channel, token))
            verify = False
            if summary is not None and skip <= summary.count:
                # A response read before, summarised: consume it whole without reading it again when
                # neither the budget nor the bound ends the range inside it.
                avail = summary.count - skip
                fits_bound = bound is None or avail == 0 or within(summary.last, bound.last)
                fits_budget = max_records is None or taken + avail < max_records or avail == 0
                if fits_bound and fits_budget:
                    if avail:
                        n, taken, last = n + avail, taken + avail, summary.last
                    skip = summary.count
                    if summary.finished:
                        self._known_finished.add(channel)
                        return stop(finished=True)
                    token, skip = summary.next_token, 0
                    continue
            if to_head is not None and taken > 0:
                end = Pos(to_head.token, to_head.skip, n, to_head.last)
                return PlannedRange(end.to_json(), taken, False)  # a lower bound (rule 2)
            page = self.session.read(channel, token)
            records = page.records
            self._seen_records += len(records)
            self._seen_bytes += sum(len(r.record) for r in records)
            if records and page.next_token != token:
                last_key = order_key(decode_row(records[-1].record), base)
                self._remember(
                    channel, token, _PageSummary(len(records), page.next_token, last_key, page.finished)
                )
            if skip > len(records):
                token, skip = skip_past_page(channel, start, page, token, skip)
                continue
            avail = len(records) - skip
            allowed = avail
            if bound is not None and avail:
                allowed = count_within(records, skip, base, bound.last)
            room = avail if max_records is None else min(avail, max_records - taken)
            take = min(allowed, room)
            if take > 0:
                last = order_key(decode_row(records[skip + take - 1].record), base)
                skip += take
                n += take
                taken += take
            if take < avail:
                return stop()
            if page.finished:
                self._known_finished.add(channel)
                return stop(finished=True)
            if page.next_token == token:
                return stop()  # at the head
            if max_records is not None and taken >= max_records and avail > 0:
                return stop()  # budget spent exactly at the end of a response: stay inside it
            token, skip = page.next_token, 0

    def _remember(self, channel: str, token: str, summary: _PageSummary) -> None:
        self._pages[(channel, token)] = summary
        if len(self._pages) > _PAGE_CACHE_SIZE:
            self._pages.popitem(last=False)

    def _open_waiting(self, channel: str) -> bool:
        """Finish the tunnel checkpoints of a WAIT channel's sealed parents; True if it is open now."""
        parents = [p for p in self._info(channel).parent_channel_ids if p in self._channels]
        if not parents or not all(self._channels[p].sealed or p in self._known_finished for p in parents):
            return False
        try:
            for p in parents:
                self._checkpoint(p, FINISHED)
        except TablestoreError as exc:  # e.g. a parent still held by a live client of an earlier run
            if not self._take_over_stale_clients():
                log.info("channel %s waits: finishing its parents' checkpoints failed: %s", channel, exc)
                return False
            try:
                for p in parents:
                    self._checkpoint(p, FINISHED)
            except TablestoreError as again:
                log.info("channel %s waits: finishing its parents' checkpoints failed: %s", channel, again)
                return False
        return self._describe().get(channel) is not None and self._channels[channel].channel_status != "WAIT"

    def _checkpoint(self, channel: str, token: str) -> None:
        for attempt in range(2):
            current, seq = self.session.call(self.client.get_checkpoint, channel)
            if current == token or current == FINISHED:
                return
            try:
                self.session.call(self.client.checkpoint, channel, token, seq + 1)
                log.debug("tunnel checkpoint of %s -> %s (sequence %d)", channel, token, seq + 1)
                return
            except SequenceNumberMismatchError:
                if attempt:
                    raise

    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        """Heads walked from the query's positions (the walk counts the records; the response summaries
        it shares with planning keep it short), and the tunnel's RPO: ``channel_rpo`` is the consumption
        point in nanoseconds, which the SDKs show as ``now - point``."""
        channels = self._describe()
        now_ns = time.time_ns()
        out = {}
        for cid, value in positions.items():
            info = channels.get(cid)
            base = info is None or self._is_base(info)
            behind: int | None
            try:
                planned = self._plan(cid, value, None, None, open_waiting=False)
                head, behind = planned.end, planned.records
            except TrimmedDataError:
                head, behind = self.latest(cid), None
            if info is not None and info.channel_status == "WAIT":
                head, behind = self.latest(cid), None  # a WAIT channel cannot be read: its count is unknown
            point = int(getattr(info, "channel_rpo", 0) or 0)
            measures = {"rpoMs": float(max(0, now_ns - point) // 1_000_000)} if point and not base else {}
            out[cid] = ChannelHead(
                head, behind, _commit_time(head, cid, base), _commit_time(value, cid, base), measures
            )
        return out

    def position_at(self, channel: str, when: datetime) -> Position:
        """Walk from the earliest position up to a time bound just before ``when``: stream records are in
        commit-time order within a channel. Base-data records carry no commit time: their channel starts at its
        beginning."""
        start = self.earliest(channel)
        if self._is_base(self._info(channel)):
            return start
        micros = int(when.timestamp() * 1_000_000) - 1
        bound = Pos(Pos.parse(channel, start).token, 0, 0, (TIME_BOUND, micros)).to_json()
        return self._plan(channel, start, None, bound, open_waiting=False).end

    def acknowledge(self, positions: Mapping[str, Position]) -> None:
        self._describe()
        for channel, value in positions.items():
            info = self._channels.get(channel)
            if info is None or info.channel_status in ("WAIT", "TERMINATED"):
                continue
            try:
                self._checkpoint(channel, Pos.parse(channel, value).token)
            except TablestoreError as exc:
                log.warning("tunnel checkpoint of channel %s failed: %s", channel, exc)

    def close(self) -> None:
        self._stop.set()
        cid = self.session.client_id
        if cid is not None:
            try:
                self.client.shutdown(self.tunnel_id, cid)
            except TablestoreError as exc:
                log.debug("tunnel client shutdown failed: %s", exc)
        self.client.close()


def _commit_time(position: Position, channel: str, base: bool) -> datetime | None:
    """The commit time of the record before ``position``, from its ordering key (stream records only)."""
    last = Pos.parse(channel, position).last
    if base or last is None or last[0] in (TIME_BOUND, HEAD_BOUND) or len(last) != 3:
        return None
    return datetime.fromtimestamp(last[1] / 1_000_000, UTC)
