"""A streaming query from a local change log into DeltaUpsertSink, run as a child process that the crash
test kills with SIGKILL (see test_crash.py); the run after the kills, which nothing kills, goes through
:func:`run` in the tests' own Spark session. Not a test module.

Usage: python delta_crash_child.py LOG TABLE CHECKPOINT MARKERS [--hold-after-commit N | --hold-before-commit N |
       --hold-between-commits N | --hold-in-background-merge N]
   or: python delta_crash_child.py --queries JSON
Environment: CRASH_CHILD_ENGINE (the sink's engine, default delta-rs), CRASH_CHILD_PIPELINED (1: pipelined),
CRASH_CHILD_MAX_RECORDS (maxRecordsPerTrigger, default 40: fewer, larger batches make fewer delta-spark MERGEs),
CRASH_CHILD_ORDERED (1: the sink in ordered mode; otherwise safe mode).

``--queries`` runs several queries at once in the one driver, each with its own log, table, checkpoint, markers
and crash point: JSON is a list of :func:`start`'s arguments as objects (``log_path``, ``table``,
``checkpoint``, ``markers``, ``hold``, ``hold_batch``, ``pipelined``, ``ordered``). One ``kill -9`` then crashes
every query at its own point, for the cost of one driver start.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable


def main() -> None:
    queries = json.loads(sys.argv[2]) if sys.argv[1] == "--queries" else None
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import cdc
    from tests.conftest import spark_builder

    spark = spark_builder("delta-crash-child").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cdc.register(spark)
    if queries is not None:
        started = []
        for query in queries:
            started.append(start(spark, **query))
            # One source at a time: each query's source starts a Python process that connects back to the JVM,
            # and several starting at once on a loaded machine can miss the connection's time-out.
            while started[-1][0].isActive and not any(Path(query["checkpoint"], "offsets").glob("[0-9]*")):
                time.sleep(0.1)
        finish(started)
    else:
        log_path, table, checkpoint, markers = sys.argv[1:5]
        hold = sys.argv[5] if len(sys.argv) > 5 else ""
        hold_batch = int(sys.argv[6]) if len(sys.argv) > 6 else -1
        run(spark, log_path, table, checkpoint, markers, hold, hold_batch)
    spark.stop()


def run(spark: Any, log_path: str, table: str, checkpoint: str, markers: str, hold: str = "", hold_batch: int = -1,
        *, pipelined: bool = False, timeout_s: float | None = None) -> None:
    """The query, until caught up (``Trigger.AvailableNow``) and its last merge committed, in ``spark``: this
    child's session, or the tests' own for the run after the kills (a restart needs no process of its own)."""
    finish([start(spark, log_path, table, checkpoint, markers, hold, hold_batch, pipelined=pipelined)], timeout_s)


def finish(started: list[tuple[Any, Any]], timeout_s: float | None = None) -> None:
    """Wait for started queries to catch up, then for their sinks' last merges."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        for q, _ in started:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            if q.awaitTermination(left) is False:
                raise TimeoutError(f"the query did not catch up in {timeout_s} s")
            if q.exception() is not None:
                raise RuntimeError(f"the query failed: {q.exception()}")
    finally:
        for q, _ in started:
            q.stop()
    for _, sink in started:
        sink.flush()  # pipelined: the last batches' background merge (a child's exit waits for it too)


def start(spark: Any, log_path: str, table: str, checkpoint: str, markers: str, hold: str = "", hold_batch: int = -1,
          *, pipelined: bool = False, ordered: bool | None = None) -> tuple[Any, Any]:
    """Start the query (``ordered``: the sink's mode, by default from the environment); returns it and its
    sink."""
    from sinks.delta import DeltaUpsertSink

    calls = Path(markers) / "calls.txt"

    class SlowMergeSink(DeltaUpsertSink):
        """Pipelined mode: the background merge of the held batch waits (and is killed there), so Spark
        records the batch as done while its Delta commit does not exist yet."""

        def _apply(self, changes: Any, first: int, batch_id: int, app: str, claim: str | None = None) -> bool:
            # Every Arrow batch goes through _apply; the background merge applies a group of staged batches
            # (first..batch_id) there.
            if hold == "--hold-in-background-merge" and first <= hold_batch <= batch_id:
                (Path(markers) / "holding").write_text(str(hold_batch))
                time.sleep(600)
            if hold == "--hold-between-commits" and first <= hold_batch <= batch_id:
                self._hold_state_commit(hold_batch)
            return super()._apply(changes, first, batch_id, app, claim)

        def write_frame(self, batch_df: Any, batch_id: int, app_id: str | None = None, *,
                        claim: str | None = None) -> bool:
            # delta-spark: a batch is merged inside Spark, not through _apply
            if hold == "--hold-between-commits" and batch_id == hold_batch:
                self._hold_state_commit(batch_id)
            return super().write_frame(batch_df, batch_id, app_id, claim=claim)

        def _hold_state_commit(self, batch_id: int) -> None:
            def held(*args: Any, **kwargs: Any) -> Any:
                # killed here: the main table's commit is made, the state table's is not
                (Path(markers) / "holding").write_text(str(batch_id))
                time.sleep(600)

            state = self.state_engine()
            state.merge = held  # type: ignore[method-assign]
            if hasattr(state, "merge_frame"):  # delta-spark: the DataFrame path's commit
                state.merge_frame = held

    pipelined = pipelined or hold == "--hold-in-background-merge" or os.environ.get("CRASH_CHILD_PIPELINED") == "1"
    engine = os.environ.get("CRASH_CHILD_ENGINE", "delta-rs")
    # Safe mode (the default would take ordered mode from the local source's mark): its two commits per batch are
    # what the crash points sit between.
    ordered = os.environ.get("CRASH_CHILD_ORDERED") == "1" if ordered is None else ordered
    sink = SlowMergeSink(table, keys=["id"], compact_every=3, pipelined=pipelined, engine=engine, ordered=ordered)

    def batch(df: object, batch_id: int) -> None:
        with calls.open("a") as f:
            f.write(f"{os.getpid()} {batch_id}\n")
        if hold == "--hold-before-commit" and batch_id == hold_batch:
            (Path(markers) / "holding").write_text(str(batch_id))
            time.sleep(600)  # killed here: the batch is planned (offset log) but nothing is committed
        if hold == "--hold-in-background-merge" and batch_id == hold_batch + 1:
            # The next batch waits too (killed here), so the restart has a batch to run (whose first call
            # merges the held batch from its staged copy) however long the kill takes to come.
            (Path(markers) / "next-held").write_text(str(batch_id))
            time.sleep(600)
        sink(df, batch_id)
        if hold == "--hold-after-commit" and batch_id == hold_batch:
            (Path(markers) / "holding").write_text(str(batch_id))
            time.sleep(600)  # killed here: the Delta commit is made, Spark's commit log is not written

    changes = (
        spark.readStream.format("cdc").option("backend", "local").option("path", log_path)
        .option("maxRecordsPerTrigger", os.environ.get("CRASH_CHILD_MAX_RECORDS", "40")).load()
    )
    q = changes.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    return q, sink


if __name__ == "__main__":
    main()
