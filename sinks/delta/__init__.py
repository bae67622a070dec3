"""The Delta Lake upsert sink: change records in, a Delta table that equals the source table out.

    from sinks.delta import DeltaUpsertSink, read
    sink = DeltaUpsertSink("/lake/orders", keys=["order_id"], sequence_by="_seq")
    changes.writeStream.foreachBatch(sink).option("checkpointLocation", ck).start()
    read(spark, "/lake/orders").show()

Modules: :mod:`~sinks.delta.sink` (the foreachBatch sink) commits each batch with :mod:`~sinks.delta.commit`
(the steps, once for both forms of a batch), whose preparer is :mod:`~sinks.delta.arrow_batch` (an Arrow
batch: :mod:`~sinks.delta.batch` validates and reduces it per key, :mod:`~sinks.delta.scd1` or
:mod:`~sinks.delta.scd2` stage the MERGE source) or :mod:`~sinks.delta.frame` (a DataFrame, prepared and
staged inside Spark for delta-spark); :mod:`~sinks.delta.schema` (create, evolve) and :mod:`~sinks.delta.merge`
(the MERGE statement) serve both, configured by :mod:`~sinks.delta.spec` (options, rules) over the table
described in :mod:`~sinks.delta.layout`; an engine runs the statements: :mod:`~sinks.delta.rs` (delta-rs, the
default) or :mod:`~sinks.delta.spark` (delta-spark; :mod:`~sinks.delta.session` finds its jars and configures a
session). :mod:`~sinks.delta.pipelining` merges pipelined mode's batches in the background (staged by
:mod:`~sinks.delta.staging`); :mod:`~sinks.delta.maintenance` purges tombstones and compacts;
:mod:`~sinks.delta.reader` reads a table into Spark.
"""

from cdc.errors import requires_extra

with requires_extra("delta", "the Delta Lake sink (sinks.delta)"):
    import deltalake  # noqa: F401 - the engine every path of the sink uses (table logs, delta-rs merges)

from sinks.delta.reader import read
from sinks.delta.schema import SchemaEvolutionError
from sinks.delta.sink import DeltaUpsertSink

__all__ = ["DeltaUpsertSink", "SchemaEvolutionError", "read"]
