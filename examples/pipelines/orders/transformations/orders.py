"""The orders change log (``format("cdc")``) streamed into ``order_changes``, and ``orders``, the source
table's rows (latest change per key by ``_seq``, deleted keys left out), as a materialized view over it.

A pipeline definition file: ``spark-pipelines`` runs it with ``spark`` (a Spark Connect session) in its
globals, and blocks session mutations (``spark.conf.set``, ``spark.udf.register``) while it runs.
``cdc.register`` registers only the data source there (its SQL functions are skipped with a log line).
"""

from pathlib import Path

from pyspark import pipelines as dp
from pyspark.sql import Window
from pyspark.sql import functions as F

import cdc

spark = globals()["spark"]  # injected by spark-pipelines
cdc.register(spark)

# The spec's `configuration` (reading conf is allowed); relative to the spec's folder, the working directory
# while definitions load (the server that runs the flows has another one).
LOG = str(Path(spark.conf.get("cdc.example.orders.log")).resolve())


@dp.table
def order_changes():  # type: ignore[no-untyped-def]
    """Every change of the orders table, exactly once (the pipeline checkpoints the stream in `storage`):
    its rows at a consistent cut, then the changes after it."""
    return (spark.readStream.format("cdc").option("backend", "local").option("path", LOG)
            .option("startingOffsets", "snapshot").load())


@dp.materialized_view
def orders():  # type: ignore[no-untyped-def]
    """The orders table as the source has it now."""
    latest = Window.partitionBy("order_id").orderBy(F.col("_seq").desc())
    return (spark.read.table("order_changes").withColumn("_rank", F.row_number().over(latest))
            .where("_rank = 1 AND _op != 'delete'")
            .select("order_id", "customer", "amount", "status"))
