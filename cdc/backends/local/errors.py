"""Errors of the local change log. Both are terminal: retrying cannot repair a damaged or foreign log."""

from __future__ import annotations

from cdc.errors import TerminalError


class CorruptLogError(TerminalError):
    """The log's files do not hold what its manifest and segment names claim (a segment missing, overlapping,
    with other rows or damaged bytes); ``file`` names the offending file, ``channel`` its channel if any.

    Deliberately not a :class:`~cdc.errors.DataLossError`: ``failOnDataLoss=false`` skips what retention
    removed, but it must never skip over damage silently.
    """

    def __init__(self, message: str, file: str | None = None, channel: str | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.channel = channel


class LogFormatError(TerminalError, ValueError):
    """The directory holds a log of a format version this release does not read; ``version`` names it."""

    def __init__(self, message: str, version: object = None) -> None:
        super().__init__(message)
        self.version = version
