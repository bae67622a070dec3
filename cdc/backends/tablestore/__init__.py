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

Files: :mod:`.options`, :mod:`.backend` (the driver: channels, lineage, deterministic batches),
:mod:`.reader` (reading planned ranges on executors), :mod:`.positions` (positions, ordering keys),
:mod:`.records` (tunnel records to change rows), :mod:`.errors` (typed service errors), :mod:`.connection`
(the tunnel client on the ``tablestore`` SDK's transport), :mod:`.handover` (taking over a crashed run's
tunnel clients), and the wire formats :mod:`.tunnel_pb` (the tunnel service's protobuf messages) and
:mod:`.plainbuffer` (the row codec).

The names below load on first use, so importing a wire-format module (``.plainbuffer``, ``.tunnel_pb``)
loads neither the backend, its client, pydantic nor the ``tablestore`` SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backends.tablestore.backend import TablestoreBackend
    from cdc.backends.tablestore.connection import TunnelClient
    from cdc.backends.tablestore.options import TablestoreOptions

__all__ = ["TablestoreBackend", "TablestoreOptions", "TunnelClient"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "TablestoreBackend": ".backend",
        "TablestoreOptions": ".options",
        "TunnelClient": ".connection",
    },
)
