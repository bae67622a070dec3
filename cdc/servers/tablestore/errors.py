"""Service errors: what a handler raises becomes the protobuf ``Error`` of the response."""

from __future__ import annotations


class OTSError(Exception):
    """A service error: ``code`` is the Tablestore error code, ``status`` the HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


def param_invalid(message: str) -> OTSError:
    """``OTSParameterInvalid`` (HTTP 400), the service's answer to a request it cannot accept."""
    return OTSError("OTSParameterInvalid", message, 400)


def not_exist(message: str) -> OTSError:
    """``OTSObjectNotExist`` (HTTP 404)."""
    return OTSError("OTSObjectNotExist", message, 404)
