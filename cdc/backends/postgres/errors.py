"""Errors of ``backend=postgres``. A table whose columns changed under a typed query raises the shared
:class:`cdc.errors.SchemaChangedError`."""

from __future__ import annotations

from cdc.errors import TerminalError
from cdc.lazy import lazy_exports


class NoPrimaryKeyError(TerminalError):
    """A table to read has no primary key; ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


class ReplicaIdentityError(TerminalError):
    """A table's replica identity is an index other than its primary key: its old rows are logged by columns
    the records are not keyed by. ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


# Moved to cdc.errors (one class for every backend); the old name warns for one release.
__getattr__, __dir__ = lazy_exports(__name__, {}, moved={"SchemaChangedError": "cdc.errors"})
