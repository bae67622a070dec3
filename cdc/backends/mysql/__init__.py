"""``backend=mysql``: MySQL and MariaDB binary logs (row-based replication) as a change log.

Files: :mod:`.options`, :mod:`.backend` (driver side; the design), :mod:`.reader` (executor side),
:mod:`.connection` (queries, checks, the binary log stream), :mod:`.binlog` (events into transactions),
:mod:`.records` (row images into typed and JSON layouts), :mod:`.catalog` (tables and the type mapping),
:mod:`.positions` (file and offset, GTIDs), :mod:`.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backends.mysql.backend import MySQLBackend
    from cdc.backends.mysql.options import MySQLOptions
    from cdc.backends.mysql.reader import MySQLRangeReader

__all__ = ["MySQLBackend", "MySQLOptions", "MySQLRangeReader"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "MySQLBackend": ".backend",
        "MySQLOptions": ".options",
        "MySQLRangeReader": ".reader",
    },
)
