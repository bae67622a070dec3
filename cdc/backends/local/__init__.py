"""The local on-disk change log: for tests, demos and single-machine pipelines."""

from cdc.backends.local.backend import LocalBackend, LocalRangeReader
from cdc.backends.local.log import LocalLog
from cdc.backends.local.options import LocalOptions

__all__ = ["LocalBackend", "LocalLog", "LocalOptions", "LocalRangeReader"]
