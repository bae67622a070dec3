"""A driver process for the kill -9 test: streams a table's changes the way Spark does (log a batch's end offset,
read and write its output, commit) into files under ``work``. With ``--die-after N`` it SIGKILLs itself after
logging the end offset of batch N, before writing that batch: the restarted driver must replay the batch from the
logged offsets and produce the same rows. With ``--snapshot PATH`` the query starts with a chunked snapshot kept
under PATH (40-row chunks, two per batch).

    python -m tests.backends.mysql.driver DSN WORK [--die-after N] [--snapshot PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import pyarrow.feather as feather

from cdc.backend import Backend, open_backend
from cdc.offsets import Offset
from cdc.planner import Planner
from cdc.testing import read_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("work", type=Path)
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--snapshot", default=None)
    args = parser.parse_args()
    options = {"dsn": args.dsn, "tables": "items"}
    if args.snapshot:
        options.update({"snapshot.path": args.snapshot, "snapshot.chunkRows": "40", "snapshot.chunksPerBatch": "2"})
    backend = open_backend("mysql", options)
    planner = Planner(backend)
    offsets = args.work / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    logged = sorted(int(p.name) for p in offsets.iterdir())
    initial_file = args.work / "initial"
    if not initial_file.exists():
        initial_file.write_text(json.dumps(planner.initial("snapshot" if args.snapshot else "earliest")))
    start = json.loads(initial_file.read_text())
    batch = 0
    for n in logged:  # replay or skip what the log holds
        end = json.loads((offsets / str(n)).read_text())
        out = args.work / f"out-{n}.arrow"
        if not out.exists():
            _write(backend, start, end, out)
        start, batch = end, n + 1
    while True:
        end = planner.next(start, 100)
        if end == start:
            break
        (offsets / str(batch)).write_text(json.dumps(end))
        if args.die_after is not None and batch == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        _write(backend, start, end, args.work / f"out-{batch}.arrow")
        start, batch = end, batch + 1


def _write(backend: Backend, start: dict[str, Any], end: dict[str, Any], out: Path) -> None:
    table = read_batch(backend, start, end)  # as Spark's tasks read it, a chunked snapshot's windows included
    feather.write_feather(table, str(out) + ".tmp")
    os.replace(str(out) + ".tmp", out)
    backend.acknowledge(Offset.from_json(end).positions())


if __name__ == "__main__":
    main()
