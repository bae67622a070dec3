"""Errors of ``backend=postgres``. A table whose columns changed under a typed query raises the shared
:class:`cdc.errors.SchemaChangedError`."""

from __future__ import annotations

from cdc.errors import TerminalError, TransientError
from cdc.lazy import lazy_exports


class NoPrimaryKeyError(TerminalError):
    """A table to read has no primary key; ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


class ReplicationCapacityError(TerminalError):
    """The server has no replication slot or WAL sender to spare for a chunked snapshot's cuts; the message
    names the setting (``max_replication_slots``, ``max_wal_senders``) and what to do."""


class CutLostError(TransientError):
    """A chunked snapshot's cut is no longer held (the driver that held it is gone, or the server restarted):
    the task fails and Spark retries it; a replayed batch gets a new cut from the restarted driver."""


class ReplicaIdentityError(TerminalError):
    """A table's replica identity is an index other than its primary key: its old rows are logged by columns
    the records are not keyed by. ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


# Moved to cdc.errors (one class for every backend); the old name warns for one release.
__getattr__, __dir__ = lazy_exports(__name__, {}, moved={"SchemaChangedError": "cdc.errors"})
