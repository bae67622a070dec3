"""An on-disk, append-only, multi-channel change log in a directory.

Layout::

    <path>/log.json                      table schema, keys, format version (written once, last, by create)
    <path>/manifest.json                 the published state: every channel (parents, key-hash range,
                                         earliest and head positions, finished or not), the next sequence
                                         number and channel number; with a CRC-32 of its own
    <path>/.lock                         writers serialise on an exclusive ``flock``
    <path>/channels/<id>/<start>-<end>-<crc>.arrow     an immutable segment: records [start, end)
    <path>/snapshots/<id>/manifest.json, <n>/...       a materialised snapshot, in the same format

Positions are record indices within a channel (``0`` = before the first record). Each key's hash falls in
exactly one open channel's range, so a key's changes stay in one channel until a split or merge hands its
range to a child; ``_seq`` is global and increasing, so a child's changes always sort after its parents'.

**What a crash leaves.** The manifest is the only thing readers trust, and it is replaced by one atomic
rename. An append writes its segments (every channel's) first, then publishes them together with the next
sequence number in that one rename: a writer killed at any instant leaves either the whole append visible
or none of it, and the sequence state can never fall behind what readers see. Segments at or past a
channel's published head are a killed writer's leftovers: readers ignore them and the next writer removes
them before it appends. Splits, merges and truncations publish the same way.

**What damage is caught.** A reader checks that a channel's segments tile its published range exactly (none
missing, none overlapping) and, before returning any row of a segment, that the file's checksum, schema and
row count match its name (CRC-32C, :mod:`cdc.backends.local.segments`); a violation raises
:class:`~cdc.backends.local.errors.CorruptLogError` naming the file and channel. Files and folders whose
names are not ours are ignored. A log of another format version (format 1 logs had neither checksums nor a
manifest) is refused with :class:`~cdc.backends.local.errors.LogFormatError` naming its version.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.backend import ChannelInfo
from cdc.backends.local import segments
from cdc.backends.local import snapshot as snapshots
from cdc.backends.local.errors import CorruptLogError, LogFormatError
from cdc.backends.local.files import fault, remove_dead_temporaries, write_atomic
from cdc.backends.local.manifest import MANIFEST, ChannelEntry, Manifest
from cdc.backends.local.records import change_table, segment_table
from cdc.backends.local.segments import Segment
from cdc.backends.local.snapshot import SNAPSHOT_PREFIX
from cdc.errors import DataLossError, PositionError
from cdc.model import ChangeSchema

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
HASH_SPACE = 1 << 32


def _write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, sort_keys=True).encode())


@dataclass(frozen=True)
class ChannelState:
    id: str
    parents: tuple[str, ...]
    hash_range: tuple[int, int]
    earliest: int  # truncation removes whole segments from the front; an empty channel starts at its head
    head: int
    closed: bool
    segments: tuple[Segment, ...]

    @property
    def closed_at(self) -> int | None:
        return self.head if self.closed else None

    def info(self) -> ChannelInfo:
        return ChannelInfo(self.id, self.parents, self.closed)


class LocalLog:
    """Reader and writer of a local change log. Safe for concurrent writers and readers (any process)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        meta_file = self.path / "log.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"no change log at {self.path} (log.json missing); create one first")
        meta = json.loads(meta_file.read_text())
        version = meta.get("format")
        if version != FORMAT_VERSION:
            raise LogFormatError(
                f"{self.path}: the log has format {version!r}; this release reads format {FORMAT_VERSION} only "
                "(format 1 logs, written before appends were atomic and segments checksummed, must be written "
                "again into a new log)",
                version,
            )
        self.change_schema = ChangeSchema.from_json(meta)
        self.arrow_schema = self.change_schema.arrow()
        self._swept = False
        self._snapshots: dict[str, Manifest] = {}  # immutable once published

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        schema: pa.Schema | Sequence[tuple[str, pa.DataType]],
        keys: Sequence[str],
        channels: int = 1,
        exist_ok: bool = False,
    ) -> LocalLog:
        """Create a log with ``channels`` root channels that share the key-hash space evenly."""
        p = Path(path)
        if (p / "log.json").exists():
            if exist_ok:
                return cls(p)
            raise FileExistsError(f"a change log already exists at {p}")
        if channels < 1:
            raise ValueError("a log needs at least one channel")
        change_schema = ChangeSchema.of(schema, keys)
        (p / "channels").mkdir(parents=True, exist_ok=True)
        (p / ".lock").touch()
        bounds = [HASH_SPACE * i // channels for i in range(channels + 1)]
        entries = {f"c{i}": ChannelEntry((), (bounds[i], bounds[i + 1])) for i in range(channels)}
        write_atomic(p / MANIFEST, Manifest(1, channels, entries).to_bytes())
        _write_json(p / "log.json", {"format": FORMAT_VERSION, **change_schema.to_json()})
        return cls(p)

    # ------------------------------------------------------------------ reading state
    def manifest(self) -> Manifest:
        """The log's published state (what readers see)."""
        return Manifest.load(self.path / MANIFEST)

    def _channel_dir(self, cid: str) -> Path:
        if cid.startswith(SNAPSHOT_PREFIX):
            _, sid, n = cid.split("-", 2)
            return self.path / "snapshots" / sid / n
        return self.path / "channels" / cid

    def _state(self, cid: str, entry: ChannelEntry) -> ChannelState:
        tiles = segments.tile(segments.listed(self._channel_dir(cid)), entry.earliest, entry.head, cid)
        return ChannelState(cid, entry.parents, entry.hash_range, entry.earliest, entry.head, entry.closed, tiles)

    def _states(self, ids: Sequence[str] | None = None) -> list[ChannelState]:
        manifest = self.manifest()
        for _ in range(2):
            try:
                return self._states_of(manifest, ids)
            except CorruptLogError:
                # A truncation publishes a later earliest position, then removes the segments before it:
                # a reader listing in between sees them gone. Only damage persists under a fresh manifest.
                fresh = self.manifest()
                if fresh == manifest:
                    raise
                manifest = fresh
        return self._states_of(manifest, ids)

    def _states_of(self, manifest: Manifest, ids: Sequence[str] | None) -> list[ChannelState]:
        if ids is None:
            ids = manifest.ordered_ids()
        for c in ids:
            if c not in manifest.channels:
                raise PositionError(f"channel {c!r} does not exist in {self.path}")
        return [self._state(c, manifest.channels[c]) for c in ids]

    def _snapshot_state(self, cid: str) -> ChannelState:
        sid = cid.split("-", 2)[1]
        if sid not in self._snapshots:
            try:
                self._snapshots[sid] = Manifest.load(self.path / "snapshots" / sid / MANIFEST)
            except FileNotFoundError:
                raise PositionError(f"channel {cid!r} does not exist in {self.path}") from None
        entry = self._snapshots[sid].channels.get(cid)
        if entry is None:
            raise PositionError(f"channel {cid!r} does not exist in {self.path}")
        return self._state(cid, entry)

    def channel(self, cid: str) -> ChannelState:
        if cid.startswith(SNAPSHOT_PREFIX):
            return self._snapshot_state(cid)
        return self._states([cid])[0]

    def channel_ids(self) -> list[str]:
        return self.manifest().ordered_ids()

    def channels(self) -> list[ChannelState]:
        return self._states()

    def average_record_bytes(self, recent: int = 16) -> float:
        """Bytes per record of the Arrow segment files, over each channel's ``recent`` last segments (what
        the next batches read); 0.0 for an empty log."""
        size = records = 0
        for st in self.channels():
            for seg in st.segments[-recent:]:
                try:
                    size += seg.path.stat().st_size
                except FileNotFoundError:  # truncated meanwhile
                    continue
                records += seg.end - seg.start
        return size / records if records else 0.0

    def read(self, cid: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Yield the records ``[start, end)`` of a channel as Arrow batches with :attr:`arrow_schema`.

        Raises :class:`~cdc.backends.local.errors.CorruptLogError` before yielding any row of a damaged
        segment, and :class:`~cdc.errors.DataLossError` when ``start`` was truncated away."""
        if end <= start:
            return
        state = self.channel(cid)
        if start < state.earliest:
            raise DataLossError(
                f"channel {cid!r}: position {start} is no longer held (earliest is {state.earliest})", cid
            )
        if end > state.head:
            raise PositionError(f"channel {cid!r}: end {end} is past the head {state.head}")
        for seg in state.segments:
            if seg.end <= start or seg.start >= end:
                continue
            try:
                batches = segments.checked_batches(seg, self.arrow_schema, cid)
            except FileNotFoundError:
                if self.channel(cid).earliest > seg.start:
                    raise DataLossError(
                        f"channel {cid!r}: segment {seg.path.name} was removed while reading", cid
                    ) from None
                raise CorruptLogError(
                    f"channel {cid!r}: segment {seg.path} is missing", str(seg.path), cid
                ) from None
            offset = seg.start
            for batch in batches:
                b_start, b_end = offset, offset + batch.num_rows
                offset = b_end
                if b_end <= start or b_start >= end:
                    continue
                lo = max(start, b_start) - b_start
                hi = min(end, b_end) - b_start
                yield batch.slice(lo, hi - lo)

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[Manifest]:
        """Hold the writers' lock; yield the published manifest, which only :meth:`_publish` replaces."""
        with open(self.path / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                manifest = self.manifest()
                if not self._swept:  # once per writer: what killed writers left stays harmless meanwhile
                    dirs = [self.path, self.path / "channels"] + [self._channel_dir(c) for c in manifest.channels]
                    remove_dead_temporaries(dirs)
                    self._swept = True
                yield manifest
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _publish(self, manifest: Manifest) -> None:
        fault("before-commit")
        write_atomic(self.path / MANIFEST, manifest.to_bytes())
        fault("after-commit")

    def _hashes(self, table: pa.Table) -> Any:
        import pandas as pd

        keys = table.select(list(self.change_schema.keys)).to_pandas()
        return (pd.util.hash_pandas_object(keys, index=False).to_numpy() >> 32).astype("int64")

    def append(
        self,
        rows: pa.Table | Sequence[Mapping[str, Any]] | pd.DataFrame,
        channel: str | None = None,
        commit_ts: datetime | None = None,
    ) -> int:
        """Append changes; return the last sequence number given. Rows are routed by key hash unless a
        ``channel`` is named. Each row may carry ``_op`` (default ``insert``) and ``_commit_ts``."""
        table = change_table(rows, self.change_schema)
        if table.num_rows == 0:
            return 0
        with self._locked() as manifest:
            open_channels = {c: e for c, e in manifest.channels.items() if not e.closed}
            seq = manifest.next_seq
            # Sequences follow the caller's row order across channels, so rows appended together keep
            # their relative order whatever channel they land in.
            seqs = pa.array(range(seq, seq + table.num_rows), pa.int64())
            if channel is not None:
                if channel not in open_channels:
                    raise PositionError(f"channel {channel!r} is not open for appends")
                parts = {channel: (table, seqs)}
            else:
                hashes = self._hashes(table)
                parts = {}
                for cid, entry in open_channels.items():
                    lo, hi = entry.hash_range
                    mask = pa.array((hashes >= lo) & (hashes < hi))
                    if pc.any(mask).as_py():
                        parts[cid] = (table.filter(mask), seqs.filter(mask))
            ts = commit_ts or datetime.now(UTC)
            heads = {}
            for cid, (part, part_seqs) in parts.items():
                head = open_channels[cid].head
                segments.remove_unpublished(self._channel_dir(cid), head)
                self._write_segment(cid, head, part, part_seqs, ts)
                heads[cid] = head + part.num_rows
            # One rename publishes every channel's segments and the next sequence number together.
            self._publish(manifest.advanced(heads, next_seq=seq + table.num_rows))
            return int(seq + table.num_rows - 1)

    def _write_segment(self, cid: str, start: int, part: pa.Table, seqs: pa.Array, ts: datetime) -> None:
        segments.write(self._channel_dir(cid), start, segment_table(part, self.change_schema, cid, start, seqs, ts))

    def split(self, channel: str, parts: int = 2) -> list[str]:
        """Finish ``channel`` and hand its key-hash range to ``parts`` new children."""
        if parts < 2:
            raise ValueError("a split needs at least two parts")
        with self._locked() as manifest:
            entry = self._open_entry(manifest, channel)
            lo, hi = entry.hash_range
            if hi - lo < parts:
                raise ValueError(f"channel {channel!r} owns too small a hash range to split in {parts}")
            bounds = [lo + (hi - lo) * i // parts for i in range(parts + 1)]
            children = {
                f"c{manifest.next_channel + i}": ChannelEntry((channel,), (bounds[i], bounds[i + 1]))
                for i in range(parts)
            }
            self._publish(manifest.handed_over([channel], children))
        log.info("split channel %s into %s at position %d", channel, list(children), entry.head)
        return list(children)

    def merge(self, channels: Sequence[str]) -> str:
        """Finish adjacent open ``channels`` and hand their joint key-hash range to one new child."""
        if len(set(channels)) < 2:
            raise ValueError("a merge needs at least two distinct channels")
        with self._locked() as manifest:
            entries = sorted(((c, self._open_entry(manifest, c)) for c in channels), key=lambda e: e[1].hash_range)
            for (a, ea), (b, eb) in zip(entries, entries[1:], strict=False):
                if ea.hash_range[1] != eb.hash_range[0]:
                    raise ValueError(f"channels {a!r} and {b!r} own non-adjacent key ranges")
            cid = f"c{manifest.next_channel}"
            parents = tuple(c for c, _ in entries)
            child = ChannelEntry(parents, (entries[0][1].hash_range[0], entries[-1][1].hash_range[1]))
            self._publish(manifest.handed_over(parents, {cid: child}))
        log.info("merged channels %s into %s", list(parents), cid)
        return cid

    def _open_entry(self, manifest: Manifest, channel: str) -> ChannelEntry:
        entry = manifest.channels.get(channel)
        if entry is None:
            raise PositionError(f"channel {channel!r} does not exist in {self.path}")
        if entry.closed:
            raise PositionError(f"channel {channel!r} is already finished")
        return entry

    def truncate(self, channel: str, before: int) -> int:
        """Drop whole segments that end at or before ``before`` (retention); return the new earliest."""
        with self._locked() as manifest:
            if channel not in manifest.channels:
                raise PositionError(f"channel {channel!r} does not exist in {self.path}")
            st = self._state(channel, manifest.channels[channel])
            # An open channel keeps its last segment, so a reader always has the newest records at hand.
            removable = st.segments[:-1] if not st.closed else st.segments
            dropped = [seg for seg in removable if seg.end <= before]
            earliest = dropped[-1].end if dropped else st.earliest
            if dropped:
                entry = replace(manifest.channels[channel], earliest=earliest)
                self._publish(manifest.advanced({}, channels={channel: entry}))
                fault("truncate-published")
            # Segments before the published earliest are no longer read: remove them (a killed truncation's
            # leftovers too).
            for seg in segments.listed(self._channel_dir(channel)):
                if seg.end <= earliest:
                    with contextlib.suppress(FileNotFoundError):
                        seg.path.unlink()
            return earliest

    # ------------------------------------------------------------------ snapshots (see .snapshot)
    def snapshot(self, chunk_rows: int = 100_000) -> tuple[str, list[str], dict[str, int]]:
        """Materialise the table's rows at a consistent cut, without blocking writers
        (:func:`cdc.backends.local.snapshot.materialise`); returns ``(snapshot id, chunk ids, cut)``."""
        return snapshots.materialise(self, chunk_rows)

    def drop_snapshots(self) -> int:
        """Remove every materialised snapshot (after the queries that started from them are past them)."""
        return snapshots.drop_all(self)

    def open_channels(self) -> list[str]:
        """Open channels in key-hash order, so neighbours in the list can be merged."""
        states = [c for c in self.channels() if c.closed_at is None]
        return [c.id for c in sorted(states, key=lambda c: c.hash_range[0])]

    def read_all(self) -> pa.Table:
        """Every record of every channel (for tests and demos)."""
        batches = [b for c in self.channels() for b in self.read(c.id, c.earliest, c.head)]
        return pa.Table.from_batches(batches, schema=self.arrow_schema)
