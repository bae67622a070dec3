"""The orders pipeline as a driver on the test Spark cluster, run as a child process that tests/cluster kills
with SIGKILL. Not a test module.

Usage: python cluster_orders.py CONF_JSON LOG TABLE CHECKPOINT forever|once|twice [ENGINE [MAX_RECORDS_PER_TRIGGER]]

``once`` runs until caught up (``Trigger.AvailableNow``); ``twice`` does so, waits for the file CHECKPOINT.next,
then runs again from the same checkpoint: a second run without a second application (a driver start on the
cluster costs its JVM, executor JVMs and their Python workers).

CONF_JSON holds the session settings (``SparkCluster.session_conf()`` plus the trace settings). The source is
``cdc-traced`` (``tests/cluster/traced_source.py``: ``cdc`` with its executor reads traced); the sink is
``DeltaUpsertSink`` on ENGINE (default delta-rs, merging on the driver; delta-spark merges on the executors
and needs the io.delta jars in CONF_JSON's ``spark.jars``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    conf_json, log_path, table, checkpoint, mode = sys.argv[1:6]
    engine = sys.argv[6] if len(sys.argv) > 6 else "delta-rs"
    max_records = sys.argv[7] if len(sys.argv) > 7 else "800"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import cdc
    from sinks.delta import DeltaUpsertSink
    from tests.cluster.traced_source import TracedCdcDataSource

    builder = SparkSession.builder.appName(f"cluster-orders-{mode}")
    for k, v in json.loads(conf_json).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    spark.dataSource.register(TracedCdcDataSource)
    sink = DeltaUpsertSink(table, keys=["order_id"], compact_every=5, engine=engine)

    def writer() -> Any:
        changes = (spark.readStream.format("cdc-traced").option("backend", "local").option("path", log_path)
                   .option("startingOffsets", "snapshot").option("maxRecordsPerTrigger", max_records).load())
        return changes.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)

    if mode in ("once", "twice"):
        writer().trigger(availableNow=True).start().awaitTermination()
        if mode == "twice":
            while not Path(f"{checkpoint}.next").exists():
                time.sleep(0.2)
            writer().trigger(availableNow=True).start().awaitTermination()
    else:
        writer().trigger(processingTime="500 milliseconds").start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
