"""Segments of the local log: immutable Arrow IPC files that name the records they hold and their checksum.

A segment is named ``<start>-<end>-<crc>.arrow``: it holds records ``[start, end)`` of its channel
(12-digit positions), and ``crc`` (8 hex digits) is the CRC-32C of the whole file (Castagnoli; the
``crc32c`` package computes it with the CPU's instruction, about 3.5x zlib's CRC-32 here), which catches any
flipped, truncated or rewritten bytes (every error burst up to 32 bits is caught). The name is all a reader
needs to check a segment, so no index grows with the log: :func:`checked_batches` verifies the checksum, the
schema and the row count before returning a single row, and :func:`tile` checks that a channel's segments
cover exactly the range its manifest entry publishes, no record missing or held twice.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from crc32c import crc32c

from cdc.backends.local.errors import CorruptLogError
from cdc.backends.local.files import fault, write_atomic

SEGMENT_ROWS = 65_536  # most records in one segment file, so checking one costs a bounded read
_NAME = re.compile(r"^(\d{12})-(\d{12})-([0-9a-f]{8})\.arrow$")


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    crc: int
    path: Path


def listed(d: Path) -> list[Segment]:
    """The segment files in ``d`` (other names are not ours and are ignored), ordered by position."""
    try:
        names = os.listdir(d)
    except FileNotFoundError:  # a channel's folder is made by its first append
        return []
    segments = []
    for name in names:
        m = _NAME.match(name)
        if m:
            segments.append(Segment(int(m.group(1)), int(m.group(2)), int(m.group(3), 16), d / name))
    segments.sort(key=lambda s: (s.start, s.end, s.path.name))
    return segments


def tile(segments: Sequence[Segment], earliest: int, head: int, channel: str) -> tuple[Segment, ...]:
    """The segments that hold records ``[earliest, head)``, in order.

    Segments wholly before ``earliest`` (truncated, not yet removed) or at or after ``head`` (not yet
    published, or left by a killed writer) are ignored; any other segment must fit the tiling exactly.
    """
    tiles: list[Segment] = []
    pos = earliest
    for seg in segments:
        if seg.start >= seg.end:
            raise CorruptLogError(f"channel {channel!r}: segment {seg.path} names no records", str(seg.path), channel)
        if seg.end <= earliest or seg.start >= head:
            continue
        if seg.start < pos:
            held = f"segment {tiles[-1].path}" if tiles else f"the earliest position {earliest}"
            raise CorruptLogError(
                f"channel {channel!r}: segment {seg.path} overlaps records already held (up to {pos}, by {held})",
                str(seg.path), channel,
            )
        if seg.start > pos:
            raise CorruptLogError(
                f"channel {channel!r}: records [{pos}, {seg.start}) are missing: no segment holds them "
                f"(the next is {seg.path})", str(seg.path), channel,
            )
        if seg.end > head:
            raise CorruptLogError(
                f"channel {channel!r}: segment {seg.path} runs past the channel's published head {head}",
                str(seg.path), channel,
            )
        tiles.append(seg)
        pos = seg.end
    if pos != head:
        where = str(tiles[-1].path) if tiles else str(segments[0].path.parent) if segments else channel
        raise CorruptLogError(
            f"channel {channel!r}: records [{pos}, {head}) are missing: the channel's published head is {head} "
            f"but its segments end at {pos} (after {where})", where, channel,
        )
    return tuple(tiles)


def remove_unpublished(d: Path, head: int) -> None:
    """Remove segments at or past ``head``: a killed writer's, never published. Writers only (locked)."""
    for seg in listed(d):
        if seg.start >= head:
            with contextlib.suppress(FileNotFoundError):
                seg.path.unlink()


def write(d: Path, start: int, table: pa.Table) -> list[Segment]:
    """Write ``table`` as the segments holding records ``[start, start + rows)`` of the channel in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for offset in range(0, table.num_rows, SEGMENT_ROWS):
        part = table.slice(offset, SEGMENT_ROWS)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(part, max_chunksize=SEGMENT_ROWS)
        data = sink.getvalue()
        crc = crc32c(memoryview(data))
        lo, hi = start + offset, start + offset + part.num_rows
        path = d / f"{lo:012d}-{hi:012d}-{crc:08x}.arrow"
        write_atomic(path, memoryview(data), before_rename="segment-tmp")
        fault("segment-written")
        out.append(Segment(lo, hi, crc, path))
    return out


def checked_batches(seg: Segment, schema: pa.Schema, channel: str) -> list[pa.RecordBatch]:
    """The record batches of ``seg``, once its bytes, schema and row count match what its name claims.

    The batches map the file (no copy); a missing file raises :class:`FileNotFoundError` for the caller to
    tell truncation (data loss) from damage.
    """
    source = pa.memory_map(str(seg.path), "r")
    with source:
        data = source.read_buffer()
        crc = crc32c(memoryview(data))
        if crc != seg.crc:
            raise CorruptLogError(
                f"channel {channel!r}: segment {seg.path} is damaged: its bytes have checksum {crc:08x}, "
                f"its name says {seg.crc:08x} (bytes changed, truncated or rewritten)", str(seg.path), channel,
            )
        try:
            f = pa.ipc.open_file(data)
            batches = [f.get_batch(i) for i in range(f.num_record_batches)]
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptLogError(
                f"channel {channel!r}: segment {seg.path} is not a readable Arrow file ({exc})", str(seg.path), channel
            ) from exc
    if not f.schema.equals(schema):
        raise CorruptLogError(
            f"channel {channel!r}: segment {seg.path} has another schema than the log's", str(seg.path), channel
        )
    rows = sum(b.num_rows for b in batches)
    if rows != seg.end - seg.start:
        raise CorruptLogError(
            f"channel {channel!r}: segment {seg.path} holds {rows} records, its name claims "
            f"{seg.end - seg.start} ([{seg.start}, {seg.end}))", str(seg.path), channel,
        )
    return batches
