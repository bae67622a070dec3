"""Deprecated: moved to :mod:`cdc.formats.debezium` (Debezium envelopes are read by more than one backend). This alias warns and is removed in the next release."""

from cdc.lazy import moved_module

__getattr__, __dir__ = moved_module(
    __name__,
    "cdc.formats.debezium",
    elsewhere={"SchemaChangedError": "cdc.errors", "TruncateError": "cdc.errors"},  # one class for every backend
)
