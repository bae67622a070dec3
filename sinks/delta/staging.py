"""Durable staging of collected micro-batches: the write-ahead log of the sink's pipelined mode.

In pipelined mode ``foreachBatch`` returns once the batch's change records are durably staged here, and the
MERGE of that batch runs in the background while Spark prepares the next batch. Spark may then record the
batch as done before its Delta commit exists; if the process dies in that window, the staged file is still
here and the next start of the sink merges it (with the same application transaction, so exactly once)
before it accepts a new batch. A staged file is removed once its batch is committed.

Layout: ``<dir>/<app id>/<batch id, 20 digits>.arrow`` (Arrow IPC), written to a temporary name, fsynced and
renamed, so a file is whole or absent.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

import pyarrow as pa

_NAME = re.compile(r"^(\d{20})\.arrow$")


class StagingLog:
    def __init__(self, directory: str | os.PathLike[str], app_id: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", app_id)
        self.dir = Path(directory) / safe

    def put(self, batch_id: int, changes: pa.Table) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.dir / f"{batch_id:020d}.arrow"
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                with pa.ipc.new_file(f, changes.schema) as writer:
                    writer.write_table(changes)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return target

    def pending(self) -> list[int]:
        """Batch ids staged and not yet removed, ascending."""
        if not self.dir.exists():
            return []
        ids = [int(m.group(1)) for n in os.listdir(self.dir) if (m := _NAME.match(n))]
        return sorted(ids)

    def get(self, batch_id: int) -> pa.Table:
        with pa.memory_map(str(self.dir / f"{batch_id:020d}.arrow"), "r") as source:
            return pa.ipc.open_file(source).read_all()

    def remove(self, batch_id: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{batch_id:020d}.arrow").unlink()
