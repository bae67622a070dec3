"""Records/s read from one tunnel of the local Tablestore server: the tunnel client alone vs the Spark source.

One run: a local server (child process) gets ``--rows`` rows through the real SDK (BatchWriteRow), a Stream
tunnel over the table (``--shards`` shards, so as many channels), then, alternately (best of ``--repeat``):

* **server**: the raw ``ReadRecords`` rate: the tunnel client reads every channel's token chain and
  does nothing with the records (what the server can serve; it must not be the demo's bottleneck);
* **client**: the tunnel client reads every channel and turns the records into Arrow batches with the
  backend's own record layout (PlainBuffer decoding included), fetching the next response while it
  decodes this one: the best a Python consumer of this tunnel does without Spark;
* **client (python reader)**: the same with the pure-Python PlainBuffer reader and record layout (the
  fallback when the compiled module, ``native/``, is not built): what the compiled path gains;
* **spark batch**: ``spark.read.format("cdc").option("backend", "tablestore")`` into the ``noop`` sink
  (planning on the driver, reading on executors; each channel's end is left to its reader, so the plan
  reads one response per channel);
* **spark batch (counted ends)**: the same with ``maxRecordsPerChannel`` far above the table's size, which
  makes the plan count every channel's end on the driver, walking its whole token chain: how every batch
  read planned before ends were left to the reader, and what every streaming plan still does;
* **spark stream**: the same through ``spark.readStream`` with ``Trigger.AvailableNow``; this includes
  the streaming query's fixed start cost (seconds), so it is printed, not used for the ratio (as in
  ``source_overhead.py``).

Every variant runs once per round, one after another, so a round's client and Spark batch reads meet the same
machine. The rates vary by up to 2x from round to round on a 2-core machine (the local server, the client
and Spark's JVM share the cores), so the ratio pairs them: each round's ``spark batch / client``, and the
**median of those per-round ratios** is the last line, ``ratio <median>`` (target >= 0.8). The best rate of
each variant is printed too, with the ratio of the two bests (one lucky round of either side moves it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import tablestore as ots  # noqa: E402
from record import append_record  # noqa: E402

from cdc.backends.tablestore import TablestoreBackend, TunnelClient, plainbuffer  # noqa: E402
from cdc.backends.tablestore.options import TablestoreOptions  # noqa: E402
from cdc.options import parse  # noqa: E402
from cdc.servers.tablestore import TablestoreProcess  # noqa: E402

CATALOG = (
    '{"columns": {"id": {"type": "long"}, "customer": {"type": "string"}, "amount": {"type": "double"},'
    ' "status": {"type": "string"}, "qty": {"type": "long"}}}'
)


def load(server: TablestoreProcess, rows: int, shards: int) -> dict[str, str]:
    sdk = ots.OTSClient(server.endpoint, server.access_key_id, server.access_key_secret, server.instance)
    sdk.create_table(
        ots.TableMeta("orders", [("id", "INTEGER")]),
        ots.TableOptions(),
        ots.ReservedThroughput(ots.CapacityUnit(0, 0)),
    )
    for i in range(1, shards):  # split points spread evenly over the key range
        open_shards = [s for s in server.shards("orders") if not s["sealed"]]
        server.split("orders", open_shards[-1]["shard_id"], [rows * i // shards])
    client = TunnelClient(server.endpoint, server.instance, server.access_key_id, server.access_key_secret)
    client.create_tunnel("orders", "bench", "Stream")
    t0 = time.perf_counter()
    statuses = ["new", "paid", "shipped", "returned"]
    for start in range(0, rows, 200):
        items = [
            ots.PutRowItem(
                ots.Row(
                    [("id", k)],
                    [
                        ("customer", f"cust-{k % 5000}"),
                        ("amount", k * 0.5),
                        ("status", statuses[k % 4]),
                        ("qty", k % 20),
                    ],
                ),
                ots.Condition(ots.RowExistenceExpectation.IGNORE),
            )
            for k in range(start, min(rows, start + 200))
        ]
        req = ots.BatchWriteRowRequest()
        req.add(ots.TableInBatchWriteRowItem("orders", items))
        sdk.batch_write_row(req)
    print(
        f"loaded {rows} rows in {time.perf_counter() - t0:.1f}s ({rows / (time.perf_counter() - t0):,.0f} rows/s)"
    )
    return {
        "endpoint": server.endpoint,
        "instance.name": server.instance,
        "table.name": "orders",
        "tunnel.name": "bench",
        "access.key.id": server.access_key_id,
        "access.key.secret": server.access_key_secret,
        "catalog": CATALOG,
    }


def read_with_client(options: dict[str, str], decode: bool) -> int:
    """Every channel's records; with ``decode``, as Arrow batches. The next response is fetched while
    this one is decoded (the HTTP wait releases the GIL), as the Spark source's range reader does."""
    backend = TablestoreBackend(parse(TablestoreOptions, options, what="bench"))
    client, tunnel_id = backend.client, backend.tunnel_id
    client_id = client.connect(tunnel_id)
    n = 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        for ch in backend.list_channels():
            token = backend.earliest(ch.id)["token"]
            base = False
            pending = pool.submit(client.read_records, tunnel_id, client_id, ch.id, token)
            while True:
                page = pending.result()
                done = page.finished or page.next_token == token
                if not done:
                    pending = pool.submit(client.read_records, tunnel_id, client_id, ch.id, page.next_token)
                if decode and page.records:
                    n += backend.layout.to_batch(ch.id, base, n, page.records).num_rows
                else:
                    n += len(page.records)
                if done:
                    break
                token = page.next_token
    client.shutdown(tunnel_id, client_id)
    backend.close()
    return n


def read_with_spark(spark: object, options: dict[str, str], ck: Path) -> None:
    reader = spark.readStream.format("cdc").option("backend", "tablestore")  # type: ignore[attr-defined]
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))


def spark_batch(spark: object, options: dict[str, str]) -> object:
    reader = spark.read.format("cdc").option("backend", "tablestore")  # type: ignore[attr-defined]
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def read_with_spark_batch(spark: object, options: dict[str, str]) -> None:
    spark_batch(spark, options).write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=1, help="shards = channels of the tunnel")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (the ratio is the median of their ratios)")
    parser.add_argument("--max-records-per-read", type=int, default=1000)
    parser.add_argument(
        "--quick", action="store_true", help="15k rows, 1 repeat, no streaming run (under a minute)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeat = 15_000, 1

    tmp = Path(tempfile.mkdtemp(prefix="ots-bench-"))
    server = TablestoreProcess(
        tmp / "data",
        instance="bench",
        access_key_id="bench-id",
        access_key_secret="bench-secret",
        max_records_per_read=args.max_records_per_read,
    )
    server.start()
    try:
        options = load(server, args.rows, args.shards)
        from pyspark.sql import SparkSession

        import cdc

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("tablestore-tunnel-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        read_with_spark_batch(spark, options)  # warm-up: JVM, Python workers, imports
        if not plainbuffer.COMPILED:
            print("warning: the compiled PlainBuffer reader is not built (make native): both clients run Python")
        counted = {**options, "maxRecordsPerChannel": str(10 * args.rows)}
        for opts in (options, counted):  # the noop sink counts nothing: check the rows once
            got = spark_batch(spark, opts).count()  # type: ignore[attr-defined]
            assert got == args.rows, got
        best = {
            "server": 0.0,
            "client": 0.0,
            "client (python reader)": 0.0,
            "spark batch": 0.0,
            "spark batch (counted ends)": 0.0,
        }
        if not args.quick:
            read_with_spark(spark, options, tmp / "ck-warmup")
            best["spark stream"] = 0.0
        paired: list[float] = []
        for i in range(args.repeat):
            this_round: dict[str, float] = {}
            for name in best:
                t0 = time.perf_counter()
                if name == "spark stream":
                    read_with_spark(spark, options, tmp / f"ck-{i}")
                    n = args.rows
                elif name.startswith("spark batch"):
                    read_with_spark_batch(spark, counted if "counted" in name else options)
                    n = args.rows
                else:
                    compiled = plainbuffer.COMPILED
                    plainbuffer.COMPILED = compiled and name != "client (python reader)"
                    try:
                        n = read_with_client(options, decode=name != "server")
                    finally:
                        plainbuffer.COMPILED = compiled
                    assert n == args.rows, (name, n)
                rate = n / (time.perf_counter() - t0)
                best[name] = max(best[name], rate)
                this_round[name] = rate
                print(f"run {i}: {name:26s} {rate:12,.0f} records/s")
            paired.append(this_round["spark batch"] / this_round["client"])
            print(f"run {i}: spark batch / client {paired[-1]:.3f}")
        spark.stop()
        for name, rate in best.items():
            print(f"best {name:26s} {rate:12,.0f} records/s")
        counted_ratio = best["spark batch (counted ends)"] / best["client"]
        print(f"spark batch (counted ends) / client: {counted_ratio:.3f}")
        print(f"client / client (python reader): {best['client'] / best['client (python reader)']:.2f}x")
        if "spark stream" in best:
            stream = best["spark stream"] / best["client"]
            print(f"spark stream / client (includes the streaming query's start): {stream:.3f}")
        print(f"best spark batch / best client: {best['spark batch'] / best['client']:.3f}")
        print(f"per-round spark batch / client: {', '.join(f'{r:.3f}' for r in paired)}")
        append_record("tablestore_tunnel", {name: (rate, "records/s") for name, rate in best.items()}, ratio=statistics.median(paired))
        print(f"ratio {statistics.median(paired):.3f}")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
