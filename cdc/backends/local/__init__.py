"""``backend=local``: the on-disk change log, for tests, demos and single-machine pipelines.

Files: :mod:`.options`, :mod:`.backend` (driver side), :mod:`.reader` (executor side), :mod:`.log` (the
log's on-disk format, appends, splits, merges and snapshots), :mod:`.cli` (``cdc local``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc.backends.local.backend import LocalBackend
    from cdc.backends.local.log import LocalLog
    from cdc.backends.local.options import LocalOptions
    from cdc.backends.local.reader import LocalRangeReader

__all__ = ["LocalBackend", "LocalLog", "LocalOptions", "LocalRangeReader"]

_LAZY = {
    "LocalBackend": "cdc.backends.local.backend",
    "LocalLog": "cdc.backends.local.log",
    "LocalOptions": "cdc.backends.local.options",
    "LocalRangeReader": "cdc.backends.local.reader",
}


def __getattr__(name: str) -> Any:
    """Names are imported on first use, so importing one module of the package loads only what it needs."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
