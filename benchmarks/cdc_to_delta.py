"""Benchmark: change records through the cdc source into DeltaUpsertSink, versus delta-rs merging alone.

A 1M-row table receives batches of 100k changes (50% updates, 40% inserts, 10% deletes):

* **pipeline**: the changes sit in a local change log; a streaming query ``readStream.format("cdc")`` with
  ``maxRecordsPerTrigger=100000`` feeds ``foreachBatch(DeltaUpsertSink(..., pipelined=True))`` (exactly-once,
  sequence guarded, tombstones; each batch durably staged, then merged while Spark prepares the next one;
  ``--sync`` merges inside foreachBatch instead). Ends when the last batch is committed. Timed after a warm-up batch of the same size (the query's first batch pays Spark's
  one-off start cost, reported separately) to the end of the last batch.
* **standalone**: the same 100k-row batches, already in memory as Arrow, merged by delta-rs alone into a
  copy of the same 1M-row table with a plain upsert MERGE (no Spark, no sequence guard, no tombstones); run
  before and after the pipeline, and the mean is the reference (the machine's load drifts).

Prints changes/s for both, peak memory, and last ``ratio <pipeline/standalone>``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import click
import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYTHONPATH", str(ROOT))

SCHEMA = [("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())]


def rows(ids: np.ndarray, rng: np.random.Generator) -> dict[str, pa.Array]:
    n = len(ids)
    return {
        "id": pa.array(ids, pa.int64()),
        "customer": pa.array([f"customer-{i}" for i in rng.integers(0, 50_000, n)], pa.string()),
        "amount": pa.array(rng.random(n) * 1000, pa.float64()),
        "qty": pa.array(rng.integers(1, 100, n).astype("int32"), pa.int32()),
    }


def make_batches(table_rows: int, batch: int, batches: int, seed: int) -> list[pa.Table]:
    """Change batches (with _op) over a table whose keys are 0..table_rows-1; tracks live keys."""
    rng = np.random.default_rng(seed)
    live = np.arange(table_rows, dtype=np.int64)
    next_id = table_rows
    out = []
    for _ in range(batches):
        n_upd, n_ins = batch // 2, batch * 2 // 5
        n_del = batch - n_upd - n_ins
        picked = rng.choice(len(live), n_upd + n_del, replace=False)
        upd, dele = live[picked[:n_upd]], live[picked[n_upd:]]
        ins = np.arange(next_id, next_id + n_ins, dtype=np.int64)
        next_id += n_ins
        live = np.concatenate([np.delete(live, picked[n_upd:]), ins])
        ids = np.concatenate([upd, ins, dele])
        cols = rows(ids, rng)
        ops = ["update"] * n_upd + ["insert"] * n_ins + ["delete"] * n_del
        t = pa.table({"_op": pa.array(ops, pa.string()), **cols})
        out.append(t.take(rng.permutation(batch)))
    return out


def peak_rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def standalone(path: str, initial: pa.Table, warmup: pa.Table, batches: list[pa.Table]) -> float:
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(path, initial)
    names = [n for n, _ in SCHEMA]
    assignments = {n: f"s.{n}" for n in names}

    def merge(b: pa.Table) -> None:
        DeltaTable(path).merge(b, "t.id = s.id", source_alias="s", target_alias="t").when_matched_delete(
            "s._op = 'delete'"
        ).when_matched_update(assignments).when_not_matched_insert(assignments, "s._op != 'delete'").execute()

    merge(warmup)
    start = time.perf_counter()
    for b in batches:
        merge(b)
    return time.perf_counter() - start


def pipeline(
    work: Path, initial: pa.Table, warmup: pa.Table, batches: list[pa.Table], batch: int, verbose: bool, pipelined: bool
) -> tuple[float, float, int]:
    import cdc
    from cdc.backends.local import LocalLog
    from sinks.delta import DeltaUpsertSink
    from tests.conftest import spark_builder

    log = LocalLog.create(work / "log", SCHEMA, ["id"])
    table = str(work / "pipeline")
    sink = DeltaUpsertSink(table, keys=["id"], compact_every=None, pipelined=pipelined)
    # The initial 1M rows: loaded through the sink's core directly (not timed; not part of the stream).
    init = initial.append_column("_seq", pa.array(np.zeros(initial.num_rows, dtype=np.int64)))
    init = init.append_column("_op", pa.array(["snapshot"] * initial.num_rows, pa.string()))
    sink.write(init, 0, app_id="initial-load")
    # Warm-up: the first batch pays the query's start cost (Spark session, Python workers, JIT).
    log.append(warmup)
    spark = spark_builder("cdc-to-delta-bench").config("spark.sql.streaming.noDataMicroBatches.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    ends: list[float] = []

    def timed(df: object, batch_id: int) -> None:
        t = time.perf_counter()
        sink(df, batch_id)
        ends.append(time.perf_counter())
        if verbose:
            print(f"  batch {batch_id}: in foreachBatch {ends[-1] - t:.2f} s, since previous {ends[-1] - (ends[-2] if len(ends) > 1 else t0):.2f} s")

    source = (
        spark.readStream.format("cdc").option("backend", "local").option("path", str(work / "log"))
        .option("maxRecordsPerTrigger", str(batch)).load()
    )
    t0 = time.perf_counter()
    q = source.writeStream.foreachBatch(timed).option("checkpointLocation", str(work / "ck")).start()
    while not ends:
        if q.exception():
            raise RuntimeError(f"the query failed: {q.exception()}")
        time.sleep(0.05)
    startup = ends[0] - t0
    # All change batches in one append: the query sees them at once and takes `batch` records per trigger.
    log.append(pa.concat_tables(batches))
    appended = time.perf_counter()
    expected = warmup.num_rows + sum(b.num_rows for b in batches)
    while sum(p["numInputRows"] for p in q.recentProgress) < expected:
        if q.exception():
            raise RuntimeError(f"the query failed: {q.exception()}")
        time.sleep(0.05)
    sink.flush()  # pipelined mode: the last batch's merge
    elapsed = time.perf_counter() - appended
    q.stop()
    jvm_peak = peak_rss_mb(jvm_pid)
    spark.stop()
    return elapsed, startup, int(jvm_peak)


@click.command()
@click.option("--quick", is_flag=True, help="2 batches instead of 10 (runs in under a minute).")
@click.option("--verbose", is_flag=True, help="Print each micro-batch's timing.")
@click.option("--sync", is_flag=True, help="The sink's default mode (merge inside foreachBatch) instead of pipelined=True.")
@click.option("--batches", type=int, default=None, help="Number of 100k-change batches (default 10).")
@click.option("--table-rows", type=int, default=1_000_000, show_default=True)
@click.option("--batch", type=int, default=100_000, show_default=True)
def main(quick: bool, verbose: bool, sync: bool, batches: int | None, table_rows: int, batch: int) -> None:
    n = batches or (2 if quick else 10)
    rng = np.random.default_rng(7)
    initial = pa.table(rows(np.arange(table_rows, dtype=np.int64), rng))
    warmup, *changes = make_batches(table_rows, batch, n + 1, seed=11)
    total = n * batch
    work = Path(tempfile.mkdtemp(prefix="cdc-to-delta-"))
    try:
        # Standalone before and after the pipeline (the mean is the reference): the machine's load drifts.
        reset_peak_rss()
        t_before = standalone(str(work / "standalone-1"), initial, warmup, changes)
        alone_peak = peak_rss_mb()
        reset_peak_rss()
        t_pipe, startup, jvm_peak = pipeline(work, initial, warmup, changes, batch, verbose, not sync)
        driver_peak = peak_rss_mb()
        t_after = standalone(str(work / "standalone-2"), initial, warmup, changes)
        t_alone = (t_before + t_after) / 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    alone_rate, pipe_rate = total / t_alone, total / t_pipe
    print(f"table {table_rows} rows, {n} batches x {batch} changes (50% update, 40% insert, 10% delete)")
    print(f"standalone delta-rs merge: {t_alone:.2f} s (runs before/after the pipeline: {t_before:.2f} s, {t_after:.2f} s), "
          f"{alone_rate:,.0f} changes/s, peak RSS {alone_peak:.0f} MB")
    mode = "pipelined=False" if sync else "pipelined=True"
    print(f"pipeline cdc source -> DeltaUpsertSink({mode}): {t_pipe:.2f} s, {pipe_rate:,.0f} changes/s "
          f"(query start + warm-up batch: {startup:.1f} s, not included)")
    print(f"pipeline peak RSS: driver (Python, incl. delta-rs) {driver_peak:.0f} MB, JVM {jvm_peak} MB")
    print(f"at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"ratio {pipe_rate / alone_rate:.3f}")


if __name__ == "__main__":
    main()
