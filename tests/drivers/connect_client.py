"""A Spark Connect client run as a child process by tests/connect (a Connect session would switch the test
process's pyspark functions to Connect mode). Not a test module.

Usage: python connect_client.py URL LOG TABLE CHECKPOINT RESULT_JSON

Registers ``cdc``, streams the local change log at LOG through ``DeltaUpsertSink`` (app id derived from the
query) into TABLE until caught up, reads the table back over Connect, and writes what it saw to RESULT_JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    url, log_path, table, checkpoint, result = sys.argv[1:6]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from tenacity import Retrying, retry_if_exception, stop_after_attempt

    import cdc
    from sinks.delta import DeltaUpsertSink, read

    spark = SparkSession.builder.remote(url).getOrCreate()
    cdc.register(spark)
    sink = DeltaUpsertSink(table, keys=["id"], compact_every=None)
    changes = (spark.readStream.format("cdc").option("backend", "local").option("path", log_path)
               .option("maxRecordsPerTrigger", "150").load())
    writer = changes.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(availableNow=True)
    # The server gives the foreachBatch Python worker a hard-coded 10 s to connect back (PythonWorkerFactory);
    # on a loaded 2-core machine its imports alone have taken longer. Only that failure is retried.
    for attempt in Retrying(stop=stop_after_attempt(4), reraise=True,
                            retry=retry_if_exception(lambda e: "Python worker failed to connect back" in str(e))):
        with attempt:
            query = writer.start()
    query.awaitTermination()
    rows = read(spark, table).select("id", "v").collect()
    Path(result).write_text(json.dumps({
        "session": type(spark).__module__,
        "query_id": str(query.id),
        "batches": query.lastProgress["batchId"] + 1 if query.lastProgress else 0,
        "rows": sorted([r["id"], r["v"]] for r in rows),
    }))
    spark.stop()


if __name__ == "__main__":
    main()
