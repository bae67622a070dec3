"""The reconciliation of ``cdc verify``: chunk checksums on both sides, then rows of the chunks that differ.

**Chunks.** The source splits its table into key ranges ``(after, upto]`` with the chunked snapshot's chunker
(each ``chunk_rows`` keys, in the source's own key order), plus a last open range above its largest key (rows
only the Delta table has). Both sides compute each chunk's checksum where the data is (:mod:`.canonical`): the
source in one SQL aggregate per chunk, all chunks in one read-only transaction; the Delta side over one
version of the table.

**A consistent point while writes continue.** A source read at a snapshot names two positions: ``before``,
below every change it may not see, and ``after``, above every change it sees. When the pipeline's committed
position is known (``VerifySource.pipeline_position``: PostgreSQL reads the query's replication slot, MariaDB
the query's checkpoint), a re-check reads the Delta table only once the pipeline has passed ``after`` (or has not moved for ``idle``
seconds: a query whose tables see no changes runs no batch, so its position stays put): every change the
source read sees is then in the Delta table. The first read of all chunks does not wait. Changes the Delta table holds that the source read did not see yet are told by the row's
sequence column (``_seq``): a Delta row with a sequence at or above ``before`` was written by a change newer
than the read, and its key is *in flight*, not a difference. A chunk whose checksums differ is compared
(its sub-ranges of :attr:`_Bisect.LEAF` keys first, by checksum, then the rows of those that differ) at a
new source read, ``rechecks`` times: a key is reported only if every re-check found it different
(and not in flight). A key deleted after a read leaves no Delta row to carry its sequence, so that one
re-check sees it missing; the next read no longer has it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from cdc.errors import TerminalError
from cdc.verify.canonical import EMPTY, Kind, chunk_digests, encode, kind_of, row_hashes

log = logging.getLogger(__name__)

Key = tuple[str, ...]
SEQ = "_seq"
WHOLE_ROWS = 1_000_000
"""A Delta table of at most this many rows is read into memory whole; a larger one by groups of chunks."""


class VerifyError(TerminalError):
    """``cdc verify`` cannot compare: the table does not exist or has no key, or the Delta path is not that
    table's (missing, or its columns do not match). The message names the table or path."""


@dataclass(frozen=True)
class Range:
    """A chunk ``(after, upto]`` in the source's key order; ``None`` is unbounded."""

    after: Key | None
    upto: Key | None


def ranges_between(bounds: Sequence[Key], last: Key | None) -> list[Range]:
    """The chunks a source's sorted upper ``bounds`` cut its keys into: one per bound, then one after the
    ``last`` key (new keys land there); one open range for an empty table (``last`` None)."""
    if last is None:
        return [Range(None, None)]
    out, after = [], None
    for upto in bounds:
        out.append(Range(after, upto))
        after = upto
    return [*out, Range(last, None)]


def integer_range_filter(name: str, ranges: Sequence[Range]) -> ds.Expression | None:
    """A filter of the Delta rows inside ``ranges`` (adjacent, in order) on a single integer key ``name``."""
    if not ranges:
        return None
    field = ds.field(name)
    where = ds.scalar(True)
    if ranges[0].after is not None:
        where = where & (field > pa.scalar(int(ranges[0].after[0]), pa.int64()))
    if ranges[-1].upto is not None:
        where = where & (field <= pa.scalar(int(ranges[-1].upto[0]), pa.int64()))
    return where


@dataclass(frozen=True)
class SourceRow:
    """A row as a report shows it: its key's text forms and its values."""

    key: list[Any]
    row: dict[str, Any]


class SourceRead(Protocol):
    """One read of the source at a consistent snapshot (a read-only transaction)."""

    before: int
    """No change the read misses has a sequence below this."""
    after: int
    """Every change the read sees has a position below this (what the pipeline must pass)."""

    def ranges(self, chunk_rows: int) -> list[Range]:
        """The table's chunks at this snapshot, ascending, ending with the open range above its largest key."""

    def checksum(self, chunk: Range, columns: Sequence[tuple[str, Kind]], keys: Sequence[str]) -> tuple[int, int]:
        """(rows, MD5 of the rows' pieces in key order) of the chunk, computed by the source
        (:func:`~cdc.verify.canonical.chunk_digests`)."""

    def checksums(self, chunks: Sequence[Range], columns: Sequence[tuple[str, Kind]],
                  keys: Sequence[str]) -> list[tuple[int, int]]:
        """:meth:`checksum` of each chunk (a source may compute them in parallel sessions at the same snapshot)."""

    def shared(self) -> AbstractContextManager[SourceRead]:
        """Another read at the same snapshot (a second session, for work in parallel)."""

    def split(self, chunk: Range, rows: int, columns: Sequence[tuple[str, Kind]],
              keys: Sequence[str]) -> list[tuple[Range, int, int]]:
        """The chunk as consecutive ranges of ``rows`` keys each (the first starts at ``chunk.after``, the last
        ends at the chunk's largest key), each with its checksum, in one pass; empty if the chunk has no rows."""

    def rows(self, chunk: Range, columns: Sequence[tuple[str, Kind]], keys: Sequence[str]) -> dict[bytes, int]:
        """The chunk's row hashes by their key's canonical encoding."""

    def show(self, chunk: Range, keys: Sequence[tuple[str, Kind]], wanted: Sequence[bytes]) -> dict[bytes, SourceRow]:
        """The rows of the chunk whose key encodings are ``wanted``, to show."""


class VerifySource(Protocol):
    """What a backend provides for ``cdc verify`` (PostgreSQL: :class:`cdc.backends.postgres.verify.
    PostgresVerifySource`; MariaDB: :class:`cdc.backends.mysql.verify.MySQLVerifySource`)."""

    table: str
    columns: tuple[str, ...]
    """The table's columns in order."""
    keys: tuple[str, ...]
    """Its primary key's columns in order."""

    def check_kinds(self, kinds: dict[str, Kind]) -> None:
        """Refuse (VerifyError naming the column) a Delta column type the source column cannot be encoded as."""

    def read(self) -> AbstractContextManager[SourceRead]:
        """A read of the table at a consistent snapshot."""

    def assign(self, keys: pa.Table, ranges: Sequence[Range]) -> np.ndarray:
        """The index in ``ranges`` of each key (Delta rows' key columns), in the source's key order."""

    def order(self, keys: pa.Table) -> np.ndarray:
        """The permutation that sorts ``keys`` (Delta rows' key columns) in the source's key order."""

    def range_filter(self, ranges: Sequence[Range]) -> ds.Expression | None:
        """An Arrow filter selecting the Delta rows in ``ranges`` (consecutive, ascending): keys above the
        first's ``after`` and up to the last's ``upto``, the bounds bound as values; None when Arrow cannot
        order the keys as the source does (then the Delta table is read whole)."""

    def pipeline_position(self) -> int | None:
        """The pipeline's committed position (None: unknown); compared with :attr:`SourceRead.after`."""

    def close(self) -> None: ...


@dataclass
class RowDifference:
    kind: str  # "missing" (only the source has the key), "extra" (only Delta), "changed"
    key: list[Any]
    source: dict[str, Any] | None
    delta: dict[str, Any] | None


@dataclass
class ChunkDifference:
    after: list[str] | None
    upto: list[str] | None
    rows: list[RowDifference] = field(default_factory=list)


@dataclass
class Report:
    table: str
    delta_path: str
    delta_version: int
    chunks: int
    source_rows: int
    delta_rows: int
    rechecks: int
    seconds: float
    differences: list[ChunkDifference]
    pipeline_reached: bool = True

    @property
    def equal(self) -> bool:
        return not self.differences

    def to_json(self) -> str:
        out = asdict(self)
        out["equal"] = self.equal
        out["differing_rows"] = sum(len(c.rows) for c in self.differences)
        return json.dumps(out, default=str, sort_keys=True)

    def summary(self) -> str:
        n = sum(len(c.rows) for c in self.differences)
        verdict = "equal" if self.equal else f"DIFFERENT: {n} rows in {len(self.differences)} chunks"
        return (f"{self.table} vs {self.delta_path} (version {self.delta_version}): {verdict}; "
                f"{self.source_rows} source rows, {self.delta_rows} Delta rows, {self.chunks} chunks, "
                f"{self.rechecks} re-checks, {self.seconds:.2f} s")


class DeltaSide:
    """The Delta table's rows as the comparison needs them: each row's chunk, key encoding and hash."""

    def __init__(self, path: str, source: VerifySource, storage_options: dict[str, str] | None = None) -> None:
        self.path = path
        self.source = source
        self.storage_options = storage_options
        self.kinds = self._check()
        self.columns = [(c, self.kinds[c]) for c in source.columns]
        self.keys = [(c, self.kinds[c]) for c in source.keys]

    def _open(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path, storage_options=self.storage_options)
        except TableNotFoundError:
            raise VerifyError(f"{self.path!r} is not a Delta table (no _delta_log there): give the Delta path "
                              f"{self.source.table!r} is written to") from None

    def _check(self) -> dict[str, Kind]:
        schema = pa.schema(self._open().schema().to_arrow())  # delta-rs hands out an Arrow C schema
        fields = {f.name: f for f in schema}
        missing = [c for c in self.source.columns if c not in fields]
        if missing:
            raise VerifyError(
                f"the Delta table at {self.path!r} is not {self.source.table!r}'s: it has no column "
                f"{', '.join(map(repr, missing))} (its columns: {', '.join(fields)})")
        kinds: dict[str, Kind] = {}
        for c in self.source.columns:
            kind = kind_of(fields[c].type)
            if kind is None:
                raise VerifyError(f"the Delta table at {self.path!r}: column {c!r} has type {fields[c].type}, "
                                  "which cdc verify cannot compare")
            kinds[c] = kind
        self.source.check_kinds(kinds)
        self.has_seq = SEQ in fields
        return kinds

    def _names(self) -> list[str]:
        return [*self.source.columns, *([SEQ] if self.has_seq else [])]

    def load(self, where: ds.Expression | None = None) -> tuple[int, pa.Table]:
        """One version of the table: all its rows, or those ``where`` selects (files and row groups outside it
        skipped by their statistics)."""
        dt = self._open()
        if where is None:
            return int(dt.version()), dt.to_pyarrow_table(columns=self._names())
        return int(dt.version()), dt.to_pyarrow_dataset().to_table(columns=self._names(), filter=where)

    def grouped(self, ranges: Sequence[Range], per: int) -> tuple[int, int, list[tuple[int, int]]] | None:
        """(version, rows, each range's (rows, digest)) of one version of the table, read ``per`` ranges at a
        time (only one group's rows in memory); None when the source's keys cannot be filtered by Arrow."""
        dt = self._open()
        dataset = dt.to_pyarrow_dataset()
        keys = list(self.source.keys)
        sums: list[tuple[int, int]] = []
        rows = 0
        for g in range(0, len(ranges), per):
            group = ranges[g:g + per]
            where = self.source.range_filter(group)
            if where is None:
                return None
            # Little read-ahead: a row group much larger than a group (one file written at once) is decoded a
            # batch at a time, its rows outside the group dropped batch by batch.
            table = dataset.scanner(columns=self._names(), filter=where, batch_readahead=1,
                                    fragment_readahead=1).to_table()
            order = self.source.order(table.select(keys)) if table.num_rows else np.zeros(0, dtype=np.int64)
            sums.extend(chunk_digests(encode(table, self.columns), order, self.chunked(table, group), len(group)))
            rows += table.num_rows
        return int(dt.version()), rows, sums

    def count(self) -> int:
        """The rows of the table's current version (from the Parquet footers)."""
        return int(self._open().to_pyarrow_dataset().count_rows())

    def chunked(self, table: pa.Table, ranges: Sequence[Range]) -> np.ndarray:
        keys = table.select(list(self.source.keys))
        return self.source.assign(keys, ranges) if table.num_rows else np.zeros(0, dtype=np.int64)

    def rows(self, table: pa.Table, idx: np.ndarray, encoded: pa.Array) -> dict[bytes, tuple[int, int | None, int]]:
        """The rows ``idx`` of ``table`` (whose encodings are ``encoded``) by key encoding: (hash, sequence or
        None, index in ``table``)."""
        at = pa.array(idx, pa.int64())
        picked = table.take(at)
        keys = encode(picked, self.keys).to_pylist()
        hashes = row_hashes(encoded.take(at))
        seqs = picked.column(SEQ).to_pylist() if self.has_seq else [None] * len(idx)
        return {k: (int(h), s, int(i)) for k, h, s, i in zip(keys, hashes, seqs, idx, strict=True)}


def _wait_for(source: VerifySource, position: int, timeout: float, idle: float) -> bool:
    """Wait until the pipeline's committed position passes ``position``; False when unknown, after ``timeout``
    seconds, or once it has not moved for ``idle`` seconds (an idle pipeline: a query advances its position
    only when a batch commits, and no batch runs while its tables see no changes)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        got = source.pipeline_position()
        if got is None:
            return False
        if got >= position:
            return True
        now = time.monotonic()
        if got != last:
            last, since = got, now
        if now >= deadline or now - since >= idle:
            log.info("the pipeline is at %d, below %d, and did not move for %.1f s", got, position, now - since)
            return False
        time.sleep(0.1)


def _diff(source: dict[bytes, int], delta: dict[bytes, tuple[int, int | None, int]], before: int) -> list[tuple[str, bytes]]:
    """(kind, key encoding) of each key that differs, keys written by changes newer than the read left out."""
    out: list[tuple[str, bytes]] = []
    for k in sorted(source.keys() | delta.keys()):
        s, d = source.get(k), delta.get(k)
        if d is not None and d[1] is not None and d[1] >= before:
            continue  # written by a change newer than the source read: in flight
        if s is not None and d is not None:
            if s != d[0]:
                out.append(("changed", k))
        elif s is not None:
            out.append(("missing", k))
        else:
            out.append(("extra", k))
    return out


def verify(source: VerifySource, delta_path: str, *, chunk_rows: int = 50_000, rechecks: int = 3,
           wait_timeout: float = 30.0, idle: float = 2.0, storage_options: dict[str, str] | None = None,
           whole_rows: int = WHOLE_ROWS) -> Report:
    """Compare the source table with the Delta table at ``delta_path`` (see the module's description).

    A Delta table of at most ``whole_rows`` rows is read whole (one read, fastest); a larger one, when the source
    can express its key ranges as Arrow filters, is read by groups of consecutive chunks holding about
    ``whole_rows`` source rows, so its memory is bounded by a group, not the table."""
    started = time.perf_counter()
    delta = DeltaSide(delta_path, source, storage_options)
    columns, keys = delta.columns, list(source.keys)
    # The first read does not wait: chunks that differ only because the pipeline is behind are re-checked. The
    # Delta side (Arrow and DuckDB, releasing the GIL) reads and hashes its rows while the source finds its
    # chunks and computes their checksums.
    reached = True

    def delta_side() -> tuple[int, pa.Table, pa.Array, np.ndarray]:
        v, t = delta.load()
        return v, t, encode(t, delta.columns), source.order(t.select(keys))

    bounded = delta.count() > whole_rows
    grouped: tuple[int, int, list[tuple[int, int]]] | None = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        if bounded:  # the groups' filters need the ranges: the Delta side starts once they are found
            with source.read() as read:
                ranges = read.ranges(chunk_rows)
                per = max(1, whole_rows // max(1, chunk_rows))
                pending_groups = pool.submit(delta.grouped, ranges, per)
                source_sums = read.checksums(ranges, columns, keys)
            grouped = pending_groups.result()
            bounded = grouped is not None
            log.info("the Delta table is read by groups of %d chunks: %s", per,
                     "yes" if bounded else "no, the source's keys cannot be filtered by Arrow")
        if grouped is not None:
            version, delta_rows, delta_sums = grouped
        else:
            pending = pool.submit(delta_side)
            with source.read() as read:
                ranges = read.ranges(chunk_rows)
                source_sums = read.checksums(ranges, columns, keys)
            version, table, encoded, order = pending.result()
            delta_rows = int(table.num_rows)
            delta_sums = chunk_digests(encoded, order, delta.chunked(table, ranges), len(ranges))
    differing = [i for i, (a, b) in enumerate(zip(source_sums, delta_sums, strict=True)) if a != b]
    log.info("%d of %d chunks differ at the first read", len(differing), len(ranges))
    found: dict[int, list[tuple[str, bytes]]] = {}
    shown: dict[int, list[RowDifference]] = {}
    done = 0
    while differing and done < rechecks:
        done += 1
        with source.read() as read:
            reached = _wait_for(source, read.after, wait_timeout, idle)
            # Bounded: only the differing chunks' rows are read (each one's filter, or-ed).
            where = None if not bounded else _any([source.range_filter([ranges[i]]) for i in differing])
            version, table = delta.load(where)
            delta_rows = int(table.num_rows) if where is None else delta.count()
            chunk = delta.chunked(table, ranges)
            # Only the rows of the chunks that differed are hashed again.
            part = table.take(pa.array(np.flatnonzero(np.isin(chunk, differing)), pa.int64()))
            part_chunk = chunk[np.isin(chunk, differing)]
            encoded = encode(part, delta.columns)
            again: dict[int, list[tuple[str, bytes]]] = {}
            # The differing chunks are settled by two sessions at the read's snapshot, every other chunk each.
            with read.shared() as other, ThreadPoolExecutor(max_workers=1) as pool:
                bisects = [_Bisect(r, delta, part, encoded, read.before) for r in (read, other)]

                def settle(b: _Bisect, mine: list[int], at: np.ndarray) -> dict[int, list[tuple[str, bytes]]]:
                    return {i: b.settle(ranges[i], np.flatnonzero(at == i)) for i in mine}

                odd = pool.submit(settle, bisects[1], differing[1::2], part_chunk)
                settled = {**settle(bisects[0], differing[0::2], part_chunk), **odd.result()}
                for n, i in enumerate(differing):
                    diff = settled[i]
                    if done > 1:  # only differences every re-check found persist (a change in flight passes)
                        diff = [d for d in diff if d in set(found.get(i, []))]
                    if diff:
                        again[i] = diff
                    if diff and done == rechecks:
                        shown[i] = bisects[n % 2].shown(diff)
            found = again
            differing = sorted(found)
    differences = [ChunkDifference(_listed(ranges[i].after), _listed(ranges[i].upto), shown[i]) for i in differing]
    return Report(source.table, delta_path, version, len(ranges), sum(c for c, _ in source_sums),
                  delta_rows, done, time.perf_counter() - started, differences, reached)


class _Bisect:
    """Narrows a differing range down: the source splits it into sub-ranges of ``LEAF`` keys with a checksum
    each, in one pass; the Delta side places its rows into the same sub-ranges; only the sub-ranges whose
    checksums differ are compared row by row."""

    LEAF = 500

    def __init__(self, read: SourceRead, delta: DeltaSide, table: pa.Table, encoded: pa.Array, before: int) -> None:
        self.read, self.delta, self.table, self.encoded, self.before = read, delta, table, encoded, before
        self.keys = list(delta.source.keys)
        self.delta_rows: dict[bytes, tuple[int, int | None, int]] = {}
        self.leaf: dict[bytes, Range] = {}
        """The range each differing key was compared in (where its source row is fetched to be shown)."""

    def settle(self, rng: Range, idx: np.ndarray) -> list[tuple[str, bytes]]:
        """The differences in ``rng``, whose Delta rows are ``idx`` (of ``table``)."""
        split = [] if rng.upto is None else self.read.split(rng, self.LEAF, self.delta.columns, self.keys)
        if not split:
            return self.compare(rng, idx)
        subs = [r for r, _, _ in split]
        sums = [(n, total) for _, n, total in split]
        if subs[-1].upto != rng.upto:  # Delta rows above the source's largest key in the range
            subs.append(Range(subs[-1].upto, rng.upto))
            sums.append(EMPTY)
        at = pa.array(idx, pa.int64())
        keys = self.table.take(at).select(self.keys)
        placed = self.delta.source.assign(keys, subs) if len(idx) else np.zeros(0, dtype=np.int64)
        order = self.delta.source.order(keys) if len(idx) else np.zeros(0, dtype=np.int64)
        delta_sums = chunk_digests(self.encoded.take(at), order, placed, len(subs))
        return [d for j, sub in enumerate(subs) if sums[j] != delta_sums[j] for d in self.compare(sub, idx[placed == j])]

    def compare(self, rng: Range, idx: np.ndarray) -> list[tuple[str, bytes]]:
        rows = self.delta.rows(self.table, idx, self.encoded)
        self.delta_rows.update(rows)
        diff = _diff(self.read.rows(rng, self.delta.columns, self.keys), rows, self.before)
        self.leaf.update((k, rng) for _, k in diff)
        return diff

    def shown(self, diff: list[tuple[str, bytes]]) -> list[RowDifference]:
        """The differing rows as the report shows them: the source's and the Delta table's values."""
        wanted: dict[Range, list[bytes]] = {}
        for kind, k in diff:
            if kind != "extra":
                wanted.setdefault(self.leaf[k], []).append(k)
        source = {k: row for rng, ks in wanted.items() for k, row in self.read.show(rng, self.delta.keys, ks).items()}
        out = []
        columns = list(self.delta.source.columns)
        for kind, k in diff:
            s = source.get(k)
            at = self.delta_rows.get(k)
            d = None if at is None else self.table.slice(at[2], 1).select(columns).to_pylist()[0]
            key = s.key if s is not None else [d[c] for c in self.delta.source.keys] if d is not None else []
            out.append(RowDifference(kind, key, None if s is None else s.row, d))
        return out


def _any(filters: Sequence[ds.Expression | None]) -> ds.Expression | None:
    out: ds.Expression | None = None
    for f in filters:
        if f is None:
            return None
        out = f if out is None else out | f
    return out


def _listed(key: Key | None) -> list[str] | None:
    return None if key is None else list(key)


def iter_lines(report: Report) -> Iterator[str]:
    """The report for people: each differing key range and its rows, then the summary line."""
    for c in report.differences:
        lo = "-inf" if c.after is None else "(" + ", ".join(c.after) + ")"
        hi = "+inf" if c.upto is None else "(" + ", ".join(c.upto) + ")"
        yield f"chunk ({lo}, {hi}]: {len(c.rows)} differing rows"
        for r in c.rows:
            yield f"  {r.kind} key {json.dumps(r.key, default=str)}"
            if r.source is not None:
                yield f"    source: {json.dumps(r.source, default=str, sort_keys=True)}"
            if r.delta is not None:
                yield f"    delta:  {json.dumps(r.delta, default=str, sort_keys=True)}"
    if not report.pipeline_reached:
        yield "note: the pipeline's committed position was not known or not reached; differences may be in flight"
    yield report.summary()
