"""The Delta Lake upsert sink: change records in, a Delta table that equals the source table out.

    from sinks.delta import DeltaUpsertSink, read
    sink = DeltaUpsertSink("/lake/orders", keys=["order_id"], sequence_by="_seq")
    changes.writeStream.foreachBatch(sink).option("checkpointLocation", ck).start()
    read(spark, "/lake/orders").show()

Modules: :mod:`~sinks.delta.semantics` (every rule, engine-independent), :mod:`~sinks.delta.rs` (delta-rs,
the default), :mod:`~sinks.delta.spark` (delta-spark), :mod:`~sinks.delta.sink` (the foreachBatch sink).
"""

from sinks.delta.reader import read
from sinks.delta.semantics import SchemaEvolutionError
from sinks.delta.sink import DeltaUpsertSink

__all__ = ["DeltaUpsertSink", "SchemaEvolutionError", "read"]
