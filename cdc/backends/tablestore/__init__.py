"""``backend=tablestore``: Alibaba Tablestore Tunnel (BaseData, Stream, BaseAndStream) as a change log.

Files: :mod:`.tunnel_pb` (the tunnel service's protobuf messages), :mod:`.client` (the tunnel client on
the ``tablestore`` SDK's transport), :mod:`.errors` (typed service errors), :mod:`.plainbuffer` (the row
codec), :mod:`.options`, :mod:`.backend` (positions, lineage, deterministic batches).
"""

from cdc.backends.tablestore.backend import TablestoreBackend
from cdc.backends.tablestore.client import TunnelClient
from cdc.backends.tablestore.options import TablestoreOptions

__all__ = ["TablestoreBackend", "TablestoreOptions", "TunnelClient"]
