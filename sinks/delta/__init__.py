"""The Delta Lake upsert sink: change records in, a Delta table that equals the source table out.

    from sinks.delta import DeltaUpsertSink, read
    sink = DeltaUpsertSink("/lake/orders", keys=["order_id"], sequence_by="_seq")
    changes.writeStream.foreachBatch(sink).option("checkpointLocation", ck).start()
    read(spark, "/lake/orders").show()

Modules: :mod:`~sinks.delta.sink` (the foreachBatch sink) runs, per batch, the engine-independent steps
:mod:`~sinks.delta.batch` (validate, reduce per key), :mod:`~sinks.delta.schema` (create, evolve),
:mod:`~sinks.delta.scd1` or :mod:`~sinks.delta.scd2` (stage the MERGE source) and :mod:`~sinks.delta.merge`
(the MERGE statement), configured by :mod:`~sinks.delta.spec` (options, rules) over the table described in
:mod:`~sinks.delta.layout`; an engine runs the statements: :mod:`~sinks.delta.rs` (delta-rs, the default) or
:mod:`~sinks.delta.spark` (delta-spark, which from ``foreachBatch`` prepares and stages the batch inside Spark
with :mod:`~sinks.delta.frame`; :mod:`~sinks.delta.session` finds its jars and configures a session).
:mod:`~sinks.delta.staging` keeps pipelined mode's staged batches;
:mod:`~sinks.delta.reader` reads a table into Spark.
"""

from cdc.errors import requires_extra

with requires_extra("delta", "the Delta Lake sink (sinks.delta)"):
    import deltalake  # noqa: F401 - the engine every path of the sink uses (table logs, delta-rs merges)

from sinks.delta.reader import read
from sinks.delta.schema import SchemaEvolutionError
from sinks.delta.sink import DeltaUpsertSink

__all__ = ["DeltaUpsertSink", "SchemaEvolutionError", "read"]
