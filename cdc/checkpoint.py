"""Read a streaming query's positions from its Spark checkpoint (offset recovery).

Every batch's end position for every channel lives in Spark's own offset log (``<checkpoint>/offsets/<N>``),
and a batch is committed when ``<checkpoint>/commits/<N>`` exists. Restarting the query with the same
checkpoint replays an uncommitted batch exactly; nothing else is needed for exactly-once. This module is for
the other cases: inspecting where a query is, or starting a *new* query (new checkpoint, new sink, a
re-deployed job whose checkpoint cannot be reused) where an old one left off, by turning the last committed
batch's end offset into a ``startingOffsets`` value.

Spark's offset file format (``OffsetSeqLog``, version 1): the line ``v1``, a line of batch metadata JSON,
then one line per source of the query in the order of the query plan (``-`` for a source without offset).

A checkpoint is a local path or a URI that :mod:`pyarrow.fs` opens (``s3://bucket/ck``, ``gs://...``,
``hdfs://...``; for an S3-compatible store ``s3://bucket/ck?endpoint_override=host:port&scheme=http``),
with the store's credentials from the environment (``AWS_ACCESS_KEY_ID``...), never from the command line.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyarrow import fs

from cdc.channels import Position
from cdc.errors import OffsetError, TerminalError
from cdc.offsets import Offset

_BATCH_FILE = re.compile(r"^\d+$")


class CheckpointError(TerminalError, ValueError):
    """The checkpoint cannot answer the question asked (missing, not a cdc query, mid-snapshot, ...)."""


@dataclass(frozen=True)
class BatchOffsets:
    """The end offsets of one batch of a query, as Spark logged them."""

    batch_id: int
    committed: bool
    metadata: dict[str, Any]
    sources: tuple[dict[str, Any] | None, ...]

    def source(self, index: int = 0) -> Offset:
        """The end offset of source ``index`` (in the order of the query plan) in this batch."""
        if not 0 <= index < len(self.sources):
            raise CheckpointError(f"batch {self.batch_id} has {len(self.sources)} sources; no source #{index}")
        raw = self.sources[index]
        if raw is None or not isinstance(raw.get("channels"), dict):
            raise CheckpointError(f"source #{index} of batch {self.batch_id} is not a cdc source")
        try:
            return Offset.from_json(raw)
        except OffsetError as exc:
            raise CheckpointError(f"source #{index} of batch {self.batch_id}: {exc}") from exc


@dataclass(frozen=True)
class _Location:
    filesystem: fs.FileSystem
    root: str
    name: str

    def batch_ids(self, log: str) -> list[int]:
        selector = fs.FileSelector(f"{self.root}/{log}", allow_not_found=True)
        return sorted(int(i.base_name) for i in self.filesystem.get_file_info(selector) if _BATCH_FILE.match(i.base_name))

    def is_file(self, relative: str) -> bool:
        return bool(self.filesystem.get_file_info(f"{self.root}/{relative}").type == fs.FileType.File)

    def read_text(self, relative: str) -> str:
        with self.filesystem.open_input_stream(f"{self.root}/{relative}") as stream:
            return bytes(stream.read()).decode("utf-8")


def _locate(checkpoint: str | Path) -> _Location:
    text = str(checkpoint)
    try:
        if "://" in text:
            filesystem, root = fs.FileSystem.from_uri(text)
            name = text.split("?", 1)[0]
        else:
            filesystem, root, name = fs.LocalFileSystem(), os.path.abspath(text), text
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError... for a URI it cannot open
        raise CheckpointError(f"{text}: cannot open the checkpoint: {exc}") from exc
    return _Location(filesystem, root.rstrip("/"), name)


def read_batch(checkpoint: str | Path, batch_id: int | None = None) -> BatchOffsets:
    """The offsets of ``batch_id`` (default: the last batch in the offset log, committed or not)."""
    where = _locate(checkpoint)
    ids = where.batch_ids("offsets")
    if not ids:
        raise CheckpointError(f"{where.name}: no offset log (is this a streaming query's checkpointLocation?)")
    bid = ids[-1] if batch_id is None else batch_id
    if not where.is_file(f"offsets/{bid}"):
        raise CheckpointError(
            f"{where.name}: batch {bid} is not in the offset log (it holds {ids[0]}..{ids[-1]})"
        )
    lines = where.read_text(f"offsets/{bid}").splitlines()
    if not lines or lines[0].strip() != "v1":
        raise CheckpointError(
            f"{where.name}/offsets/{bid}: unknown offset log version {lines[0] if lines else '(empty)'!r}"
        )
    metadata = json.loads(lines[1]) if len(lines) > 1 else {}
    sources = tuple(None if line.strip() == "-" else json.loads(line) for line in lines[2:])
    return BatchOffsets(bid, where.is_file(f"commits/{bid}"), metadata, sources)


def last_committed(checkpoint: str | Path) -> BatchOffsets:
    """The last batch whose offsets are logged and whose commit is logged too."""
    where = _locate(checkpoint)
    committed = set(where.batch_ids("commits"))
    for bid in reversed(where.batch_ids("offsets")):
        if bid in committed:
            return read_batch(checkpoint, bid)
    raise CheckpointError(
        f"{where.name}: no committed batch yet; a new query should start where the old one was told to"
    )


def starting_offsets(offset: Offset) -> dict[str, Position]:
    """Turn a batch's end offset into a ``startingOffsets`` JSON object for a new query.

    Every channel starts at its logged end position. A finished channel read to its end keeps its final
    position (so its children may start). Refused while a snapshot is being delivered: a snapshot's chunks are
    not change channels, and a new query cannot resume one half-read; it should start with
    ``startingOffsets=snapshot`` again.
    """
    out: dict[str, Position] = {}
    for cid, entry in offset.channels.items():
        if entry.snapshot:
            if not entry.done:
                raise CheckpointError(
                    f"the batch ended inside a snapshot (chunk {cid!r} not finished); a new query cannot resume a "
                    "half-read snapshot: start it with startingOffsets=snapshot, or use a later batch"
                )
            continue
        out[cid] = entry.pos
    return out
