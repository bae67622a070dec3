"""Write-once files of the rows a chunked snapshot read, so that every later read of a chunk yields the same rows.

A chunk is read live, at its batch's cut. A retried task can read the cut again (the driver still holds it),
but a batch replayed after the driver died cannot: the cut is gone with the driver. Spark replays a batch with
the same offsets and a sink that already committed one run of the batch skips the others, so every run of a
batch must emit the same rows. Hence each chunk read (and each read of re-keyed rows, :mod:`.holdback`) is
written here before any of its rows is handed to Spark, **once**: the first complete file wins
(``os.link`` of a finished temporary file), and every run, the first included, yields the winner's rows. A
run that finds no file (its predecessors never completed the read, so no sink saw their rows) reads at the
cut it has, and the file records that cut: the next batch's planning finds it and holds back the changes the
rows already include (:class:`.state.Late`).

Files live under ``<root>/<cut position>/<name>.arrow`` (Arrow IPC, LZ4-compressed: a third of the
uncompressed size for typical rows, whose metadata columns repeat one value, and no slower to write) and are
needed until the batch after theirs is committed: :meth:`ChunkStore.cleanup` removes the cuts below a
committed position. They hold the chunks of at most a few batches, never the table; the last batch's stay
until the query's next batch (under ``Trigger.AvailableNow``: its next run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc.snapshots.holdback import late_keys, rekeyed_from_json
from cdc.snapshots.planning import SnapshotStart
from cdc.snapshots.state import Cut, Late, SnapshotState

log = logging.getLogger(__name__)

_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
_BATCH_ROWS = 65_536  # rows per Arrow batch in a file and handed to Spark: bounds a task's buffers, whatever the chunk


def entry_name(*parts: Any) -> str:
    """A file name for a read, stable across runs: a digest of what identifies it (a table and a key range)."""
    return hashlib.sha1(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()[:32]


class ChunkStore:
    """The write-once files of a query's chunk reads, under ``root`` (a directory every executor can write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, cut: int, name: str) -> Path:
        return self.root / f"{cut:020d}" / f"{name}.arrow"

    def get(self, cut: int, name: str) -> tuple[pa.Table, dict[str, str]] | None:
        path = self._path(cut, name)
        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            return None
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        return table.replace_schema_metadata(None), meta

    def meta(self, cut: int, name: str) -> dict[str, str] | None:
        """The metadata a read recorded (its cut, its re-keyed keys), or None when no read completed."""
        path = self._path(cut, name)
        try:
            with pa.memory_map(str(path)) as source:
                schema = pa.ipc.open_file(source).schema
        except FileNotFoundError:
            return None
        return {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}

    def put_once(self, cut: int, name: str, table: pa.Table, meta: dict[str, str]) -> tuple[pa.Table, dict[str, str]]:
        """Keep ``table`` (with ``meta``) as the read ``name`` of ``cut`` unless a read completed first; return
        what is kept."""
        path = self._path(cut, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        schema = table.schema.with_metadata({k.encode(): v.encode() for k, v in meta.items()})
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
        won = False
        try:
            with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, schema, options=_WRITE_OPTIONS) as writer:
                writer.write_table(table.replace_schema_metadata(schema.metadata), max_chunksize=_BATCH_ROWS)
                # The file must be whole before it is published: a later run trusts any file it finds.
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
                won = True
            except FileExistsError:
                log.info("chunk read %s of cut %d completed before: yielding its rows", name, cut)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if won:  # the file holds these rows: no need to read them back (in the file's batches, as a reader gets them)
            plain = table.replace_schema_metadata(None)
            return pa.Table.from_batches(plain.to_batches(max_chunksize=_BATCH_ROWS), plain.schema), dict(meta)
        kept = self.get(cut, name)
        assert kept is not None, f"{path} vanished after it was written"
        return kept

    def cleanup(self, below: int) -> None:
        """Remove every cut below ``below``: their batches' successors are committed, nothing reads them again."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name.isdigit() and int(entry.name) < below:
                shutil.rmtree(entry, ignore_errors=True)


def recorded(store: ChunkStore, state: SnapshotState, rekeyed: str | None) -> dict[str, list[Late]]:
    """After the batch whose end offset holds ``state`` ran: the late entries its reads recorded in ``store`` (a
    chunk, or the re-keyed rows under the entry ``rekeyed``, read at another cut than ``state.cut``)."""
    if state.cut is None:
        return {}
    pos = int(state.cut.pos)
    out: dict[str, list[Late]] = {}
    for table, chunk in state.chunks():
        meta = store.meta(pos, entry_name(table, chunk.after, chunk.upto))
        if meta is None:
            log.warning("chunk (%s, %s] of %s was never read completely (the batch's sink did not read every "
                        "partition?)", chunk.after, chunk.upto, table)
            continue
        cut = Cut.from_json(json.loads(meta["cut"]), "chunk file")
        if cut != state.cut:
            out.setdefault(table, []).append(Late(cut, chunk.after, chunk.upto))
    meta = store.meta(pos, rekeyed) if rekeyed is not None else None
    if meta is not None:
        cut = Cut.from_json(json.loads(meta["cut"]), "re-keyed rows file")
        if cut != state.cut:
            for table, entries in late_keys(cut, rekeyed_from_json(meta[rekeyed])).items():  # type: ignore[index]
                out.setdefault(table, []).extend(entries)
    return out


def save_start(path: Path, begun: SnapshotStart) -> None:
    """Keep a snapshot's start (atomically): a restarted driver, asked for the initial offset again, reads it."""
    body = json.dumps({"position": begun.position,
                       "last": {t: None if k is None else list(k) for t, k in begun.last.items()}})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".start-")
    with os.fdopen(fd, "w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_start(path: Path) -> SnapshotStart | None:
    """The start :func:`save_start` kept (None: none)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return SnapshotStart(data["position"], {t: None if k is None else tuple(k) for t, k in data["last"].items()})
