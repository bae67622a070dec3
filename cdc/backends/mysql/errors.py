"""Errors of ``backend=mysql``. A table whose columns changed under a query that cannot follow the change raises
the shared :class:`cdc.errors.SchemaChangedError`."""

from __future__ import annotations

from cdc.errors import TerminalError


class NoPrimaryKeyError(TerminalError):
    """A table to read has no primary key; ``table`` names it."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


class ServerSettingError(TerminalError):
    """The server's binary log is set up in a way the backend cannot read changes from (``binlog_format`` not
    ``ROW``, ``binlog_row_image`` not ``FULL``, ...); ``setting`` names the setting, the message its fix. Raised
    when the backend opens, and when the binary log shows a session that overrode the setting."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


class MissingPrivilegeError(TerminalError):
    """The user lacks a privilege the backend needs; ``privilege`` names it, the message the ``GRANT``."""

    def __init__(self, message: str, privilege: str) -> None:
        super().__init__(message)
        self.privilege = privilege


class UnsupportedTransactionError(TerminalError):
    """The binary log holds a transaction of a kind the backend cannot deliver exactly (an XA transaction,
    whose prepared changes may still be rolled back); the message names it by position and GTID."""
