"""A driver process for the kill -9 test: runs a snapshot-start query the way Spark does (log a batch's end
offset, then read and write its output, then commit), into files under ``work``. With ``--die-after N`` it
SIGKILLs itself after logging the end offset of batch N, before writing that batch: the restarted driver
must replay the batch from the logged offsets and produce the same rows. With ``--die-materialising`` it
SIGKILLs itself once the first snapshot chunk file is written, before the manifest: the restarted driver must
drop the slot and export a new snapshot.

    python -m tests.backends.postgres.snapshot_driver DSN SNAPSHOT_DIR WORK [--die-after N | --die-materialising]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather as feather

from cdc.backend import open_backend
from cdc.backends.postgres import exported as snapshot
from cdc.planner import Planner, positions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("snapshot_dir")
    parser.add_argument("work", type=Path)
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--die-materialising", action="store_true")
    args = parser.parse_args()
    if args.die_materialising:
        read_chunk = snapshot._read_chunk

        def die_after_first(*a: Any, **kw: Any) -> tuple[str, int]:
            out = read_chunk(*a, **kw)
            os.kill(os.getpid(), signal.SIGKILL)
            return out

        snapshot._read_chunk = die_after_first  # type: ignore[assignment]
    backend = open_backend("postgres", {"dsn": args.dsn, "tables": "items", "slot.name": "killed_driver",
                                        "snapshot.path": args.snapshot_dir, "snapshot.chunkRows": "400",
                                        "snapshot.mode": "exported"})
    planner = Planner(backend)
    offsets = args.work / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    logged = sorted(int(p.name) for p in offsets.iterdir())
    ends = [json.loads((offsets / str(n)).read_text()) for n in logged]
    initial_file = args.work / "initial"
    if not initial_file.exists():
        initial_file.write_text(json.dumps(planner.initial("snapshot")))
    start = json.loads(initial_file.read_text())
    batch = 0
    for n, end in zip(logged, ends, strict=True):  # replay or skip what the log holds
        out = args.work / f"out-{n}.arrow"
        if not out.exists():
            _write(backend, start, end, out)
        start, batch = end, n + 1
    while True:
        if batch > 0:
            backend.acknowledge(positions(start))  # the commit of the previous batch
        end = planner.next(start, 500)
        if end == start:
            break
        (offsets / str(batch)).write_text(json.dumps(end))
        if args.die_after is not None and batch == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        _write(backend, start, end, args.work / f"out-{batch}.arrow")
        start, batch = end, batch + 1


def _write(backend: object, start: dict[str, object], end: dict[str, object], out: Path) -> None:
    parts = [backend.reader().read(r.channel, r.start, r.end) for r in Planner.ranges(start, end)]  # type: ignore[attr-defined]
    table = pa.Table.from_batches([b for p in parts for b in p], schema=backend.schema())  # type: ignore[attr-defined]
    feather.write_feather(table, str(out) + ".tmp")
    os.replace(str(out) + ".tmp", out)


if __name__ == "__main__":
    main()
