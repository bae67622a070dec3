"""A streaming query from PostgreSQL (``startingOffsets=snapshot``, chunked) into two Delta tables through
``DeltaUpsertSink`` (one in its default mode, one pipelined), run as a child process that the chunked-snapshot
crash test kills (the test also runs :func:`stream` in its own session). Not a test module.

Usage: python chunked_snapshot_child.py DSN LAKE CHECKPOINT SNAPSHOTS MARKERS [--hold before|after N] [--once]
``--hold before N``: batch N waits (in foreachBatch, before the sink reads it: its offsets are logged, its chunks
not read) until ``MARKERS/release`` exists; ``after``: after the sinks committed it. ``--once``: run with
Trigger.AvailableNow and exit; else a 0.5 s processing-time trigger until killed. Spark runs ``local[2,3]``: a
task may fail twice and be retried. :func:`stream` with ``restart``: when the query fails, write its error to
``MARKERS/failed``, wait for ``MARKERS/resume``, then restart it on its checkpoint in the same driver (new
sinks, Trigger.AvailableNow).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


def stream(spark: Any, dsn: str, lake: str, checkpoint: str, snapshots: str, markers: str, hold: str = "",
           hold_batch: int = -1, once: bool = False, restart: bool = False) -> None:
    """The query (see the module's docstring for the flags), in ``spark``, until it ends."""
    from sinks.delta import DeltaUpsertSink

    def new_sinks() -> list[DeltaUpsertSink]:
        return [DeltaUpsertSink(f"{lake}/default", keys=["k"], engine="delta-rs"),
                DeltaUpsertSink(f"{lake}/pipelined", keys=["k"], engine="delta-rs", pipelined=True)]

    sinks = new_sinks()
    marks = Path(markers)

    def wait(batch_id: int, when: str) -> None:
        if hold == when and batch_id == hold_batch:
            (marks / "holding").write_text(f"{when} {batch_id}")
            while not (marks / "release").exists():
                time.sleep(0.1)

    def batch(df: Any, batch_id: int) -> None:
        with (marks / "batches.txt").open("a") as f:
            f.write(f"{os.getpid()} {batch_id}\n")
        wait(batch_id, "before")
        df = df.persist()
        for sink in sinks:
            sink(df, batch_id)
        df.unpersist()
        wait(batch_id, "after")

    changes = (spark.readStream.format("cdc").option("backend", "postgres").option("dsn", dsn)
               .option("tables", "crashed").option("slot.name", "crashed").option("startingOffsets", "snapshot")
               .option("snapshot.path", snapshots).option("snapshot.chunkRows", "150")
               .option("snapshot.chunksPerBatch", "2").option("snapshot.cutTimeout", "2").load())
    writer = changes.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
    query = (writer.trigger(availableNow=True) if once else writer.trigger(processingTime="500 milliseconds")).start()
    try:
        query.awaitTermination()
    except Exception as exc:
        if not restart:
            raise
        for sink in sinks:  # the failed query's last background merge (pipelined) ends before the restart
            sink.flush()
        (marks / "failed").write_text(str(exc))
        while not (marks / "resume").exists():
            time.sleep(0.1)
        sinks[:] = new_sinks()
        writer.trigger(availableNow=True).start().awaitTermination()
    for sink in sinks:
        sink.flush()  # pipelined: the last batches' background merge


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    dsn, lake, checkpoint, snapshots, markers = sys.argv[1:6]
    rest = sys.argv[6:]
    hold, hold_batch = (rest[rest.index("--hold") + 1], int(rest[rest.index("--hold") + 2])) if "--hold" in rest else ("", -1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import cdc
    from tests.conftest import spark_builder

    spark = spark_builder("chunked-snapshot-child").master("local[2,3]").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    stream(spark, dsn, lake, checkpoint, snapshots, markers, hold, hold_batch, once="--once" in rest)
    spark.stop()


if __name__ == "__main__":
    main()
