"""``backend=local``: the on-disk change log, for tests, demos and single-machine pipelines.

Files: :mod:`.options`, :mod:`.backend` (driver side), :mod:`.reader` (executor side), :mod:`.log` (the
log's on-disk format, appends, splits, merges and snapshots), :mod:`.cli` (``cdc local``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backends.local.backend import LocalBackend
    from cdc.backends.local.log import LocalLog
    from cdc.backends.local.options import LocalOptions
    from cdc.backends.local.reader import LocalRangeReader

__all__ = ["LocalBackend", "LocalLog", "LocalOptions", "LocalRangeReader"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "LocalBackend": ".backend",
        "LocalLog": ".log",
        "LocalOptions": ".options",
        "LocalRangeReader": ".reader",
    },
)
