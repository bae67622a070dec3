import tempfile

import pyarrow as pa

from cdc.backends.local import LocalLog

path = tempfile.mkdtemp(prefix="orders-log-")
log = LocalLog.create(path, [("order_id", pa.int64()), ("amount", pa.float64())], keys=["order_id"], channels=2)
log.append([{"order_id": 1, "amount": 9.5, "_op": "insert"},     # routed by key hash
            {"order_id": 2, "amount": 20.0, "_op": "insert"}])
children = log.split("c0")            # finish c0, hand its key range to two children
child = log.merge(children)           # finish adjacent channels, hand their range to one child
log.append([{"order_id": 1, "_op": "delete"}])
print("channels:", ", ".join(ch.id + (" (finished)" if ch.closed else "") for ch in log.channels()))
print("changes:", log.read_all().num_rows)
