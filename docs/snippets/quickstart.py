import os
import sys
import tempfile

import pyarrow as pa
from pyspark.sql import SparkSession

import cdc
from cdc.backends.local import LocalLog
from sinks.delta import DeltaUpsertSink, read

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers: this interpreter
work = tempfile.mkdtemp(prefix="cdc-quickstart-")

# A change log with two channels, and a few changes to an orders table.
log = LocalLog.create(f"{work}/log", [("order_id", pa.int64()), ("status", pa.string())],
                      keys=["order_id"], channels=2)
log.append([{"order_id": 1, "status": "new", "_op": "insert"},
            {"order_id": 2, "status": "new", "_op": "insert"},
            {"order_id": 3, "status": "new", "_op": "insert"}])
log.append([{"order_id": 1, "status": "paid", "_op": "update"},
            {"order_id": 2, "status": None, "_op": "delete"}])

spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
cdc.register(spark)

# Stream every change into a Delta table, exactly once: run it again and nothing changes twice.
changes = spark.readStream.format("cdc").option("backend", "local").option("path", f"{work}/log").load()
sink = DeltaUpsertSink(f"{work}/orders", keys=["order_id"], sequence_by="_seq")
query = (changes.writeStream.foreachBatch(sink)
         .option("checkpointLocation", f"{work}/checkpoint")
         .trigger(availableNow=True).start())
query.awaitTermination()

read(spark, f"{work}/orders").select("order_id", "status").orderBy("order_id").show()
