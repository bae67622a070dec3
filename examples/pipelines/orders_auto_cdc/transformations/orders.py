"""The orders change log (``format("cdc")``) applied to the ``orders`` streaming table by AUTO CDC.

A pipeline definition file: ``spark-pipelines`` runs it with ``spark`` (a Spark Connect session) in its
globals, and blocks session mutations (``spark.conf.set``, ``spark.udf.register``) while it runs.
``cdc.register`` registers only the data source there (its SQL functions are skipped with a log line).
"""

from pathlib import Path

from pyspark import pipelines as dp

import cdc

spark = globals()["spark"]  # injected by spark-pipelines
cdc.register(spark)

# The spec's `configuration` (reading conf is allowed); relative to the spec's folder, the working directory
# while definitions load (the server that runs the flows has another one).
LOG = str(Path(spark.conf.get("cdc.example.orders.log")).resolve())


@dp.temporary_view
def order_changes():  # type: ignore[no-untyped-def]
    """Every change of the orders table: its rows at a consistent cut, then the changes after it."""
    return (spark.readStream.format("cdc").option("backend", "local").option("path", LOG)
            .option("startingOffsets", "snapshot").load())


dp.create_streaming_table("orders", format="delta")  # AUTO CDC needs a MERGE-capable target
dp.create_auto_cdc_flow(
    target="orders",
    source="order_changes",
    keys=["order_id"],
    sequence_by="_seq",
    apply_as_deletes="_op = 'delete'",
    except_column_list=["_op", "_seq", "_commit_ts", "_channel", "_position"],
    stored_as_scd_type=1,
)
