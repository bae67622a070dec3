"""``backend=tablestore``: Alibaba Tablestore Tunnel (BaseData, Stream, BaseAndStream) as a change log.

Example::

    df = (spark.readStream.format("cdc").option("backend", "tablestore")
          .option("endpoint", "https://my-instance.cn-hangzhou.ots.aliyuncs.com")
          .option("instance.name", "my-instance").option("table.name", "orders")
          .option("tunnel.name", "orders-cdc").option("createTunnelIfMissing", "true")
          .option("catalog", '{"columns": {"status": {"type": "string"}, "amount": {"type": "double"}}}')
          .load())   # credentials: access.key.id / access.key.secret, or ALIBABA_CLOUD_ACCESS_KEY_ID/_SECRET

The table's full data arrives first as ``snapshot`` changes (BaseAndStream), then every change in order per
key across partition splits and merges; the offsets in Spark's checkpoint hold every channel's position,
so a batch replayed after a crash reads exactly the same records (see :mod:`.backend`).

Files: :mod:`.tunnel_pb` (the tunnel service's protobuf messages), :mod:`.client` (the tunnel client on
the ``tablestore`` SDK's transport), :mod:`.errors` (typed service errors), :mod:`.plainbuffer` (the row
codec), :mod:`.options`, :mod:`.backend` (positions, lineage, deterministic batches).
"""

from cdc.backends.tablestore.backend import TablestoreBackend
from cdc.backends.tablestore.client import TunnelClient
from cdc.backends.tablestore.options import TablestoreOptions

__all__ = ["TablestoreBackend", "TablestoreOptions", "TunnelClient"]
