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

* **hand-over alone**: the same stream into a ``foreachBatch`` that only collects the batch as Arrow (what
  the sink does before it merges) and merges nothing: the ceiling of any driver-side sink on this machine
  (Spark's micro-batch, its offset and commit logs, the source's read and the collect).

With ``--engine delta-spark`` the same run also streams the same batches through

* **our pipeline on delta-spark**: ``DeltaUpsertSink(engine="delta-spark")``, the batch prepared and merged
  inside Spark (io.delta jars of ``make delta-spark``), into a copy of the same sink-layout table;
* **hand-written delta-spark MERGE**: the ``foreachBatch`` upsert of Delta's docs (``DeltaTable.forPath(...)
  .merge(...).whenMatchedDelete/Update/whenNotMatchedInsert``) into a plain 1M-row table.

With ``--cluster`` the driver runs on a Spark standalone cluster started by the script (a master and two
one-core workers on loopback, as the cluster tests start it), with both engines (it implies ``--engine
delta-spark``): the figures behind the default engine on a cluster.

Prints changes/s for each, the ratios, peak memory, and last ``ratio <our pipeline/standalone>`` (the
pipeline of ``--engine``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow as pa
from record import append_record

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


def spark_session(cluster: Any = None) -> object:
    """One session (Delta configured, as in the tests) for every streaming variant of the run: local[2], or a
    driver here on ``cluster`` (a started :class:`cdc.servers.spark.cluster.SparkCluster`)."""
    import cdc
    from tests.conftest import spark_builder

    if cluster is None:
        builder = spark_builder("cdc-to-delta-bench")
    else:
        from sinks.delta.session import configure_delta

        # Executors of 900 MB (the workers offer 1 GB each): a delta-spark MERGE into the 1M-row table.
        builder = configure_delta(cluster.session_builder("cdc-to-delta-bench", {"spark.executor.memory": "900m"}),
                                  local=False).config("spark.databricks.delta.snapshotPartitions", "2")
    builder = builder.config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    return spark


def initial_table(path: str, initial: pa.Table, sink_layout: bool) -> None:
    """The 1M-row starting table: through the sink's core (sequence, tombstone columns) or as a plain table."""
    if not sink_layout:
        from deltalake import write_deltalake

        write_deltalake(path, initial)
        return
    from sinks.delta import DeltaUpsertSink

    init = initial.append_column("_seq", pa.array(np.zeros(initial.num_rows, dtype=np.int64)))
    init = init.append_column("_op", pa.array(["snapshot"] * initial.num_rows, pa.string()))
    DeltaUpsertSink(path, keys=["id"], compact_every=None).write(init, 0, app_id="initial-load")


def commit_groups(path: str) -> list[int]:
    """How many micro-batches each of the query's commits to the table applied, after the warm-up batch
    (pipelined mode merges the batches that waited for a merge together; a commit records the group's last
    batch id as its application transaction). Read from the local table's log."""
    versions = []
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"].startswith("cdc-tunnel-"):
                versions.append(int(txn["version"]))
    return [b - a for a, b in itertools.pairwise(versions)]


def hand_written(path: str) -> Callable[[object, int], None]:
    """The foreachBatch upsert users write by hand from Delta's docs ("Upsert from streaming queries using
    foreachBatch"): a MERGE of the micro-batch, no sequence guard, no tombstones, no exactly-once."""
    from delta.tables import DeltaTable

    names = [n for n, _ in SCHEMA]
    assignments = {n: f"s.{n}" for n in names}

    def upsert(batch_df: object, batch_id: int) -> None:
        target = DeltaTable.forPath(batch_df.sparkSession, path)  # type: ignore[attr-defined]
        (target.alias("t").merge(batch_df.alias("s"), "s.id = t.id")  # type: ignore[attr-defined]
         .whenMatchedDelete(condition="s._op = 'delete'")
         .whenMatchedUpdate(set=assignments)
         .whenNotMatchedInsert(condition="s._op != 'delete'", values=assignments)
         .execute())

    return upsert


def stream(
    spark: object, work: Path, name: str, apply: Callable[[object, int], None], warmup: pa.Table, batches: list[pa.Table],
    batch: int, verbose: bool, flush: Callable[[], None] = lambda: None,
) -> tuple[float, float, list[int]]:
    """A streaming query from a fresh local change log into ``apply``: (seconds for ``batches`` after the
    warm-up batch, seconds of the query's start and warm-up batch, the micro-batches' sizes after it)."""
    from cdc.backends.local import LocalLog

    log = LocalLog.create(work / f"log-{name}", SCHEMA, ["id"])
    log.append(warmup)
    ends: list[float] = []

    def timed(df: object, batch_id: int) -> None:
        t = time.perf_counter()
        apply(df, batch_id)
        ends.append(time.perf_counter())
        if verbose:
            print(f"  {name} batch {batch_id}: in foreachBatch {ends[-1] - t:.2f} s, since previous {ends[-1] - (ends[-2] if len(ends) > 1 else t0):.2f} s")

    source = (
        spark.readStream.format("cdc").option("backend", "local").option("path", str(work / f"log-{name}"))  # type: ignore[attr-defined]
        .option("maxRecordsPerTrigger", str(batch)).load()
    )
    t0 = time.perf_counter()
    q = source.writeStream.foreachBatch(timed).option("checkpointLocation", str(work / f"ck-{name}")).start()
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
    flush()  # pipelined mode: the last batch's merge
    elapsed = time.perf_counter() - appended
    # Printed because they decide how comparable the rates are: one run was seen taking a 300k batch.
    sizes = [int(p["numInputRows"]) for p in q.recentProgress if p["numInputRows"]][1:]
    q.stop()
    return elapsed, startup, sizes


@click.command()
@click.option("--engine", type=click.Choice(["delta-rs", "delta-spark"]), default="delta-rs", show_default=True,
              help="delta-spark: also our pipeline on delta-spark and a hand-written delta-spark foreachBatch MERGE.")
@click.option("--quick", is_flag=True, help="2 batches instead of 10 (runs in under a minute).")
@click.option("--verbose", is_flag=True, help="Print each micro-batch's timing.")
@click.option("--sync", is_flag=True, help="delta-rs: merge inside foreachBatch (the sink's default) instead of pipelined=True.")
@click.option("--batches", type=int, default=None, help="Number of 100k-change batches (default 10).")
@click.option("--table-rows", type=int, default=1_000_000, show_default=True)
@click.option("--batch", type=int, default=100_000, show_default=True)
@click.option("--cluster", is_flag=True,
              help="Run the driver on a Spark standalone cluster started here (master and 2 one-core workers on "
                   "loopback, as tests/cluster) instead of local[2]; implies --engine delta-spark.")
def main(engine: str, quick: bool, verbose: bool, sync: bool, batches: int | None, table_rows: int, batch: int,
         cluster: bool) -> None:
    from sinks.delta import DeltaUpsertSink

    n = batches or (2 if quick else 10)
    rng = np.random.default_rng(7)
    initial = pa.table(rows(np.arange(table_rows, dtype=np.int64), rng))
    warmup, *changes = make_batches(table_rows, batch, n + 1, seed=11)
    total = n * batch
    work = Path(tempfile.mkdtemp(prefix="cdc-to-delta-"))
    timings: dict[str, tuple[float, float, list[int]]] = {}
    spark_cluster: Any = None
    try:
        # Standalone before and after the pipelines (the mean is the reference): the machine's load drifts.
        reset_peak_rss()
        t_before = standalone(str(work / "standalone-1"), initial, warmup, changes)
        alone_peak = peak_rss_mb()
        reset_peak_rss()
        if cluster:
            from cdc.servers.spark.cluster import SparkCluster

            engine = "delta-spark"
            spark_cluster = SparkCluster(workers=2, cores=1, memory="1g").start()
        spark = spark_session(spark_cluster)
        jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[attr-defined]
        rs_table = str(work / "pipeline-rs")
        initial_table(rs_table, initial, sink_layout=True)
        rs_sink = DeltaUpsertSink(rs_table, keys=["id"], compact_every=None, pipelined=not sync)
        timings["rs"] = stream(spark, work, "rs", rs_sink, warmup, changes, batch, verbose, rs_sink.flush)
        groups = commit_groups(rs_table)
        from sinks.delta.sink import _collect

        timings["collect"] = stream(spark, work, "collect", lambda df, _: _collect(df), warmup, changes, batch, verbose)
        if engine == "delta-spark":
            ds_table = str(work / "pipeline-spark")
            initial_table(ds_table, initial, sink_layout=True)
            ds_sink = DeltaUpsertSink(ds_table, keys=["id"], compact_every=None, engine="delta-spark")
            timings["spark"] = stream(spark, work, "spark", ds_sink, warmup, changes, batch, verbose)
            hand_table = str(work / "hand-written")
            initial_table(hand_table, initial, sink_layout=False)
            timings["hand"] = stream(spark, work, "hand", hand_written(hand_table), warmup, changes, batch, verbose)
        jvm_peak = peak_rss_mb(jvm_pid)
        spark.stop()  # type: ignore[attr-defined]
        if spark_cluster is not None:
            spark_cluster.stop()
            spark_cluster = None
        driver_peak = peak_rss_mb()
        t_after = standalone(str(work / "standalone-2"), initial, warmup, changes)
        t_alone = (t_before + t_after) / 2
        # The same changes merged by delta-rs alone in the pipeline's groups: what grouping alone buys.
        grouped, at = [], 0
        for size in groups:
            group = pa.concat_tables(changes[at:at + size])
            ids = group.column("id").to_numpy()[::-1]
            last = len(ids) - 1 - np.unique(ids, return_index=True)[1]  # a MERGE source holds a key once
            grouped.append(group.take(pa.array(np.sort(last))))
            at += size
        t_grouped = standalone(str(work / "standalone-grouped"), initial, warmup, grouped)
    finally:
        if spark_cluster is not None:
            spark_cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    alone_rate = total / t_alone
    where = "a standalone cluster (master + 2 one-core workers on loopback)" if cluster else "local[2]"
    print(f"table {table_rows} rows, {n} batches x {batch} changes (50% update, 40% insert, 10% delete); Spark: {where}")
    print(f"delta-rs alone (standalone merge): {t_alone:.2f} s (runs before/after the pipelines: {t_before:.2f} s, "
          f"{t_after:.2f} s), {alone_rate:,.0f} changes/s, peak RSS {alone_peak:.0f} MB")
    labels = {
        "rs": f"our pipeline on delta-rs: cdc source -> DeltaUpsertSink(pipelined={not sync})",
        "spark": "our pipeline on delta-spark: cdc source -> DeltaUpsertSink(engine='delta-spark')",
        "hand": "hand-written delta-spark foreachBatch MERGE (Delta docs' upsert pattern)",
        "collect": "hand-over alone: cdc source -> foreachBatch collecting to Arrow, no merge",
    }
    for key, (t, startup, sizes) in timings.items():
        print(f"{labels[key]}: {t:.2f} s, {total / t:,.0f} changes/s, ratio to delta-rs alone {t_alone / t:.3f} "
              f"(micro-batches {sizes}; query start + warm-up batch: {startup:.1f} s, not included)")
    print(f"our pipeline on delta-rs: the {n} micro-batches were applied in {len(groups)} MERGE commits of "
          f"{groups} micro-batches (delta-rs alone: one MERGE per micro-batch)")
    print(f"delta-rs alone merging the same groups: {t_grouped:.2f} s, {total / t_grouped:,.0f} changes/s; our "
          f"pipeline to it: {t_grouped / timings['rs'][0]:.3f}")
    if "spark" in timings:
        print(f"our delta-spark pipeline / hand-written delta-spark MERGE: {timings['hand'][0] / timings['spark'][0]:.3f}")
    print(f"peak RSS: driver (Python, incl. delta-rs) {driver_peak:.0f} MB, JVM {jvm_peak:.0f} MB")
    print(f"at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    ours = timings["spark" if engine == "delta-spark" else "rs"][0]
    append_record("cdc_to_delta", {labels[key]: (total / t, "changes/s") for key, (t, _, _) in timings.items()}, ratio=t_alone / ours, params={"engine": engine, "changes": total})
    print(f"ratio {t_alone / ours:.3f}")


if __name__ == "__main__":
    main()
