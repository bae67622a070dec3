"""Snapshots of ``backend=local`` (``startingOffsets=snapshot``): the table's rows at a consistent cut of the
log, materialised as finished chunk channels ``snap-<id>-<n>`` under ``<path>/snapshots/<id>/``, in the
log's own segment format (so the log reads them like any channel)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cdc.backends.local import segments
from cdc.backends.local.files import fault, make_temp_dir, write_atomic
from cdc.backends.local.manifest import MANIFEST, ChannelEntry, Manifest
from cdc.errors import DataLossError
from cdc.model import CHANNEL, OP, POSITION, SEQ, ChangeSchema, Op

if TYPE_CHECKING:
    from cdc.backends.local.log import LocalLog

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX = "snap-"
"""Chunk channels are named ``snap-<snapshot id>-<n>``."""


def materialise(source: LocalLog, chunk_rows: int = 100_000) -> tuple[str, list[str], dict[str, int]]:
    """Materialise the table's rows at a consistent cut of ``source``, without blocking writers.

    The cut (every channel's head) is one published manifest, so it is consistent: a change is either
    before the cut in its channel or after it, and every change after the cut has a larger sequence than
    every change before it. The rows are then folded (last change per key by ``_seq``, deletes removed)
    from the immutable segments before the cut and written as ``snapshot`` records into finished chunk
    channels ``snap-<id>-<n>`` under ``snapshots/<id>/``, published by one rename of their folder.
    Each row keeps the ``_seq`` and ``_commit_ts`` of the last change it folds in.

    Returns ``(snapshot id, chunk channel ids, cut positions per channel)``.
    """
    manifest = source.manifest()
    cut = {cid: e.head for cid, e in manifest.channels.items()}
    schema = source.arrow_schema
    parts: list[pa.RecordBatch] = []
    for cid, entry in manifest.channels.items():
        if entry.earliest > 0:
            raise DataLossError(
                f"a snapshot needs the whole history, but channel {cid!r} was truncated before "
                f"position {entry.earliest}", cid
            )
        parts.extend(source.read(cid, 0, entry.head))
    history = pa.Table.from_batches(parts, schema=schema)
    table = fold(history, source.change_schema)
    sid = f"{time.time_ns():x}{os.getpid():x}"
    tmp = make_temp_dir(source.path, "snap")
    chunks: dict[str, ChannelEntry] = {}
    n_chunks = max(1, -(-table.num_rows // chunk_rows))
    for n in range(n_chunks):
        cid = f"{SNAPSHOT_PREFIX}{sid}-{n}"
        part = table.slice(n * chunk_rows, chunk_rows)
        cols = {name: part.column(name) for name in part.column_names}
        cols[CHANNEL] = pa.array([cid] * part.num_rows, pa.string())
        cols[POSITION] = pa.array(range(part.num_rows), pa.int64())
        (tmp / str(n)).mkdir()
        if part.num_rows:
            segments.write(tmp / str(n), 0, pa.Table.from_pydict(cols, schema=schema))
        chunks[cid] = ChannelEntry((), (0, 0), 0, part.num_rows, True)
    write_atomic(tmp / MANIFEST, Manifest(0, 0, chunks).to_bytes())
    write_atomic(tmp / "cut.json", json.dumps({"positions": cut, "rows": table.num_rows}, sort_keys=True).encode())
    (source.path / "snapshots").mkdir(exist_ok=True)
    fault("snapshot-built")
    os.replace(tmp, source.path / "snapshots" / sid)
    log.info("snapshot %s: %d rows in %d chunks at cut %s", sid, table.num_rows, len(chunks), cut)
    return sid, list(chunks), cut


def fold(history: pa.Table, schema: ChangeSchema) -> pa.Table:
    """The table state after applying ``history``: last change per key, deletes removed, sorted by key."""
    keys = list(schema.keys)
    if history.num_rows == 0:
        return history
    arrow = schema.arrow()
    ordered = history.sort_by([(SEQ, "ascending")])
    others = [c for c in ordered.column_names if c not in keys]
    keep_nulls = pc.ScalarAggregateOptions(skip_nulls=False)  # a value set to null stays null
    last = ordered.group_by(keys, use_threads=False).aggregate([(c, "last", keep_nulls) for c in others])
    names = {f"{c}_last": c for c in others}
    last = last.rename_columns([names.get(n, n) for n in last.column_names])
    last = last.filter(pc.not_equal(last.column(OP), Op.DELETE.value))
    snapshot_ops = pa.array([Op.SNAPSHOT.value] * last.num_rows, pa.string())
    last = last.set_column(last.schema.get_field_index(OP), OP, snapshot_ops)
    return last.select(arrow.names).sort_by([(k, "ascending") for k in keys]).cast(arrow)


def drop_all(source: LocalLog) -> int:
    """Remove every materialised snapshot of ``source`` (after the queries that started from them are past
    them); returns how many there were."""
    root = source.path / "snapshots"
    if not root.exists():
        return 0
    names = [n for n in os.listdir(root) if not n.startswith(".")]
    for n in names:
        shutil.rmtree(root / n)
    return len(names)
