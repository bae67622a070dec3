"""PostgreSQL to Delta Lake: two tables streamed by logical replication into two Delta tables.

1. Starts a real PostgreSQL on loopback (``cdc.servers.postgres``; the machine's binaries) with ``orders``
   and ``customers`` holding some rows.
2. Starts a streaming query with ``startingOffsets=snapshot`` over both tables: the exported snapshot's
   rows first, then every change after it. A routing sink applies each table's changes to its own Delta
   table (``sinks.routing.RoutingDeltaSink``: one ``DeltaUpsertSink`` per table). A writer thread runs
   inserts, updates and deletes on both tables the whole time.
3. Stops the writer and the query, drains with ``Trigger.AvailableNow`` from the checkpoint, and compares
   each Delta table with ``SELECT *`` of its table.

    python examples/postgres_to_delta.py --seconds 10
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import cdc  # noqa: E402
from cdc.servers.postgres import PostgresServer  # noqa: E402
from sinks.delta import read  # noqa: E402
from sinks.routing import RoutingDeltaSink  # noqa: E402

TABLES = {"public.orders": ("order_id", "customer_id", "amount", "status"),
          "public.customers": ("customer_id", "name", "city")}


def writer(dsn: str, stop: threading.Event) -> None:
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_order = 1000
        while not stop.is_set():
            with conn.transaction():
                next_order += 1
                conn.execute("INSERT INTO orders VALUES (%s, %s, %s, 'new')",
                             (next_order, rng.randrange(1, 50), round(rng.uniform(1, 500), 2)))
                conn.execute("UPDATE orders SET status = %s, amount = amount + 1 WHERE order_id = %s",
                             (rng.choice(["paid", "shipped"]), rng.randrange(1, next_order)))
                if rng.random() < 0.3:
                    conn.execute("DELETE FROM orders WHERE order_id = %s", (rng.randrange(1, next_order),))
                conn.execute("UPDATE customers SET city = %s WHERE customer_id = %s",
                             (rng.choice(["Oslo", "Lima", "Pune"]), rng.randrange(1, 50)))
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/cdc-postgres-example")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    with PostgresServer() as pg:
        dsn = pg.create_database("shop")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE customers (customer_id bigint PRIMARY KEY, name text, city text)")
            conn.execute("CREATE TABLE orders (order_id bigint PRIMARY KEY, customer_id bigint, "
                         "amount double precision, status text)")
            conn.execute("INSERT INTO customers SELECT g, 'customer ' || g, 'Rome' FROM generate_series(1, 49) g")
            conn.execute("INSERT INTO orders SELECT g, g % 49 + 1, g * 1.5, 'new' FROM generate_series(1, 1000) g")
        print(f"PostgreSQL on 127.0.0.1:{pg.port}: 1000 orders, 49 customers")
        spark = (SparkSession.builder.master("local[2]").appName("postgres-to-delta")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        sink = RoutingDeltaSink(str(work / "lake"))
        stop = threading.Event()
        thread = threading.Thread(target=writer, args=(dsn, stop))
        thread.start()
        def start(**trigger: Any) -> Any:
            return (spark.readStream.format("cdc").option("backend", "postgres").option("dsn", dsn)
                    .option("tables", ",".join(TABLES)).option("startingOffsets", "snapshot")
                    .option("snapshot.path", str(work / "snapshots")).option("slot.name", "example")
                    .option("maxRecordsPerTrigger", 2000).load()
                    .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "checkpoint"))
                    .trigger(**trigger).start())

        query = start(processingTime="1 second")
        time.sleep(args.seconds)
        stop.set()
        thread.join()
        # Stop only once the first batch is in the checkpoint: a query stopped while Spark writes its very
        # first offsets can leave a file behind that makes the restart fail ("checkpoint location ... should
        # be empty on batch 0"). Any later stop is safe: the restart replays from the offset log.
        deadline = time.monotonic() + 300
        while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
        # Draining: the same query restarted from its checkpoint with Trigger.AvailableNow reads everything
        # committed so far and stops (an idle streaming query reports progress only every 10 s).
        print("writer stopped; draining")
        start(availableNow=True).awaitTermination()
        equal = True
        with psycopg.connect(dsn) as conn:
            for table, cols in TABLES.items():
                source = {tuple(r) for r in conn.execute(f"SELECT {', '.join(cols)} FROM {table}".encode())}
                lake = {tuple(r) for r in read(spark, sink.path(table)).select(*cols).collect()}
                print(f"{table}: source {len(source)} rows, Delta {len(lake)} rows, equal: {source == lake}")
                equal = equal and source == lake
            conn.execute("SELECT pg_drop_replication_slot('example')")  # a forgotten slot keeps WAL forever
        spark.stop()
    if not equal:
        print("RESULT: MISMATCH between the Delta tables and the source tables")
        sys.exit(1)
    print("RESULT: both Delta tables equal SELECT * of their PostgreSQL tables")


if __name__ == "__main__":
    main()
