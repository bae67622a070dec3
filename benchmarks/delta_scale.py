"""Benchmark: DeltaUpsertSink at scale and the driver's memory, each engine and mode in a process of its own.

A table of ``--table-rows`` rows (default 10M) receives ``--batches`` batches of ``--batch`` changes (default
10 x 1M; 50% updates, 40% inserts, 10% deletes, the changes of ``cdc_to_delta.py``) through a streaming query
``readStream.format("cdc")`` on a local change log into ``foreachBatch``. The variants:

* **ordered delta-spark**: ``DeltaUpsertSink(engine="delta-spark")`` with the cdc source's mark (one MERGE);
* **safe delta-spark**: ``engine="delta-spark", ordered=False`` (the state table's MERGE too);
* **ordered delta-rs** and **safe delta-rs**: ``engine="delta-rs"`` (the batch collected to the driver);
* **hand-written**: the ``foreachBatch`` upsert of Delta's docs into a plain table (the reference).

Each variant runs in a fresh Python process (its own Spark driver), so its memory is its own: after a warm-up
micro-batch of the same size (the query's start), the peak resident set of the driver's Python process and
of its JVM are reset, the change batches are appended to the log by another process, and the query takes
them; the peaks are read when the last batch is committed. Reported per variant: seconds, changes/s, and the
driver's peak RSS during the batches (Python, JVM) with its growth over the RSS before them. With
``--cluster`` the driver runs on a Spark standalone cluster started here (a master and two one-core workers
on loopback): the executors are other processes, so the driver's figures are the driver's alone. Run it
twice with different ``--batch`` to see what grows with the batch.

Prints the figures, then ``ordered delta-spark/hand-written <r>`` (rates) and ``ratio <r>`` (the same).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from record import append_record

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cdc_to_delta import (  # noqa: E402  (the shared data and helpers of the Delta benchmarks)
    ROOT,
    SCHEMA,
    hand_written,
    initial_table,
    make_batches,
    peak_rss_mb,
    reset_peak_rss,
    rows,
    spark_session,
    status_mb,
)

VARIANTS = ("ordered-spark", "safe-spark", "ordered-rs", "safe-rs", "hand")
LABELS = {
    "ordered-spark": "ordered delta-spark",
    "safe-spark": "safe delta-spark",
    "ordered-rs": "ordered delta-rs",
    "safe-rs": "safe delta-rs",
    "hand": "hand-written delta-spark MERGE",
}


def prepare(work: Path, table_rows: int, batch: int, batches: int) -> None:
    """The starting tables (ordered, safe with its state table, plain) and the change batches as Parquet."""
    rng = np.random.default_rng(7)
    initial = pa.table(rows(np.arange(table_rows, dtype=np.int64), rng))
    for mode in ("ordered", "safe", "plain"):
        initial_table(str(work / f"template-{mode}"), initial, mode)
    del initial
    for i, b in enumerate(make_batches(table_rows, batch, batches + 1, seed=11)):
        pq.write_table(b, work / f"changes-{i:03d}.parquet")


def append_changes(log_path: str, work: str, warmup: bool) -> None:
    """In a process of its own (the driver's memory holds none of the changes): create the log with the warm-up
    batch, or append every other change batch to it in one append."""
    from cdc.backends.local import LocalLog

    files = sorted(Path(work).glob("changes-*.parquet"))
    if warmup:
        LocalLog.create(log_path, SCHEMA, ["id"]).append(pq.read_table(files[0]))
    else:
        LocalLog(log_path).append(pa.concat_tables(pq.read_table(f) for f in files[1:]))


def run_variant(work: Path, variant: str, batch: int, cluster: bool, driver_memory: str) -> dict[str, Any]:
    """One variant in this process: its figures as a dict."""
    from sinks.delta import DeltaUpsertSink

    table = str(work / f"table-{variant}")
    template = {"hand": "plain", "safe-spark": "safe", "safe-rs": "safe"}.get(variant, "ordered")
    shutil.rmtree(table, ignore_errors=True)
    shutil.copytree(work / f"template-{template}", table)
    spark_cluster: Any = None
    if cluster:
        from cdc.servers.spark.cluster import SparkCluster

        spark_cluster = SparkCluster(workers=2, cores=1, memory="1g").start()
    try:
        spark: Any = spark_session(spark_cluster, {"spark.driver.memory": driver_memory})
        jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
        if variant == "hand":
            apply: Any = hand_written(table)
        else:
            apply = DeltaUpsertSink(table, keys=["id"], compact_every=None,
                                    engine="delta-spark" if variant.endswith("spark") else "delta-rs",
                                    ordered=False if variant.startswith("safe") else None)
        log_path = work / f"log-{variant}"
        shutil.rmtree(log_path, ignore_errors=True)
        subprocess.run([sys.executable, __file__, "--append", str(log_path), "--work", str(work), "--warmup"],
                       check=True)
        checkpoint = work / f"ck-{variant}"
        shutil.rmtree(checkpoint, ignore_errors=True)

        def run() -> None:
            source = (spark.readStream.format("cdc").option("backend", "local").option("path", str(log_path))
                      .option("maxRecordsPerTrigger", str(batch)).load())
            q = (source.writeStream.foreachBatch(apply).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            if q.exception():
                raise RuntimeError(f"the query failed: {q.exception()}")

        run()  # the warm-up batch: the query's start and the table's first commit by this sink
        subprocess.run([sys.executable, __file__, "--append", str(log_path), "--work", str(work)], check=True)
        base_py, base_jvm = status_mb("VmRSS"), status_mb("VmRSS", jvm)
        reset_peak_rss()
        reset_peak_rss(jvm)
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        peak_py, peak_jvm = peak_rss_mb(), peak_rss_mb(jvm)
        spark.stop()
    finally:
        if spark_cluster is not None:
            spark_cluster.stop()
        shutil.rmtree(table, ignore_errors=True)
    return {"variant": variant, "seconds": elapsed, "base_py": base_py, "base_jvm": base_jvm,
            "peak_py": peak_py, "peak_jvm": peak_jvm}


@click.command()
@click.option("--table-rows", type=int, default=10_000_000, show_default=True)
@click.option("--batch", type=int, default=1_000_000, show_default=True, help="Changes per micro-batch.")
@click.option("--batches", type=int, default=10, show_default=True)
@click.option("--variants", default=",".join(VARIANTS), show_default=True,
              help=f"Comma-separated, of: {', '.join(VARIANTS)}.")
@click.option("--cluster", is_flag=True, help="The driver on a standalone cluster (2 one-core workers) started here.")
@click.option("--driver-memory", default="2g", show_default=True, help="spark.driver.memory of each variant's driver.")
@click.option("--work", type=click.Path(), default=None, help="Working directory (prepared data is reused).")
@click.option("--variant", default=None, hidden=True)
@click.option("--append", "append_log", default=None, hidden=True)
@click.option("--warmup", is_flag=True, hidden=True)
def main(table_rows: int, batch: int, batches: int, variants: str, cluster: bool, driver_memory: str,
         work: str | None, variant: str | None, append_log: str | None, warmup: bool) -> None:
    if append_log:
        append_changes(append_log, str(work), warmup)
        return
    if variant:
        print("RESULT-JSON " + json.dumps(run_variant(Path(str(work)), variant, batch, cluster, driver_memory)))
        return
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    bad = [v for v in chosen if v not in VARIANTS]
    if bad:
        raise click.BadParameter(f"{bad}; accepted: {', '.join(VARIANTS)}", param_hint="--variants")
    own = work is None
    folder = Path(work or tempfile.mkdtemp(prefix="delta-scale-"))
    load = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    try:
        marker = folder / f"prepared-{table_rows}-{batch}-{batches}"
        if not marker.exists():
            t = time.perf_counter()
            folder.mkdir(parents=True, exist_ok=True)
            prepare(folder, table_rows, batch, batches)
            marker.touch()
            print(f"prepared {table_rows:,} rows and {batches + 1} x {batch:,} changes in {time.perf_counter() - t:.0f} s")
        for v in chosen:
            out = subprocess.run([sys.executable, __file__, "--variant", v, "--work", str(folder), "--batch", str(batch),
                                  "--driver-memory", driver_memory, *(["--cluster"] if cluster else [])],
                                 capture_output=True, text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT-JSON ")]
            if out.returncode or not line:
                print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"variant {v} failed (exit {out.returncode})")
            results[v] = json.loads(line[-1].split(" ", 1)[1])
            r = results[v]
            print(f"{LABELS[v]}: {r['seconds']:.1f} s, {batches * batch / r['seconds']:,.0f} changes/s; driver peak RSS "
                  f"during the batches: Python {r['peak_py']:.0f} MB (+{r['peak_py'] - r['base_py']:.0f}), "
                  f"JVM {r['peak_jvm']:.0f} MB (+{r['peak_jvm'] - r['base_jvm']:.0f})", flush=True)
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
    where = "a standalone cluster (master + 2 one-core workers on loopback)" if cluster else "local[2]"
    print(f"table {table_rows:,} rows, {batches} batches x {batch:,} changes; Spark: {where}, spark.driver.memory "
          f"{driver_memory}; load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, at end "
          f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    figures: dict[str, tuple[float, str]] = {}
    for v, r in results.items():
        figures[LABELS[v]] = (batches * batch / r["seconds"], "changes/s")
        figures[f"{LABELS[v]}: driver peak RSS (Python + JVM)"] = (r["peak_py"] + r["peak_jvm"], "MB")
    ratio = None
    if "ordered-spark" in results and "hand" in results:
        ratio = results["hand"]["seconds"] / results["ordered-spark"]["seconds"]
        figures["ordered delta-spark/hand-written"] = (ratio, "ratio")
    append_record("delta_scale", figures, ratio=ratio,
                  params={"table_rows": table_rows, "batch": batch, "batches": batches, "cluster": cluster,
                          "driver_memory": driver_memory, "variants": chosen})
    if ratio is not None:
        print(f"ordered delta-spark/hand-written {ratio:.3f}")
        print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    main()
