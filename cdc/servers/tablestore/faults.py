"""Injected failures for tests (admin ``fault``); kept in memory only, a restart clears them."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from .errors import OTSError

log = logging.getLogger(__name__)

KINDS = ("unavailable", "drop", "delay", "clear")


@dataclass
class Faults:
    """The fault in force. ``path_prefix`` limits it to some calls; ``remaining`` -1 means until cleared."""

    kind: str = ""
    remaining: int = 0
    seconds: float = 0.0
    path_prefix: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, kind: str, count: int = -1, seconds: float = 0.0, path_prefix: str = "") -> dict[str, Any]:
        """Fault the next ``count`` requests whose path starts with ``path_prefix``.

        Kinds: ``unavailable`` (503 ``OTSServerUnavailable`` / ``OTSTunnelServerUnavailable``), ``drop``
        (close the connection without answering), ``delay`` (sleep ``seconds``, then serve), ``clear``.
        """
        if kind not in KINDS:
            raise OTSError(
                "OTSParameterInvalid", f"fault kind {kind!r}: expected unavailable, drop, delay or clear", 400
            )
        with self.lock:
            self.kind = "" if kind == "clear" else kind
            self.remaining = 0 if kind == "clear" else count
            self.seconds = seconds
            self.path_prefix = path_prefix
        log.info("fault set: %s count=%s seconds=%s prefix=%r", kind, count, seconds, path_prefix)
        return {"kind": kind, "count": count}

    def take(self, path: str) -> tuple[str, float] | None:
        """The fault to apply to a request of ``path`` (counting it), or None."""
        with self.lock:
            if not self.kind or self.remaining == 0 or not path.startswith(self.path_prefix):
                return None
            if self.remaining > 0:
                self.remaining -= 1
            return self.kind, self.seconds
