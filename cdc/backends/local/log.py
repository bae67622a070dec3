"""An on-disk, append-only, multi-channel change log in a directory.

Layout (every file is written to a temporary name and renamed into place, so a reader in another process
sees a file whole or not at all)::

    <path>/log.json                      table schema, keys, format version
    <path>/state.json                    next sequence number, next channel number (writers only)
    <path>/.lock                         writers serialise on an exclusive ``flock``
    <path>/channels/<id>/channel.json    parents and the key-hash range the channel owns
    <path>/channels/<id>/closed.json     present once the channel is finished: its final end
    <path>/channels/<id>/<start>-<end>.arrow   an immutable segment: records [start, end)

Positions are record indices within a channel (``0`` = before the first record). Each key's hash falls in
exactly one open channel's range, so a key's changes stay in one channel until a split or merge hands its
range to a child; ``_seq`` is global and increasing, so a child's changes always sort after its parents'.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.backend import ChannelInfo
from cdc.errors import DataLossError, PositionError
from cdc.model import CHANNEL, COMMIT_TS, OP, POSITION, SEQ, ChangeSchema, Op

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
HASH_SPACE = 1 << 32
SEGMENT_ROWS = 65_536  # rows per Arrow record batch inside a segment
_SEGMENT = re.compile(r"^(\d{12})-(\d{12})\.arrow$")
_OPS = {o.value for o in Op}
SNAPSHOT_PREFIX = "snap-"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_json(path: Path, obj: Any) -> None:
    _write_atomic(path, json.dumps(obj, sort_keys=True).encode())


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    path: Path


@dataclass(frozen=True)
class ChannelState:
    id: str
    parents: tuple[str, ...]
    hash_range: tuple[int, int]
    closed_at: int | None
    segments: tuple[Segment, ...]

    @property
    def head(self) -> int:
        if self.closed_at is not None:
            return self.closed_at
        # An open channel always keeps its last segment (see truncate), so this is its true head.
        return self.segments[-1].end if self.segments else 0

    @property
    def earliest(self) -> int:
        # Truncation removes whole segments from the front; an empty channel starts at its head.
        return self.segments[0].start if self.segments else self.head

    def info(self) -> ChannelInfo:
        return ChannelInfo(self.id, self.parents, self.closed_at is not None)


class LocalLog:
    """Reader and writer of a local change log. Safe for concurrent writers and readers (any process)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        meta_file = self.path / "log.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"no change log at {self.path} (log.json missing); create one first")
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{self.path}: unsupported log format {meta.get('format')!r}")
        self.change_schema = ChangeSchema.from_json(meta)
        self.arrow_schema = self.change_schema.arrow()

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
        for i in range(channels):
            cls._make_channel(p, f"c{i}", (), (bounds[i], bounds[i + 1]))
        _write_json(p / "state.json", {"next_seq": 1, "next_channel": channels})
        _write_json(p / "log.json", {"format": FORMAT_VERSION, **change_schema.to_json()})
        return cls(p)

    @staticmethod
    def _make_channel(root: Path, cid: str, parents: tuple[str, ...], hash_range: tuple[int, int]) -> None:
        tmp = Path(tempfile.mkdtemp(dir=root / "channels", prefix=".tmp-"))
        _write_json(tmp / "channel.json", {"id": cid, "parents": list(parents), "range": list(hash_range)})
        os.replace(tmp, root / "channels" / cid)

    # ------------------------------------------------------------------ reading state
    def _channel_dir(self, cid: str) -> Path:
        if cid.startswith(SNAPSHOT_PREFIX):
            _, sid, n = cid.split("-", 2)
            return self.path / "snapshots" / sid / n
        return self.path / "channels" / cid

    def channel(self, cid: str) -> ChannelState:
        d = self._channel_dir(cid)
        try:
            meta = json.loads((d / "channel.json").read_text())
        except FileNotFoundError:
            raise PositionError(f"channel {cid!r} does not exist in {self.path}") from None
        closed_at = None
        with contextlib.suppress(FileNotFoundError):
            closed_at = int(json.loads((d / "closed.json").read_text())["end"])
        segments = []
        for name in os.listdir(d):
            m = _SEGMENT.match(name)
            if m:
                segments.append(Segment(int(m.group(1)), int(m.group(2)), d / name))
        segments.sort(key=lambda s: s.start)
        lo, hi = meta["range"]
        return ChannelState(cid, tuple(meta["parents"]), (int(lo), int(hi)), closed_at, tuple(segments))

    def channel_ids(self) -> list[str]:
        ids = [n for n in os.listdir(self.path / "channels") if not n.startswith(".")]
        return sorted(ids, key=lambda c: (len(c), c))

    def channels(self) -> list[ChannelState]:
        return [self.channel(c) for c in self.channel_ids()]

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
        """Yield the records ``[start, end)`` of a channel as Arrow batches with :attr:`arrow_schema`."""
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
                source = pa.memory_map(str(seg.path), "r")
            except FileNotFoundError:
                raise DataLossError(f"channel {cid!r}: segment {seg.path.name} was removed while reading", cid) from None
            with source, pa.ipc.open_file(source) as f:
                offset = seg.start
                for i in range(f.num_record_batches):
                    batch = f.get_batch(i)
                    b_start, b_end = offset, offset + batch.num_rows
                    offset = b_end
                    if b_end <= start or b_start >= end:
                        continue
                    lo = max(start, b_start) - b_start
                    hi = min(end, b_end) - b_start
                    yield batch.slice(lo, hi - lo)

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, int]]:
        with open(self.path / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state: dict[str, int] = json.loads((self.path / "state.json").read_text())
                yield state
                _write_json(self.path / "state.json", state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _to_table(self, rows: pa.Table | Sequence[Mapping[str, Any]] | pd.DataFrame) -> pa.Table:
        import pandas as pd  # imported here: readers (Spark's planner process) never need it

        if isinstance(rows, pa.Table):
            table = rows
        elif isinstance(rows, pd.DataFrame):
            table = pa.Table.from_pandas(rows, preserve_index=False)
        else:
            rows = list(rows)
            cols: dict[str, list[Any]] = {OP: [r.get(OP, Op.INSERT.value) for r in rows]}
            for name in self.change_schema.table.names:
                cols[name] = [r.get(name) for r in rows]
            if COMMIT_TS in {k for r in rows for k in r}:
                cols[COMMIT_TS] = [r.get(COMMIT_TS) for r in rows]
            unknown = {k for r in rows for k in r} - set(cols)
            if unknown:
                raise ValueError(f"unknown columns {sorted(unknown)}; the table has {self.change_schema.table.names}")
            table = pa.table(cols)
        if OP not in table.column_names:
            table = table.append_column(OP, pa.array([Op.INSERT.value] * table.num_rows, pa.string()))
        ops = set(table.column(OP).unique().to_pylist())
        if not ops <= _OPS:
            raise ValueError(f"column {OP!r}: invalid operations {sorted(map(str, ops - _OPS))}; accepted: {sorted(_OPS)}")
        for k in self.change_schema.keys:
            if k not in table.column_names:
                raise ValueError(f"key column {k!r} is missing")
            if table.column(k).null_count:
                raise ValueError(f"key column {k!r} has nulls")
        return table

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
        table = self._to_table(rows)
        if table.num_rows == 0:
            return 0
        with self._locked() as state:
            open_channels = {c.id: c for c in self.channels() if c.closed_at is None}
            seq = state["next_seq"]
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
                for c in open_channels.values():
                    lo, hi = c.hash_range
                    mask = pa.array((hashes >= lo) & (hashes < hi))
                    if pc.any(mask).as_py():
                        parts[c.id] = (table.filter(mask), seqs.filter(mask))
            ts = commit_ts or datetime.now(UTC)
            for cid, (part, part_seqs) in parts.items():
                self._write_segment(open_channels[cid], part, part_seqs, ts)
            state["next_seq"] = seq + table.num_rows
            return int(seq + table.num_rows - 1)

    def _write_segment(self, st: ChannelState, part: pa.Table, seqs: pa.Array, ts: datetime) -> None:
        start = st.head
        n = part.num_rows
        cols: dict[str, Any] = {
            OP: part.column(OP).cast(pa.string()),
            SEQ: seqs,
            COMMIT_TS: (
                part.column(COMMIT_TS).cast(pa.timestamp("us", tz="UTC"))
                if COMMIT_TS in part.column_names
                else pa.array([ts] * n, pa.timestamp("us", tz="UTC"))
            ),
            CHANNEL: pa.array([st.id] * n, pa.string()),
            POSITION: pa.array(range(start, start + n), pa.int64()),
        }
        for f in self.change_schema.table:
            if f.name in part.column_names:
                cols[f.name] = part.column(f.name).cast(f.type)
            else:
                cols[f.name] = pa.nulls(n, f.type)
        self._write_arrow(self.path / "channels" / st.id, start, pa.Table.from_pydict(cols, schema=self.arrow_schema))

    def _write_arrow(self, d: Path, start: int, out: pa.Table) -> None:
        n = out.num_rows
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        os.close(fd)
        try:
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, self.arrow_schema) as writer:
                for batch in out.to_batches(max_chunksize=SEGMENT_ROWS):
                    writer.write_batch(batch)
            os.replace(tmp, d / f"{start:012d}-{start + n:012d}.arrow")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def split(self, channel: str, parts: int = 2) -> list[str]:
        """Finish ``channel`` and hand its key-hash range to ``parts`` new children."""
        if parts < 2:
            raise ValueError("a split needs at least two parts")
        with self._locked() as state:
            st = self.channel(channel)
            if st.closed_at is not None:
                raise PositionError(f"channel {channel!r} is already finished")
            lo, hi = st.hash_range
            if hi - lo < parts:
                raise ValueError(f"channel {channel!r} owns too small a hash range to split in {parts}")
            bounds = [lo + (hi - lo) * i // parts for i in range(parts + 1)]
            children = []
            for i in range(parts):
                cid = f"c{state['next_channel']}"
                state["next_channel"] += 1
                self._make_channel(self.path, cid, (channel,), (bounds[i], bounds[i + 1]))
                children.append(cid)
            _write_json(self.path / "channels" / channel / "closed.json", {"end": st.head})
        log.info("split channel %s into %s at position %d", channel, children, st.head)
        return children

    def merge(self, channels: Sequence[str]) -> str:
        """Finish adjacent open ``channels`` and hand their joint key-hash range to one new child."""
        if len(set(channels)) < 2:
            raise ValueError("a merge needs at least two distinct channels")
        with self._locked() as state:
            states = sorted((self.channel(c) for c in channels), key=lambda s: s.hash_range[0])
            for s in states:
                if s.closed_at is not None:
                    raise PositionError(f"channel {s.id!r} is already finished")
            for a, b in zip(states, states[1:], strict=False):
                if a.hash_range[1] != b.hash_range[0]:
                    raise ValueError(f"channels {a.id!r} and {b.id!r} own non-adjacent key ranges")
            cid = f"c{state['next_channel']}"
            state["next_channel"] += 1
            parents = tuple(s.id for s in states)
            self._make_channel(self.path, cid, parents, (states[0].hash_range[0], states[-1].hash_range[1]))
            for s in states:
                _write_json(self.path / "channels" / s.id / "closed.json", {"end": s.head})
        log.info("merged channels %s into %s", list(parents), cid)
        return cid

    def truncate(self, channel: str, before: int) -> int:
        """Drop whole segments that end at or before ``before`` (retention); return the new earliest."""
        with self._locked():
            st = self.channel(channel)
            keep_last = st.closed_at is None  # an open channel's last segment records its head
            removable = st.segments[:-1] if keep_last else st.segments
            for seg in removable:
                if seg.end <= before:
                    seg.path.unlink()
            return self.channel(channel).earliest

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, chunk_rows: int = 100_000) -> tuple[str, list[str], dict[str, int]]:
        """Materialise the table's rows at a consistent cut of the log, without blocking writers.

        The cut (every channel's head) is taken under the writers' lock, so it is consistent: a change is
        either before the cut in its channel or after it, and every change after the cut has a larger
        sequence than every change before it. The rows are then folded (last change per key by ``_seq``,
        deletes removed) from the immutable segments before the cut, outside the lock, and written as
        ``snapshot`` records into finished chunk channels ``snap-<id>-<n>`` under ``snapshots/<id>/``.
        Each row keeps the ``_seq`` and ``_commit_ts`` of the last change it folds in.

        Returns ``(snapshot id, chunk channel ids, cut positions per channel)``.
        """
        with self._locked():
            cut = {c.id: c.head for c in self.channels()}
        parts: list[pa.RecordBatch] = []
        for cid, head in cut.items():
            st = self.channel(cid)
            if st.earliest > 0:
                raise DataLossError(
                    f"a snapshot needs the whole history, but channel {cid!r} was truncated before "
                    f"position {st.earliest}", cid
                )
            parts.extend(self.read(cid, 0, head))
        history = pa.Table.from_batches(parts, schema=self.arrow_schema)
        table = self._fold(history)
        sid = f"{time.time_ns():x}{os.getpid():x}"
        tmp = Path(tempfile.mkdtemp(dir=self.path, prefix=".tmp-snap-"))
        chunks = []
        n_chunks = max(1, -(-table.num_rows // chunk_rows))
        for n in range(n_chunks):
            cid = f"{SNAPSHOT_PREFIX}{sid}-{n}"
            part = table.slice(n * chunk_rows, chunk_rows)
            d = tmp / str(n)
            d.mkdir()
            _write_json(d / "channel.json", {"id": cid, "parents": [], "range": [0, 0]})
            _write_json(d / "closed.json", {"end": part.num_rows})
            cols = {name: part.column(name) for name in part.column_names}
            cols[CHANNEL] = pa.array([cid] * part.num_rows, pa.string())
            cols[POSITION] = pa.array(range(part.num_rows), pa.int64())
            if part.num_rows:
                self._write_arrow(d, 0, pa.Table.from_pydict(cols, schema=self.arrow_schema))
            chunks.append(cid)
        (self.path / "snapshots").mkdir(exist_ok=True)
        _write_json(tmp / "cut.json", {"positions": cut, "rows": table.num_rows})
        os.replace(tmp, self.path / "snapshots" / sid)
        log.info("snapshot %s: %d rows in %d chunks at cut %s", sid, table.num_rows, len(chunks), cut)
        return sid, chunks, cut

    def _fold(self, history: pa.Table) -> pa.Table:
        """The table state after applying ``history``: last change per key, deletes removed, sorted by key."""
        keys = list(self.change_schema.keys)
        if history.num_rows == 0:
            return history
        ordered = history.sort_by([(SEQ, "ascending")])
        others = [c for c in ordered.column_names if c not in keys]
        keep_nulls = pc.ScalarAggregateOptions(skip_nulls=False)  # a value set to null stays null
        last = ordered.group_by(keys, use_threads=False).aggregate([(c, "last", keep_nulls) for c in others])
        names = {f"{c}_last": c for c in others}
        last = last.rename_columns([names.get(n, n) for n in last.column_names])
        last = last.filter(pc.not_equal(last.column(OP), Op.DELETE.value))
        snapshot_ops = pa.array([Op.SNAPSHOT.value] * last.num_rows, pa.string())
        last = last.set_column(last.schema.get_field_index(OP), OP, snapshot_ops)
        return last.select(self.arrow_schema.names).sort_by([(k, "ascending") for k in keys]).cast(self.arrow_schema)

    def drop_snapshots(self) -> int:
        """Remove every materialised snapshot (after the queries that started from them are past them)."""
        import shutil

        root = self.path / "snapshots"
        if not root.exists():
            return 0
        names = [n for n in os.listdir(root) if not n.startswith(".")]
        for n in names:
            shutil.rmtree(root / n)
        return len(names)

    def open_channels(self) -> list[str]:
        """Open channels in key-hash order, so neighbours in the list can be merged."""
        states = [c for c in self.channels() if c.closed_at is None]
        return [c.id for c in sorted(states, key=lambda c: c.hash_range[0])]

    def read_all(self) -> pa.Table:
        """Every record of every channel (for tests and demos)."""
        batches = [b for c in self.channels() for b in self.read(c.id, c.earliest, c.head)]
        return pa.Table.from_batches(batches, schema=self.arrow_schema)
