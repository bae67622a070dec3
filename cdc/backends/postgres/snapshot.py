"""The full snapshot of ``startingOffsets=snapshot``, cut exactly at the replication slot's start.

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

import numpy as np
import pyarrow as pa
from psycopg import sql

from cdc.backends.postgres import connection
from cdc.backends.postgres.catalog import BYTEA, TIMESTAMP, TableInfo, arrow_type
from cdc.backends.postgres.pgoutput import Column, Relation
from cdc.backends.postgres.positions import pack, parse_lsn
from cdc.backends.postgres.records import Layout, Record
from cdc.model import OLD_KEY, Op

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


def _relation(table: TableInfo) -> Relation:
    schema, _, name = table.name.partition(".")
    cols = tuple(Column(n, oid, mod, n in table.keys) for n, oid, mod in table.columns)
    return Relation(0, schema, name, cols)


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
    repl = connection.connect(dsn, replication="database")
    try:
        res = repl.pgconn.exec_(
            f"CREATE_REPLICATION_SLOT {sql.Identifier(slot).as_string(repl)} LOGICAL pgoutput "
            "(SNAPSHOT 'export')".encode()
        )
        if res.status != 2:  # TUPLES_OK
            raise RuntimeError(f"CREATE_REPLICATION_SLOT failed: {(res.error_message or b'').decode().strip()}")
        cut_lsn = parse_lsn((res.get_value(0, 1) or b"").decode())
        exported = (res.get_value(0, 2) or b"").decode()
        log.info("slot %s created at %s with exported snapshot %s", slot, (res.get_value(0, 1) or b"").decode(), exported)
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
        repl.close()  # ends the export; the slot stays


def _select(column: tuple[str, int, int], typed: bool) -> sql.Composable:
    name, oid, typmod = column
    ident = sql.Identifier(name)
    if not typed or pa.types.is_string(arrow_type(oid, typmod)):
        return sql.SQL("{}::text").format(ident)
    if oid == TIMESTAMP:
        return sql.SQL("{} AT TIME ZONE 'UTC'").format(ident)
    return ident


def _copy_csv(conn: Any, table: TableInfo, where: sql.Composable, schema: pa.Schema) -> pa.Table:
    """A chunk of a typed table through ``COPY ... TO STDOUT (FORMAT csv)``, parsed by Arrow's C++ CSV reader
    with the columns' types: no Python per row or value."""
    import pyarrow.csv as pacsv

    types: dict[str, pa.DataType] = {}
    for name, oid, _ in table.columns:
        # Timestamps travel in ISO text, which Arrow parses: with offsets (the session is in UTC) for
        # timestamptz, naive ones cast as UTC below (extract(epoch) would compute a numeric per value).
        types[name] = pa.timestamp("us") if oid == TIMESTAMP else schema.field(name).type
    conn.execute("SET LOCAL timezone = 'UTC'")
    conn.execute("SET LOCAL datestyle = 'ISO, YMD'")
    query = sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT (FORMAT csv)").format(
        sql.SQL(", ").join(sql.Identifier(c[0]) for c in table.columns),
        sql.Identifier(*table.name.split(".", 1)), where)
    names = [c[0] for c in table.columns]
    options = {
        "read_options": pacsv.ReadOptions(column_names=names, block_size=1 << 20),
        # PostgreSQL's CSV writes NULL as an unquoted empty field and an empty string as "": only the former
        # is null (Arrow's default markers would turn the texts 'NULL', 'NaN' or 'N/A' into nulls).
        "convert_options": pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True,
                                                quoted_strings_can_be_null=False, true_values=["t"],
                                                false_values=["f"]),
    }
    # Arrow parses while PostgreSQL still sends: the CSV flows through a pipe into the reader's own threads
    # (which release the GIL), so a chunk costs about max(COPY, parse) rather than their sum (parsing is
    # ~40% of the COPY's time: measured).
    read_end, write_end = os.pipe()

    def parse() -> pa.Table:
        with os.fdopen(read_end, "rb") as stream:  # closing it on a parse error stops the COPY below
            return pacsv.read_csv(pa.PythonFile(stream, mode="r"), **options)

    with ThreadPoolExecutor(max_workers=1) as pool:
        parsed_future = pool.submit(parse)
        sent = 0
        try:
            with os.fdopen(write_end, "wb") as pipe, conn.cursor() as cur, cur.copy(query) as copy:
                for block in copy:
                    pipe.write(block)
                    sent += len(block)
        except BrokenPipeError:
            parsed_future.result()  # the parser's error
            raise
        if not sent:
            parsed_future.cancel()
            return pa.table({n: pa.array([], type=schema.field(n).type) for n in names})
        parsed = parsed_future.result()
    return pa.table({n: parsed.column(n).cast(schema.field(n).type) for n in names})


def _with_meta(schema: pa.Schema, data: pa.Table, channel: str, seq: int, when: datetime) -> pa.Table:
    n = data.num_rows
    # Constant columns built by Arrow, not from n Python objects each.
    meta = {
        "_op": pa.repeat(pa.scalar(Op.SNAPSHOT.value, pa.string()), n),
        "_seq": pa.repeat(pa.scalar(seq, pa.int64()), n),
        "_commit_ts": pa.repeat(pa.scalar(when, pa.timestamp("us", tz="UTC")), n),
        "_channel": pa.repeat(pa.scalar(channel, pa.string()), n),
        "_position": pa.array(np.arange(n, dtype=np.int64)),
        "_unchanged": pa.nulls(n, pa.list_(pa.string())),
        OLD_KEY: pa.nulls(n, schema.field(OLD_KEY).type),
    }
    return pa.table([meta[f.name] if f.name in meta else data.column(f.name) for f in schema], schema=schema)


def _typed_batch(
    schema: pa.Schema, rows: list[tuple[Any, ...]], channel: str, first: int, seq: int, when: datetime
) -> pa.RecordBatch:
    n = len(rows)
    meta = {
        "_op": pa.array([Op.SNAPSHOT.value] * n, pa.string()),
        "_seq": pa.array([seq] * n, pa.int64()),
        "_commit_ts": pa.array([when] * n, pa.timestamp("us", tz="UTC")),
        "_channel": pa.array([channel] * n, pa.string()),
        "_position": pa.array(range(first, first + n), pa.int64()),
        "_unchanged": pa.nulls(n, pa.list_(pa.string())),
        OLD_KEY: pa.nulls(n, schema.field(OLD_KEY).type),
    }
    columns = list(zip(*rows, strict=True)) if rows else []
    data = [f for f in schema if f.name not in meta]
    arrays = [meta[f.name] if f.name in meta else None for f in schema]
    for f, values in zip(data, columns, strict=True):
        arrays[schema.get_field_index(f.name)] = pa.array(values, type=f.type)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
    cols = sql.SQL(", ").join(_select(c, typed) for c in table.columns)
    query = sql.SQL("SELECT {} FROM {} WHERE " + cond).format(cols, sql.Identifier(*table.name.split(".", 1)))
    rel = _relation(table)
    rows = 0
    with connection.connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
        if typed and not any(oid == BYTEA for _, oid, _ in table.columns):
            where = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({lo},0)"))
            if hi is not None:
                where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({hi},0)"))
            data = _copy_csv(conn, table, where, schema)
            with pa.OSFile(str(path) + ".tmp", "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                writer.write_table(_with_meta(schema, data, channel, seq, when), max_chunksize=65_536)
            conn.execute("COMMIT")
            os.replace(str(path) + ".tmp", path)
            return channel, data.num_rows
        with conn.cursor(binary=typed) as cur, pa.OSFile(str(path) + ".tmp", "wb") as sink:
            with pa.ipc.new_file(sink, schema) as writer:
                cur.execute(query, params)
                while True:
                    got = cur.fetchmany(50_000)
                    if not got:
                        break
                    if typed:
                        writer.write_batch(_typed_batch(schema, got, channel, rows, seq, when))
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
