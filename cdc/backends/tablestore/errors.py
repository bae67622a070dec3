"""Errors of ``backend=tablestore``: one class per Tablestore Tunnel service error code that callers treat
apart, and :class:`PlainBufferError` for a row that does not decode.

Every service error derives from :class:`TablestoreError` and from either :class:`~cdc.errors.TransientError`
(retrying may help) or :class:`~cdc.errors.TerminalError`; all pickle (they cross the Spark executor
boundary) and none carries a credential.
"""

from __future__ import annotations

from cdc.errors import CdcError, DataLossError, MalformedRecordError, TerminalError, TransientError


class TablestoreError(CdcError):
    """A tunnel call failed; ``code`` is the service's error code (``OTS...``) or a client-side one."""

    def __init__(self, message: str, code: str = "", http_status: int = 0, request_id: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.request_id = request_id


class TablestoreServiceError(TablestoreError, TerminalError):
    """The service refused the call with a code not covered by a more specific class."""


class TablestoreTransientError(TablestoreError, TransientError):
    """The service is overloaded, unavailable or timed out, or the connection dropped; retried."""


class TunnelServerUnavailableError(TablestoreTransientError):
    """``OTSTunnelServerUnavailable`` (and the other ``...Unavailable``/``ServerBusy`` codes)."""


class ConnectionFailedError(TablestoreTransientError):
    """The HTTP request did not complete (refused, reset, timed out)."""


class ResourceGoneError(TablestoreError, TransientError):
    """``OTSResourceGone``: the tunnel client expired; reconnect (the same call will not succeed)."""


class ParameterInvalidError(TablestoreServiceError):
    """``OTSParameterInvalid``: a request field is wrong (an unknown token, channel or tunnel)."""


class SequenceNumberMismatchError(TablestoreServiceError):
    """``OTSSequenceNumberNotMatch``: a checkpoint's sequence number is not the last one plus one."""


class TunnelExpiredError(TablestoreServiceError):
    """``OTSTunnelExpired``: the tunnel's data has expired on the service."""


class TunnelExistError(TablestoreServiceError):
    """``OTSTunnelExist``: a tunnel of that name already exists on the table."""


class PermissionDeniedError(TablestoreServiceError):
    """``OTSPermissionDenied``: the credentials lack a permission the call needs."""


class AuthFailedError(TablestoreServiceError):
    """``OTSAuthFailed``: the access key is unknown or the signature is wrong."""


class ObjectNotExistError(TablestoreServiceError):
    """``OTSObjectNotExist``: the table or tunnel does not exist."""


class ProtocolError(TablestoreError, TerminalError):
    """A response failed the client's checks (missing headers, bad MD5 or signature, undecodable body)."""


class TrimmedDataError(TablestoreError, DataLossError):
    """``OTSTrimmedDataAccess``: a token points at records the service no longer holds.

    The service reports it as HTTP 400 with code ``OTSTunnelServerUnavailable`` and a message that
    starts with ``OTSTrimmedDataAccess`` (its error-code reference, "HTTP 400 errors: stream": "Stream logs
    have expired and data has not been pulled for a long period", not retryable); :func:`error_for`
    recognises both that form and the bare code.
    """

    def __init__(self, message: str, code: str = "", http_status: int = 0, request_id: str = "") -> None:
        TablestoreError.__init__(self, message, code, http_status, request_id)
        self.channel: str | None = None


class PlainBufferError(MalformedRecordError, ValueError):
    """A PlainBuffer payload is malformed (bad header, truncated, unknown type, checksum mismatch)."""


_BY_CODE: dict[str, type[TablestoreError]] = {
    "OTSTunnelServerUnavailable": TunnelServerUnavailableError,
    "OTSServerUnavailable": TunnelServerUnavailableError,
    "OTSServerBusy": TunnelServerUnavailableError,
    "OTSPartitionUnavailable": TunnelServerUnavailableError,
    "OTSTimeout": TunnelServerUnavailableError,
    "OTSInternalServerError": TunnelServerUnavailableError,
    "OTSOperationThrottled": TunnelServerUnavailableError,
    "OTSResourceGone": ResourceGoneError,
    "OTSParameterInvalid": ParameterInvalidError,
    "OTSSequenceNumberNotMatch": SequenceNumberMismatchError,
    "OTSTunnelExpired": TunnelExpiredError,
    "OTSTunnelExist": TunnelExistError,
    "OTSPermissionDenied": PermissionDeniedError,
    "OTSAuthFailed": AuthFailedError,
    "OTSObjectNotExist": ObjectNotExistError,
    "OTSTrimmedDataAccess": TrimmedDataError,
}

TRIMMED = "OTSTrimmedDataAccess"

RETRYABLE: tuple[type[BaseException], ...] = (TablestoreTransientError,)
"""What the client retries on its own (``ResourceGoneError`` is transient but needs a reconnect first)."""


def error_for(code: str, message: str, http_status: int, request_id: str = "") -> TablestoreError:
    """The typed error for a service error code; unknown codes are transient on HTTP 5xx, else terminal."""
    cls = _BY_CODE.get(code)
    if code == "OTSTunnelServerUnavailable" and TRIMMED in message:
        cls = TrimmedDataError  # not transient: retrying never brings expired records back
    if cls is None:
        cls = TablestoreTransientError if http_status >= 500 else TablestoreServiceError
    text = f"{code}: {message} (HTTP {http_status}{', request ' + request_id if request_id else ''})"
    return cls(text, code, http_status, request_id)


def tunnel_expired(label: str, cause: Exception | str) -> TunnelExpiredError:
    """The error for a tunnel the service expired: it names the tunnel (``label``) and the way out."""
    return TunnelExpiredError(
        f"{label} has expired on the service ({cause}): its incremental log outlived the stream retention "
        "before it was consumed (for a BaseAndStream tunnel: the base data took longer than the retention), "
        "so it can deliver no more changes. Nothing can be skipped to; delete it and create a new one "
        "(createTunnelIfMissing=true), and start the query again with a new checkpoint location.",
        "OTSTunnelExpired",
    )
