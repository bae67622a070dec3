"""Every error cdc-tunnel raises derives from :class:`CdcError`.

Errors cross the driver/executor boundary inside Spark, so each one pickles: their constructors take
only the message (plus plain, picklable fields restored through ``__reduce__``).
"""

from __future__ import annotations

from typing import Any


class CdcError(Exception):
    """Root of every cdc-tunnel error."""


class TransientError(CdcError):
    """A failure that may succeed when retried (a server unavailable, a dropped connection)."""


class TerminalError(CdcError):
    """A failure that retrying cannot fix (bad configuration, corrupt data, lost data)."""


class OptionError(TerminalError, ValueError):
    """An option is unknown, missing or invalid; the message names it and what is accepted."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.option))


class DataLossError(TerminalError):
    """A position the query needs is no longer held by the backend (retention, truncation)."""

    def __init__(self, message: str, channel: str | None = None) -> None:
        super().__init__(message)
        self.channel = channel

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.channel))


class PositionError(TerminalError, ValueError):
    """A position is malformed or lies outside its channel."""


class MalformedRecordError(TerminalError):
    """A record cannot be decoded; raised when ``onMalformed`` is ``fail``."""


class BackendUnavailableError(TransientError):
    """The backend could not be reached after retries."""
