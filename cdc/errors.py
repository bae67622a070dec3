"""Every error cdc-tunnel raises derives from :class:`CdcError`.

Errors cross the driver/executor boundary inside Spark, so every one pickles, with every attribute: the
root's ``__reduce__`` rebuilds an error from its class, its ``args`` and its ``__dict__`` without calling
its constructor, so a subclass may take any constructor arguments and set attributes after construction
(``err.channel = ...``) and still arrive whole. Subclasses do not define their own ``__reduce__``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _rebuild(cls: type[CdcError], args: tuple[Any, ...], state: dict[str, Any]) -> CdcError:
    # BaseException.__new__ sets ``args`` and skips ``__init__``: the state is restored exactly as it was,
    # whatever the subclass's constructor would do with those arguments.
    err = cls.__new__(cls, *args)
    err.__dict__.update(state)
    return err


class CdcError(Exception):
    """Root of every cdc-tunnel error."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class TransientError(CdcError):
    """A failure that may succeed when retried (a server unavailable, a dropped connection)."""


class TerminalError(CdcError):
    """A failure that retrying cannot fix (bad configuration, corrupt data, lost data)."""


class OptionError(TerminalError, ValueError):
    """An option is unknown, missing or invalid; the message names it and what is accepted."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class DataLossError(TerminalError):
    """A position the query needs is no longer held by the backend (retention, truncation)."""

    def __init__(self, message: str, channel: str | None = None) -> None:
        super().__init__(message)
        self.channel = channel


class PositionError(TerminalError, ValueError):
    """A position is malformed or lies outside its channel."""


class OffsetError(TerminalError, ValueError):
    """An offset (from Spark's offset log or a checkpoint) is not a cdc offset."""


class SchemaError(TerminalError, ValueError):
    """A table's schema does not fit the change model: an unsupported type, a key column missing or clashing
    with a metadata column. A :class:`ValueError` too, as the change model raised before."""


class SchemaChangedError(TerminalError):
    """A table's columns changed while a query that decodes them with the schema it started with read it:
    restart the query to take the new schema (Auto Loader's convention). ``table`` names the table when the
    source tells it."""

    def __init__(self, message: str, table: str | None = None) -> None:
        super().__init__(message)
        self.table = table


class TruncateError(TerminalError):
    """A source emptied a table (a Debezium truncate event): not a row change the query can apply unless it is
    configured to deliver truncates (``debezium.truncate=apply``)."""


class MalformedRecordError(TerminalError):
    """A record cannot be decoded; raised when ``onMalformed`` is ``fail``."""


class BackendUnavailableError(TransientError):
    """The backend could not be reached after retries."""


class MissingExtraError(TerminalError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the extra to install."""

    def __init__(self, message: str, extra: str | None = None, module: str | None = None) -> None:
        super().__init__(message)
        self.extra = extra
        self.missing_module = module


_OWN_PACKAGES = frozenset({"cdc", "sinks", "udfs"})


@contextmanager
def requires_extra(extra: str, feature: str) -> Iterator[None]:
    """Imports inside the block that fail for want of a module raise :class:`MissingExtraError` naming
    ``pip install 'cdc-tunnel[<extra>]'`` instead of a bare ``ModuleNotFoundError``::

        with requires_extra("pulsar", "backend 'pulsar'"):
            import pulsar
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = exc.name or "a module"
        if missing.partition(".")[0] in _OWN_PACKAGES:
            raise  # a module of this project: a broken installation, not a missing extra
        raise MissingExtraError(
            f"{feature} needs {missing!r}, which is not installed: pip install 'cdc-tunnel[{extra}]'",
            extra,
            exc.name,
        ) from exc
