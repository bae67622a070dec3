"""``backend=postgres``: PostgreSQL logical replication (``pgoutput``) as a change log.

Files: :mod:`.options`, :mod:`.backend` (driver side; the design), :mod:`.reader` (executor side),
:mod:`.slot` (slot, publication, peeking), :mod:`.pgoutput` (the message decoder), :mod:`.catalog` (tables
and types), :mod:`.records` (typed and JSON layouts), :mod:`.positions`, :mod:`.snapshot` (the exported
snapshot, materialised), :mod:`.errors`, :mod:`.cli` (``cdc postgres``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc.backends.postgres.backend import PostgresBackend
    from cdc.backends.postgres.options import PostgresOptions
    from cdc.backends.postgres.reader import PostgresRangeReader

__all__ = ["PostgresBackend", "PostgresOptions", "PostgresRangeReader"]

_LAZY = {
    "PostgresBackend": "cdc.backends.postgres.backend",
    "PostgresOptions": "cdc.backends.postgres.options",
    "PostgresRangeReader": "cdc.backends.postgres.reader",
}


def __getattr__(name: str) -> Any:
    """Names are imported on first use (psycopg loads only when the backend is used)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
