"""``backend=postgres``: PostgreSQL logical replication (``pgoutput``) as a change log.

Files: :mod:`.options`, :mod:`.backend` (driver side; the design), :mod:`.reader` (executor side),
:mod:`.connection` (slot, publication, peeking), :mod:`.pgoutput` (the message decoder), :mod:`.catalog` (tables
and types), :mod:`.records` (typed and JSON layouts), :mod:`.positions`, :mod:`.snapshot` (the exported
snapshot, materialised), :mod:`.errors`, :mod:`.cli` (``cdc postgres``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backends.postgres.backend import PostgresBackend
    from cdc.backends.postgres.options import PostgresOptions
    from cdc.backends.postgres.reader import PostgresRangeReader

__all__ = ["PostgresBackend", "PostgresOptions", "PostgresRangeReader"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PostgresBackend": ".backend",
        "PostgresOptions": ".options",
        "PostgresRangeReader": ".reader",
    },
)
