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
  .merge(...).whenMatchedDelete/Update/whenNotMatchedInsert``) into a plain 1M-row table;
* **the same hand-written MERGE of the same columns**: it also writes the change record's ``_seq`` and
  ``_commit_ts``, the columns the sink keeps in its table by default, into a table that has them (the MERGE's
  own cost, without the wider table's; printed as ``ordered delta-spark/hand-written of the same columns``);
* **the hand-written change-data MERGE**: Delta's docs' pattern for a change feed ("Write change data into a
  Delta table"): the batch reduced to each key's latest change (``max(struct(_seq, ...))`` grouped by key),
  then the same MERGE, into a plain 1M-row table. This is the hand-written MERGE that stays correct when a
  batch holds two changes of one key (the upsert above then fails or inserts the key twice; the benchmark's
  batches hold one change per key so that it can run); printed as ``ordered delta-spark/hand-written
  change-data MERGE``.

With ``--cluster`` the driver runs on a Spark standalone cluster started by the script (a master and two
one-core workers on loopback, as the cluster tests start it), with both engines (it implies ``--engine
delta-spark``): the figures behind the default engine on a cluster.

Paired rounds (``--rounds``, default 3): each round streams the same batches through every variant, one
after another in an order that rotates from round to round, each into a fresh copy of its starting table,
and delta-rs alone merges them too; each ratio is the median over the rounds of that round's ratio (the
machine's load drifts between rounds, much less within one). The modes of the sink
(:class:`sinks.delta.DeltaUpsertSink`'s ``ordered``):

* **ordered delta-spark**: ``engine="delta-spark"`` with the cdc source's mark (one MERGE per batch);
* **safe delta-spark**: ``engine="delta-spark", ordered=False`` (the state table's MERGE too);
* **ordered delta-rs**: ``engine="delta-rs"`` (pipelined unless ``--sync``) with the source's mark.

With ``--scd 2`` the run measures SCD type 2 instead (delta-rs, merging inside foreachBatch), on changes that
carry their own sequence column ``ver`` (``sequence_by="ver"``): the table's rows are the warm-up batch, then
the same change batches go, in each paired round, through

* **SCD type 1**: ``DeltaUpsertSink(scd_type=1, sequence_by="ver")``;
* **SCD type 2 in order**: ``scd_type=2``, every change newer than its key's head;
* **SCD type 2 with 1% late changes**: the same batches but 1% of each batch's changes (after the first) are
  updates of keys changed in the batch before, with a ``ver`` between the key's first version and its head:
  each is placed into the key's history, splitting a version (back-fill);

and prints ``scd2 late/in-order <r>`` (target >= 0.8) and ``scd2/scd1 <r>``, then ``ratio`` (the first).

Prints changes/s for each variant, the labelled ratios, last among them ``ordered delta-spark/hand-written
<r>``, ``safe delta-spark/hand-written <r>`` and ``ordered delta-rs/delta-rs-alone <r>``, then ``ratio <r>``
(ordered delta-spark / hand-written; with ``--engine delta-rs``: ordered delta-rs / delta-rs alone).
"""

from __future__ import annotations

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
import pyarrow.compute as pc
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


def status_mb(field: str, pid: int | str = "self") -> float:
    """A memory figure of a process's ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``: its peak) in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb(pid: int | str = "self") -> float:
    return status_mb("VmHWM", pid)


def reset_peak_rss(pid: int | str = "self") -> None:
    """Reset a process's peak RSS (``VmHWM``) to its current RSS (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


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


def spark_session(cluster: Any = None, conf: dict[str, str] | None = None) -> object:
    """One session (Delta configured, as in the tests) for every streaming variant of the run: local[2], or a
    driver here on ``cluster`` (a started :class:`cdc.servers.spark.cluster.SparkCluster`); ``conf`` added."""
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
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    return spark


def initial_table(path: str, initial: pa.Table, mode: str) -> None:
    """The 1M-row starting table: through the sink's core in ``mode`` (``ordered``, ``safe``: with its state
    table) or, ``plain``, as a plain table."""
    if mode in ("plain", "plain-same"):
        from deltalake import write_deltalake

        if mode == "plain-same":  # the columns the sink's table has: the sequence and the commit time too
            initial = initial.append_column("_seq", pa.array(np.zeros(initial.num_rows, dtype=np.int64)))
            initial = initial.append_column(
                "_commit_ts", pa.array(np.zeros(initial.num_rows, dtype="datetime64[us]"), pa.timestamp("us", tz="UTC")))
        write_deltalake(path, initial)
        return
    from sinks.delta import DeltaUpsertSink

    init = initial.append_column("_seq", pa.array(np.zeros(initial.num_rows, dtype=np.int64)))
    init = init.append_column("_op", pa.array(["snapshot"] * initial.num_rows, pa.string()))
    DeltaUpsertSink(path, keys=["id"], compact_every=None, ordered=mode == "ordered").write(init, 0, app_id="initial-load")


SINK_COLUMNS = ("_seq", "_commit_ts")
"""The change-record columns DeltaUpsertSink keeps in the table by default (``bookkeeping_columns``): the
reference that writes them too measures the MERGE alone, without the cost of the wider table."""


def hand_written(path: str, extra: tuple[str, ...] = (), latest: bool = False) -> Callable[[object, int], None]:
    """The foreachBatch upsert users write by hand from Delta's docs ("Upsert from streaming queries using
    foreachBatch"): a MERGE of the micro-batch, no sequence guard, no tombstones, no exactly-once; ``extra``:
    change-record columns it writes besides the table's keys and values. ``latest``: the change-data MERGE of
    Delta's docs ("Write change data into a Delta table") instead, the same MERGE of each key's latest change
    (``max`` of a struct whose first field is the sequence)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    names = [n for n, _ in SCHEMA] + list(extra)
    rest = [n for n in names if n != "id"]
    assignments = {n: f"s.{n}" for n in names}

    def upsert(batch_df: object, batch_id: int) -> None:
        source = batch_df
        if latest:
            source = (batch_df.groupBy("id")  # type: ignore[attr-defined]
                      .agg(F.max(F.struct("_seq", "_op", *rest)).alias("latest"))
                      .select("id", "latest._op", *[f"latest.{c}" for c in rest]))
        target = DeltaTable.forPath(batch_df.sparkSession, path)  # type: ignore[attr-defined]
        (target.alias("t").merge(source.alias("s"), "s.id = t.id")  # type: ignore[attr-defined]
         .whenMatchedDelete(condition="s._op = 'delete'")
         .whenMatchedUpdate(set=assignments)
         .whenNotMatchedInsert(condition="s._op != 'delete'", values=assignments)
         .execute())

    return upsert


def stream(
    spark: object, work: Path, name: str, apply: Callable[[object, int], None], warmup: pa.Table, batches: list[pa.Table],
    batch: int, verbose: bool, flush: Callable[[], None] = lambda: None,
    schema: list[tuple[str, pa.DataType]] = SCHEMA,
) -> tuple[float, float, list[int]]:
    """Streaming queries from a fresh local change log into ``apply``: (seconds for ``batches``, seconds of the
    warm-up run, the micro-batches' sizes).

    Two runs on one checkpoint, each ``Trigger.AvailableNow``: the first takes the warm-up batch (the query's
    start, the table's first commit), the second starts after ``batches`` were appended and ends when every
    one of them was committed (Spark stops an AvailableNow query then). The time is the second run's, start to
    end: it does not depend on ``numInputRows``, which counts a batch's source twice when a variant reads it
    twice (without caching it)."""
    from cdc.backends.local import LocalLog

    log = LocalLog.create(work / f"log-{name}", schema, ["id"])
    log.append(warmup)
    ends: list[float] = []
    sizes: list[int] = []

    def timed(df: object, batch_id: int) -> None:
        t = time.perf_counter()
        apply(df, batch_id)
        ends.append(time.perf_counter())
        if verbose:
            print(f"  {name} batch {batch_id}: in foreachBatch {ends[-1] - t:.2f} s")

    def run() -> None:
        source = (
            spark.readStream.format("cdc").option("backend", "local").option("path", str(work / f"log-{name}"))  # type: ignore[attr-defined]
            .option("maxRecordsPerTrigger", str(batch)).load()
        )
        q = (source.writeStream.foreachBatch(timed).option("checkpointLocation", str(work / f"ck-{name}"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        if q.exception():
            raise RuntimeError(f"the query failed: {q.exception()}")
        # Spark's numInputRows per batch (the rows its source scans returned: twice a batch's size for a variant
        # that reads its batch twice).
        sizes.extend(int(p["numInputRows"]) for p in q.recentProgress if p["numInputRows"])

    t0 = time.perf_counter()
    run()
    startup = time.perf_counter() - t0
    sizes.clear()
    # All change batches in one append: the run takes `batch` records per trigger.
    log.append(pa.concat_tables(batches))
    appended = time.perf_counter()
    run()
    flush()  # pipelined mode: the last batch's merge
    elapsed = time.perf_counter() - appended
    return elapsed, startup, sizes


def versioned(batches: list[pa.Table], late_share: float, seed: int) -> list[pa.Table]:
    """The batches with a sequence column ``ver`` (10 per change, in delivery order: room for late values), and
    with ``late_share`` of each batch's changes after the first replaced by late updates: keys updated in the
    batch before, at a ``ver`` between the key's first version (0) and its head."""
    rng = np.random.default_rng(seed)
    out: list[pa.Table] = []
    counter = 1
    previous_updates: tuple[np.ndarray, np.ndarray] | None = None
    for b in batches:
        n = b.num_rows
        ver = np.arange(counter, counter + n, dtype=np.int64) * 10
        counter += n
        t = b.append_column("ver", pa.array(ver))
        is_update = np.asarray(pc.equal(t.column("_op"), "update").to_numpy(zero_copy_only=False))
        if late_share > 0 and previous_updates is not None:
            k = int(n * late_share)
            ids, vers = previous_updates
            pick = rng.choice(len(ids), k, replace=False)
            late_ids, late_vers = ids[pick], vers[pick] - 5  # older than the head, newer than version 0
            replace_rows = rng.choice(np.flatnonzero(is_update), k, replace=False)
            keep = np.ones(n, dtype=bool)
            keep[replace_rows] = False
            kept_ids = set(t.column("id").to_numpy()[keep].tolist())
            late_ids_ok = np.array([i for i in late_ids if i not in kept_ids], dtype=np.int64)
            late_vers = late_vers[np.isin(late_ids, late_ids_ok)]
            late = pa.table({"_op": pa.array(["update"] * len(late_ids_ok), pa.string()),
                             **rows(late_ids_ok, rng), "ver": pa.array(late_vers, pa.int64())})
            t = pa.concat_tables([t.filter(pa.array(keep)), late.select(t.column_names)])
        mask = np.asarray(pc.equal(b.column("_op"), "update").to_numpy(zero_copy_only=False))
        previous_updates = (b.column("id").to_numpy()[mask], ver[mask])
        out.append(t)
    return out


def scd_main(table_rows: int, batch: int, n: int, r_count: int, verbose: bool) -> None:
    """``--scd 2``: SCD type 2 in order and with 1% late changes, and SCD type 1, on the same batches."""
    from sinks.delta import DeltaUpsertSink

    rng = np.random.default_rng(7)
    initial = pa.table({"_op": pa.array(["insert"] * table_rows, pa.string()),
                        **rows(np.arange(table_rows, dtype=np.int64), rng),
                        "ver": pa.array(np.zeros(table_rows, dtype=np.int64))})
    changes = make_batches(table_rows, batch, n, seed=11)
    in_order, late = versioned(changes, 0.0, 3), versioned(changes, 0.01, 3)
    late_count = sum(int((b.column("ver").to_numpy() % 10 != 0).sum()) for b in late)  # late: ver % 10 == 5
    total = n * batch
    variants = {"scd1": (1, in_order), "scd2": (2, in_order), "scd2-late": (2, late)}
    times: dict[str, list[float]] = {v: [] for v in variants}
    work = Path(tempfile.mkdtemp(prefix="cdc-to-delta-scd-"))
    load = os.getloadavg()
    try:
        spark = spark_session()
        for r in range(r_count):
            names = list(variants)
            order = names[r % len(names):] + names[:r % len(names)]
            for v in order:
                scd_type, batches = variants[v]
                table = str(work / f"{v}-{r}")
                apply = DeltaUpsertSink(table, keys=["id"], sequence_by="ver", scd_type=scd_type, compact_every=None,
                                        engine="delta-rs")
                t, _, sizes = stream(spark, work, f"{v}-{r}", apply, initial, batches, batch, verbose,
                                     schema=[*SCHEMA, ("ver", pa.int64())])
                times[v].append(t)
                if verbose:
                    print(f"round {r} {v}: {t:.2f} s (micro-batches {sizes})")
        spark.stop()  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"table {table_rows} rows, {n} batches x {batch} changes (50% update, 40% insert, 10% delete; the late "
          f"run: {late_count} late updates in all), {r_count} paired round(s), delta-rs; load average at start "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    labels = {"scd1": "SCD type 1 (sequence_by='ver')", "scd2": "SCD type 2, in order",
              "scd2-late": "SCD type 2, 1% late changes (back-filled)"}
    figures: dict[str, tuple[float, str]] = {}
    for key, ts in times.items():
        rate = total / float(np.median(ts))
        figures[labels[key]] = (rate, "changes/s")
        print(f"{labels[key]}: median {np.median(ts):.2f} s ({', '.join(f'{t:.2f}' for t in ts)}), {rate:,.0f} changes/s")

    def ratio(reference: str, ours: str) -> float:
        return float(np.median([a / b for a, b in zip(times[reference], times[ours], strict=True)]))

    ratios = {"scd2/scd1": ratio("scd1", "scd2"), "scd2 late/in-order": ratio("scd2", "scd2-late")}
    for name, value in ratios.items():
        print(f"{name} {value:.3f}")
    figures.update({name: (value, "ratio") for name, value in ratios.items()})
    last = ratios["scd2 late/in-order"]
    append_record("cdc_to_delta", figures, ratio=last, target=">= 0.8",
                  params={"scd": 2, "changes": total, "rounds": r_count, "late": late_count})
    print(f"ratio {last:.3f}")


@click.command()
@click.option("--engine", type=click.Choice(["delta-rs", "delta-spark"]), default="delta-spark", show_default=True,
              help="delta-rs: only the delta-rs variants (no io.delta jars needed).")
@click.option("--quick", is_flag=True, help="2 batches instead of 10, one round.")
@click.option("--verbose", is_flag=True, help="Print each micro-batch's timing.")
@click.option("--sync", is_flag=True, help="delta-rs: merge inside foreachBatch (the sink's default) instead of pipelined=True.")
@click.option("--batches", type=int, default=None, help="Number of change batches per round (default 10).")
@click.option("--rounds", type=int, default=None, help="Paired rounds (default 3; 1 with --quick).")
@click.option("--table-rows", type=int, default=1_000_000, show_default=True)
@click.option("--batch", type=int, default=100_000, show_default=True)
@click.option("--scd", type=click.Choice(["1", "2"]), default="1", show_default=True,
              help="2: SCD type 2 in order and with 1% late changes, and SCD type 1, on the same batches (delta-rs).")
@click.option("--cluster", is_flag=True,
              help="Run the driver on a Spark standalone cluster started here (master and 2 one-core workers on "
                   "loopback, as tests/cluster) instead of local[2].")
def main(engine: str, quick: bool, verbose: bool, sync: bool, batches: int | None, rounds: int | None,
         table_rows: int, batch: int, scd: str, cluster: bool) -> None:
    from sinks.delta import DeltaUpsertSink

    n = batches or (2 if quick else 10)
    r_count = rounds or (1 if quick else 3)
    if scd == "2":
        scd_main(table_rows, batch, n, r_count, verbose)
        return
    rng = np.random.default_rng(7)
    initial = pa.table(rows(np.arange(table_rows, dtype=np.int64), rng))
    warmup, *changes = make_batches(table_rows, batch, n + 1, seed=11)
    total = n * batch
    work = Path(tempfile.mkdtemp(prefix="cdc-to-delta-"))
    variants = ["ordered-rs"] + (["ordered-spark", "safe-spark", "hand", "hand-same", "hand-cdc"]
                                 if engine == "delta-spark" else [])
    times: dict[str, list[float]] = {v: [] for v in [*variants, "alone"]}
    spark_cluster: Any = None
    load = os.getloadavg()
    try:
        templates = {"ordered": work / "template-ordered", "safe": work / "template-safe", "plain": work / "template-plain",
                     "plain-same": work / "template-plain-same"}
        for mode, path in templates.items():
            initial_table(str(path), initial, mode)
        if cluster:
            from cdc.servers.spark.cluster import SparkCluster

            spark_cluster = SparkCluster(workers=2, cores=1, memory="1g").start()
        spark = spark_session(spark_cluster)
        jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[attr-defined]
        for r in range(r_count):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                table = str(work / f"{v}-{r}")
                template = {"hand": "plain", "hand-same": "plain-same", "hand-cdc": "plain",
                            "safe-spark": "safe"}.get(v, "ordered")
                shutil.copytree(templates[template], table)
                if v in ("hand", "hand-same", "hand-cdc"):
                    apply: Callable[[object, int], None] = hand_written(
                        table, SINK_COLUMNS if v == "hand-same" else (), latest=v == "hand-cdc")
                    flush: Callable[[], None] = lambda: None  # noqa: E731
                elif v == "ordered-rs":
                    rs_sink = DeltaUpsertSink(table, keys=["id"], compact_every=None, engine="delta-rs", pipelined=not sync)
                    apply, flush = rs_sink, rs_sink.flush
                else:
                    apply = DeltaUpsertSink(table, keys=["id"], compact_every=None, engine="delta-spark",
                                            ordered=False if v == "safe-spark" else None)
                    flush = lambda: None  # noqa: E731
                t, _, sizes = stream(spark, work, f"{v}-{r}", apply, warmup, changes, batch, verbose, flush)
                times[v].append(t)
                if verbose:
                    print(f"round {r} {v}: {t:.2f} s (micro-batches {sizes})")
            times["alone"].append(standalone(str(work / f"alone-{r}"), initial, warmup, changes))
        jvm_peak = peak_rss_mb(jvm_pid)
        spark.stop()  # type: ignore[attr-defined]
    finally:
        if spark_cluster is not None:
            spark_cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    driver_peak = peak_rss_mb()

    def ratio(reference: str, ours: str) -> float:
        return float(np.median([a / b for a, b in zip(times[reference], times[ours], strict=True)]))

    where = "a standalone cluster (master + 2 one-core workers on loopback)" if cluster else "local[2]"
    print(f"table {table_rows} rows, {n} batches x {batch} changes (50% update, 40% insert, 10% delete), "
          f"{r_count} paired round(s); Spark: {where}; load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, "
          f"at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    labels = {
        "alone": "delta-rs alone (plain upsert MERGE, Arrow in memory, no Spark)",
        "ordered-rs": f"ordered delta-rs: cdc source -> DeltaUpsertSink(engine='delta-rs', pipelined={not sync})",
        "ordered-spark": "ordered delta-spark: cdc source -> DeltaUpsertSink(engine='delta-spark')",
        "safe-spark": "safe delta-spark: cdc source -> DeltaUpsertSink(engine='delta-spark', ordered=False)",
        "hand": "hand-written delta-spark foreachBatch MERGE (Delta docs' upsert pattern)",
        "hand-same": "the same hand-written MERGE writing the sink's columns too (_seq, _commit_ts)",
        "hand-cdc": "hand-written change-data MERGE (Delta docs' pattern: each key's latest change, then MERGE)",
    }
    figures: dict[str, tuple[float, str]] = {}
    for key, ts in times.items():
        rate = total / float(np.median(ts))
        figures[labels[key]] = (rate, "changes/s")
        print(f"{labels[key]}: median {np.median(ts):.2f} s ({', '.join(f'{t:.2f}' for t in ts)}), {rate:,.0f} changes/s")
    print(f"peak RSS: driver (Python, incl. delta-rs) {driver_peak:.0f} MB, JVM {jvm_peak:.0f} MB")
    print(f"at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    ratios = {"ordered delta-rs/delta-rs-alone": ratio("alone", "ordered-rs")}
    if engine == "delta-spark":
        # The three headline ratios last, the other references' before them.
        ratios = {"ordered delta-spark/hand-written of the same columns": ratio("hand-same", "ordered-spark"),
                  "ordered delta-spark/hand-written change-data MERGE": ratio("hand-cdc", "ordered-spark"),
                  "ordered delta-spark/hand-written": ratio("hand", "ordered-spark"),
                  "safe delta-spark/hand-written": ratio("hand", "safe-spark"), **ratios}
    for name, value in ratios.items():
        print(f"{name} {value:.3f}")
    last = ratios.get("ordered delta-spark/hand-written", ratios["ordered delta-rs/delta-rs-alone"])
    figures.update({name: (value, "ratio") for name, value in ratios.items()})
    append_record("cdc_to_delta", figures, ratio=last,
                  params={"engine": engine, "changes": total, "rounds": r_count, "cluster": cluster, "sync": sync})
    print(f"ratio {last:.3f}")


if __name__ == "__main__":
    main()
