"""MariaDB (or MySQL's binary log format) to Delta Lake: two tables, a chunked snapshot, then every change.

1. Starts a real MariaDB on loopback (``cdc.servers.mysql``; Debian's ``mariadb-server`` binaries) with
   ``orders`` and ``customers`` holding some rows, or uses the server given with ``--dsn``.
2. Starts a streaming query with ``startingOffsets=snapshot`` over both tables: each table is read in key-range
   chunks, a few per batch, each at a consistent cut that also ends the batch's changes, while the changes keep
   flowing. A routing sink applies each table's records to its own Delta table (``sinks.routing.
   RoutingDeltaSink``). A writer thread runs inserts, updates, key changes and deletes on both tables the
   whole time, the snapshot included.
3. Stops the writer and the query, drains with ``Trigger.AvailableNow`` from the checkpoint, and compares
   each Delta table with ``SELECT *`` of its table.

    python examples/mysql_to_delta.py --seconds 10
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pymysql  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import cdc  # noqa: E402
from cdc.backends.mysql.options import parse_dsn  # noqa: E402
from cdc.servers.mysql import MariaDBServer  # noqa: E402
from sinks.delta import read  # noqa: E402
from sinks.routing import RoutingDeltaSink  # noqa: E402

COLUMNS = {"orders": ("order_id", "customer_id", "amount", "status"), "customers": ("customer_id", "name", "city")}


def connect(dsn: str) -> Any:
    return pymysql.connect(**parse_dsn(dsn).connect_args())  # type: ignore[arg-type]


def writer(dsn: str, stop: threading.Event, orders: int) -> None:
    rng = random.Random(7)
    conn = connect(dsn)
    next_order = orders
    with conn.cursor() as cur:
        while not stop.is_set():
            conn.begin()
            next_order += 1
            cur.execute("INSERT INTO orders VALUES (%s, %s, %s, 'new')",
                        (next_order, rng.randrange(1, 50), round(rng.uniform(1, 500), 2)))
            cur.execute("UPDATE orders SET status = %s, amount = amount + 1 WHERE order_id = %s",
                        (rng.choice(["paid", "shipped", "it's \"late\" \\"]), rng.randrange(1, next_order)))
            if rng.random() < 0.2:  # a key change: the order moves across the table (and its chunks)
                cur.execute("UPDATE IGNORE orders SET order_id = %s WHERE order_id = %s",
                            (rng.randrange(1, next_order), rng.randrange(1, next_order)))
            if rng.random() < 0.3:
                cur.execute("DELETE FROM orders WHERE order_id = %s", (rng.randrange(1, next_order),))
            cur.execute("UPDATE customers SET city = %s WHERE customer_id = %s",
                        (rng.choice(["Oslo", "Lima", "Pune", "Zürich"]), rng.randrange(1, 50)))
            conn.commit()
            time.sleep(0.005)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/cdc-mysql-example")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--orders", type=int, default=20_000, help="orders in the table before the snapshot")
    parser.add_argument("--dsn", default=None, help="an existing database (mysql://user@host:port/db) to use")
    args = parser.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    with ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(MariaDBServer()).create_database("shop")
        conn = connect(dsn)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE customers (customer_id BIGINT PRIMARY KEY, name VARCHAR(80), city VARCHAR(40))")
            cur.execute("CREATE TABLE orders (order_id BIGINT PRIMARY KEY, customer_id BIGINT, amount DOUBLE, "
                        "status VARCHAR(40))")
            cur.executemany("INSERT INTO customers VALUES (%s, %s, 'Rome')", [(i, f"customer {i}") for i in range(1, 50)])
            cur.executemany("INSERT INTO orders VALUES (%s, %s, %s, 'new')",
                            [(i, i % 49 + 1, i * 1.5) for i in range(1, args.orders + 1)])
        database = parse_dsn(dsn).database
        tables = [f"{database}.{t}" for t in COLUMNS]
        print(f"MariaDB {dsn.rsplit('@', 1)[-1]}: {args.orders} orders, 49 customers")
        spark = (SparkSession.builder.master("local[2]").appName("mysql-to-delta")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        sink = RoutingDeltaSink(str(work / "lake"))
        stop = threading.Event()
        thread = threading.Thread(target=writer, args=(dsn, stop, args.orders))
        thread.start()

        def start(**trigger: Any) -> Any:
            return (spark.readStream.format("cdc").option("backend", "mysql").option("dsn", dsn)
                    .option("tables", ",".join(tables)).option("startingOffsets", "snapshot")
                    .option("snapshot.path", str(work / "snapshots")).option("snapshot.chunkRows", max(1, args.orders // 8))
                    .option("snapshot.chunksPerBatch", 4).load()
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
        # committed so far, the rest of the snapshot included, and stops.
        print("writer stopped; draining")
        start(availableNow=True).awaitTermination()
        equal = True
        with conn.cursor() as cur:
            for table, cols in COLUMNS.items():
                cur.execute(f"SELECT {', '.join(cols)} FROM {table}")
                source = {tuple(r) for r in cur.fetchall()}
                lake = {tuple(r) for r in read(spark, sink.path(f"{database}.{table}")).select(*cols).collect()}
                print(f"{table}: source {len(source)} rows, Delta {len(lake)} rows, equal: {source == lake}")
                equal = equal and source == lake
        conn.close()
        spark.stop()
    if not equal:
        print("RESULT: MISMATCH between the Delta tables and the source tables")
        sys.exit(1)
    print("RESULT: both Delta tables equal SELECT * of their MariaDB tables")


if __name__ == "__main__":
    main()
