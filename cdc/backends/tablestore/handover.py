"""Crash hand-over: recognise the tunnel clients a crashed run left behind, so a restart can shut them down.

After a driver dies (``kill -9``, a lost container), the service keeps its tunnel client alive until
``tunnel.client.timeoutSeconds`` after its last heartbeat. Until then that client still holds its channels:
a restarted query cannot move their checkpoints, so a child channel stays in ``WAIT`` (its parents cannot
be checkpointed ``"finished"``) and a BaseAndStream tunnel cannot leave its base-data stage.

The service's API allows a faster hand-over: a client's id is its ``client_tag`` followed by a random
string (DescribeTunnel's documentation: "the client ID concatenates the hostname of the client and a
random string; the hostname can be customized"), DescribeTunnel names the client holding each channel,
and ``Shutdown(tunnel_id, client_id)`` releases every channel of that client (the Java ``TunnelWorker``
calls it for itself). So every client this backend connects carries a tag naming its process::

    cdc:<query tag>:<host>:<pid namespace>:<pid>:<process start>:

and a backend that connects shuts down the clients holding channels of its tunnel that are *provably
stale*:

* a client of a process on this host (same hostname and the same PID namespace) that no longer runs
  (no such pid, or the pid was reused by a process that started at another time); never one of this very
  process, nor one whose liveness cannot be checked (another host, another PID namespace, a tag it does
  not recognise, e.g. a Java ``TunnelWorker``'s);
* with the option ``tunnel.client.tag`` (a name the user gives the query), any client of another process
  bearing the same tag: Spark runs one instance of a query at a time, so the user's tag makes a client of
  another process a leftover of an earlier run (a driver restarted on another host).

A client shut down by mistake would only lose its channels until its next heartbeat (reads are not tied
to channel ownership); nothing it delivered or committed is affected, since positions live in Spark's
offset log.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

PREFIX = "cdc"
_FIELDS = 6  # cdc, query tag, host, pid namespace, pid, start


def _clean(text: str) -> str:
    return text.replace(":", "_")


@dataclass(frozen=True)
class ProcessId:
    """Who connected a tunnel client: the query tag, and the host / PID namespace / pid / start time."""

    query: str
    host: str
    namespace: str
    pid: int
    start: str

    def tag(self) -> str:
        parts = (PREFIX, _clean(self.query), _clean(self.host), self.namespace, str(self.pid), self.start)
        return ":".join(parts) + ":"

    @classmethod
    def parse(cls, client_id: str) -> ProcessId | None:
        """The identity in a client id made from :meth:`tag`, else None (a client of another kind)."""
        parts = client_id.split(":", _FIELDS)
        if len(parts) <= _FIELDS or parts[0] != PREFIX or not parts[4].isdigit():
            return None
        return cls(parts[1], parts[2], parts[3], int(parts[4]), parts[5])

    def same_process(self, other: ProcessId) -> bool:
        return (self.host, self.namespace, self.pid, self.start) == (
            other.host,
            other.namespace,
            other.pid,
            other.start,
        )


def _namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def this_process(query_tag: str | None) -> ProcessId:
    pid = os.getpid()
    return ProcessId(query_tag or "", socket.gethostname(), _namespace(), pid, _start_time(pid) or "")


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    now = _start_time(pid)
    if now is None:
        return False
    return not (start and now and now != start)  # a reused pid started at another time


def is_stale(client_id: str, me: ProcessId) -> str | None:
    """Why the client ``client_id`` is a leftover ``me`` may shut down, or None if it must be left alone."""
    other = ProcessId.parse(client_id)
    if other is None or other.same_process(me):
        return None
    if me.query and other.query == me.query:
        return f"another process ({other.host}, pid {other.pid}) of the query tagged {me.query!r}"
    if other.host == me.host and other.namespace and other.namespace == me.namespace:
        if not _alive(other.pid, other.start):
            return f"its process (pid {other.pid} on this host) is gone"
    return None
