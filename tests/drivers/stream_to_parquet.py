"""A streaming driver for kill -9 tests: ``python stream_to_parquet.py OPTIONS_JSON OUT CHECKPOINT forever|once``.

Reads ``format("cdc")`` with the JSON options into parquet at OUT; ``forever`` triggers every 200 ms until
killed, ``once`` runs until caught up (``Trigger.AvailableNow``)."""

import json
import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession  # noqa: E402

import cdc  # noqa: E402

options, out, ck, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
cdc.register(spark)
reader = spark.readStream.format("cdc")
for k, v in options.items():
    reader = reader.option(k, v)
stream = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
if mode == "forever":
    stream.trigger(processingTime="200 milliseconds").start().awaitTermination()
else:
    stream.trigger(availableNow=True).start().awaitTermination()
