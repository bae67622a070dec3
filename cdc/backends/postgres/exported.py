"""``snapshot.mode=exported``: the full snapshot materialised at the replication slot's start.

``CREATE_REPLICATION_SLOT ... LOGICAL pgoutput (SNAPSHOT 'export')`` on a replication connection creates
the slot and exports a snapshot that sees exactly the transactions committed before the slot's consistent
point: every later change is in the slot, every earlier one in the snapshot (no gap, no duplicate). The
export lives only while that connection stays open, and a replayed batch after a driver crash must read
the same rows, so **the snapshot is materialised while the export is held**: each table is cut into chunks
of heap pages (TID range scans), read in parallel by ``snapshot.parallelism`` connections that each import
the snapshot (``SET TRANSACTION SNAPSHOT``), and written as Arrow files under
``snapshot.path/<slot>/``; a ``manifest.json`` written last, atomically, makes the snapshot complete. Each
chunk is then a channel (positions: row indices) that executors read from its file, however often.

A restarted query that asks for its initial offset again finds the manifest and reuses it (the cut is the
slot's consistent point, which only an acknowledged batch moves). A slot without a manifest (a driver
killed while materialising) is dropped and created again with a fresh export.

Snapshot rows carry ``_seq = (consistent point << 20) - 1``: below every change after the cut, so no
snapshot row ever overwrites a newer change.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from psycopg import sql

from cdc.backends.postgres import connection
from cdc.backends.postgres.catalog import TableInfo
from cdc.backends.postgres.chunks import read_arrow, reads_arrow, relation, select_column, typed_batch
from cdc.backends.postgres.positions import pack
from cdc.backends.postgres.records import Layout, Record
from cdc.model import Op
from cdc.snapshots.rows import with_meta

log = logging.getLogger(__name__)

CHUNK_PREFIX = "snapshot:"
MANIFEST = "manifest.json"


def chunk_file(snapshot_dir: Path, channel: str) -> Path:
    _, slot, table, n = channel.split(":")
    return snapshot_dir / slot / table / f"{int(n):06d}.arrow"


@dataclass(frozen=True)
class Manifest:
    cut_lsn: int
    chunks: dict[str, int]
    """Chunk channel -> rows."""


def load_manifest(snapshot_dir: Path, slot: str) -> Manifest | None:
    path = snapshot_dir / slot / MANIFEST
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Manifest(int(data["cut_lsn"]), {str(k): int(v) for k, v in data["chunks"].items()})


def export_and_materialise(
    dsn: str, slot: str, publication: str, layout: Layout, snapshot_dir: Path, chunk_rows: int, parallelism: int
) -> Manifest:
    """Create ``slot`` with an exported snapshot and write the tables' rows as chunk files (see above)."""
    with connection.connect(dsn) as conn:
        if connection.state(conn, slot) is not None:
            log.warning("replication slot %s exists without a complete snapshot: dropping it for a new export", slot)
            connection.drop_slot(conn, slot)
    shutil.rmtree(snapshot_dir / slot, ignore_errors=True)
    began = time.perf_counter()
    held = connection.create_exported_slot(dsn, slot, temporary=False, timeout=None)
    assert held is not None
    try:
        cut_lsn, exported = held.lsn, held.snapshot
        exported_at = time.perf_counter()
        jobs = []
        with connection.connect(dsn) as conn:
            for t in layout.tables:
                size = conn.execute(
                    "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int, "
                    "greatest(reltuples, 0), greatest(relpages, 1) FROM pg_class WHERE oid = %s::regclass",
                    (t.name, t.name),
                ).fetchone()
                assert size is not None
                pages, tuples, relpages = int(size[0]), float(size[1]), int(size[2])
                per_page = max(1.0, tuples / relpages) if tuples > 0 else 50.0
                # Equal page spans: with a remainder chunk (200k rows in 100k chunks made 100k, 97k and 3k),
                # the last task of Spark's job starts a wave of its own.
                count = max(1, math.ceil(per_page * pages / chunk_rows))
                step = max(1, math.ceil(max(pages, 1) / count))
                bounds = list(range(0, max(pages, 1), step))
                for i, lo in enumerate(bounds):
                    hi = bounds[i + 1] if i + 1 < len(bounds) else None
                    jobs.append((t, i, lo, hi))
        seq = pack(cut_lsn) - 1
        when = datetime.now(UTC)

        def run(job: tuple[TableInfo, int, int, int | None]) -> tuple[str, int]:
            return _read_chunk(dsn, exported, layout, snapshot_dir, slot, job, seq, when)

        with ThreadPoolExecutor(max_workers=parallelism) as pool:
            chunks = dict(pool.map(run, jobs))
        manifest = Manifest(cut_lsn, chunks)
        log.info("snapshot of slot %s: %d rows in %d chunks in %.2f s (export %.2f s)", slot, sum(chunks.values()),
                 len(chunks), time.perf_counter() - began, exported_at - began)
        body = json.dumps({"cut_lsn": cut_lsn, "chunks": chunks, "publication": publication}, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=snapshot_dir / slot, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, snapshot_dir / slot / MANIFEST)
        return manifest
    finally:
        held.close()  # ends the export; the slot stays


def _read_chunk(
    dsn: str, exported: str, layout: Layout, snapshot_dir: Path, slot: str,
    job: tuple[TableInfo, int, int, int | None], seq: int, when: datetime,
) -> tuple[str, int]:
    table, n, lo, hi = job
    channel = f"{CHUNK_PREFIX}{slot}:{table.name}:{n}"
    cond = "ctid >= %s::tid" + ("" if hi is None else " AND ctid < %s::tid")
    params: list[Any] = [f"({lo},0)"] + ([] if hi is None else [f"({hi},0)"])
    path = chunk_file(snapshot_dir, channel)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = layout.arrow_schema()
    typed = layout.typed
    # Typed layout: PostgreSQL sends binary values that psycopg's C loaders turn into Python values, and
    # Arrow builds each column at once (no per-value parsing in Python); naive timestamps are read as UTC.
    cols = sql.SQL(", ").join(select_column(c, typed) for c in table.columns)
    query = sql.SQL("SELECT {} FROM {} WHERE " + cond).format(cols, sql.Identifier(*table.name.split(".", 1)))
    rel = relation(table)
    if reads_arrow(layout, table):
        where = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({lo},0)"))
        if hi is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({hi},0)"))
        data = read_arrow(dsn, exported, table, where, (), schema)
        with pa.OSFile(str(path) + ".tmp", "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(with_meta(schema, data, channel, seq, when), max_chunksize=65_536)
        os.replace(str(path) + ".tmp", path)
        return channel, data.num_rows
    rows = 0
    with connection.connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
        with conn.cursor(binary=typed) as cur, pa.OSFile(str(path) + ".tmp", "wb") as sink:
            with pa.ipc.new_file(sink, schema) as writer:
                cur.execute(query, params)
                while True:
                    got = cur.fetchmany(50_000)
                    if not got:
                        break
                    if typed:
                        writer.write_batch(typed_batch(schema, got, channel, rows, seq, when))
                    else:
                        records = [
                            Record(Op.SNAPSHOT, rows + i, when, rel,
                                   tuple(None if v is None else v.encode() for v in row))
                            for i, row in enumerate(got)
                        ]
                        writer.write_batch(layout.batch(records, channel, seq=seq))
                    rows += len(got)
        conn.execute("COMMIT")
    os.replace(str(path) + ".tmp", path)
    return channel, rows
