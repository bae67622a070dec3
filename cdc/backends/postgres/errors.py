"""Errors of ``backend=postgres``."""

from __future__ import annotations

from cdc.errors import TerminalError


class NoPrimaryKeyError(TerminalError):
    """A table to read has no primary key; ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


class SchemaChangedError(TerminalError):
    """A table's columns changed while a typed (one-table) query read it: restart the query to take the new
    schema (Auto Loader's convention); ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


class ReplicaIdentityError(TerminalError):
    """A table's replica identity is an index other than its primary key: its old rows are logged by columns
    the records are not keyed by. ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table
