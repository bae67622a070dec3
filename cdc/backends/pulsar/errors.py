"""Errors of ``backend=pulsar``, under the project's root (:class:`~cdc.errors.CdcError`)."""

from __future__ import annotations

from cdc.errors import TerminalError, TransientError


class SchemaMismatchError(TerminalError):
    """A topic of the query has a registry schema other than the one the query decodes with."""


class StallError(TransientError):
    """A read got no message for ``pollTimeoutMs`` before reaching its planned end."""


class SequenceRangeError(TerminalError, ValueError):
    """A message id outside what a change record's ``_seq`` can encode (see ``records.sequence_of``)."""


class MessageTooLargeError(TerminalError):
    """A row's payload exceeds the broker's message size limit (``maxMessageSize``)."""


class SendError(TransientError):
    """The broker did not accept a message."""


class HeadUnavailableError(TransientError):
    """The broker did not answer a partition's last message id this planning round (it may be restarting)."""
