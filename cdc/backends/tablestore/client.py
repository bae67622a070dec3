"""Deprecated: moved to :mod:`cdc.backends.tablestore.connection` (every backend names its connection role so). This alias warns and is
removed in the next release."""

from cdc.lazy import moved_module

__getattr__, __dir__ = moved_module(__name__, "cdc.backends.tablestore.connection")
