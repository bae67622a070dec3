"""The life cycle every stand-in server run as a child process shares: stop, kill, restart, ``with``."""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

import click

from cdc.errors import CdcError

if TYPE_CHECKING:
    from rich.status import Status

log = logging.getLogger(__name__)


def die_with_parent() -> None:
    """In the child before exec: SIGTERM the server when the process that started it dies (Linux), so a
    killed test run leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def starting(what: str) -> Status:
    """A spinner on the terminal while a server starts (a JVM: seconds to tens of seconds on a busy machine);
    nothing when stderr is piped. For the ``cdc server`` commands."""
    from rich.console import Console

    return Console(stderr=True).status(f"starting {what} (waiting until it serves)...")


class ServerProcess(ABC):
    """A server in a child process with its data in ``data_dir`` (removed on :meth:`stop` when we made it).

    Subclasses set ``data_dir``, ``_owns_dir`` and ``_process`` (the running child, or ``None``) and
    implement :meth:`start`, which must start on the same ports and data as before when it ran already.
    """

    data_dir: Path
    _owns_dir: bool
    _process: subprocess.Popen[bytes] | None
    stop_timeout: float = 10.0
    """Seconds a graceful stop (SIGTERM) may take before the server is killed."""

    @abstractmethod
    def start(self) -> Self:
        """Start the server and wait until it serves."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL the server (a crash); its data stays for :meth:`start`/:meth:`restart`."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.send_signal(signal.SIGKILL)
            self._process.wait()
            self._process = None

    def stop(self, cleanup: bool | None = None) -> None:
        """Stop the server gracefully (SIGTERM, SIGKILL after ``stop_timeout``); remove its data when it lives
        in a directory we created (or as ``cleanup`` says)."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s (pid %s) ignored SIGTERM for %s s: killing it", type(self).__name__,
                                self._process.pid, self.stop_timeout)
                    self._process.kill()
                    self._process.wait()
            self._process = None
        if cleanup if cleanup is not None else self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self, *, hard: bool = False) -> Self:
        """Stop (or kill, with ``hard``) and start again on the same ports and data."""
        if hard:
            self.kill()
        else:
            self.stop(cleanup=False)
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ---------------------------------------------------------------------- the `cdc server` commands
def refuse_taken(port: int, option: str) -> None:
    """A given port another process listens on is named now, not in a JVM stack trace after start-up."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to a server
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise click.BadParameter(
                f"port {port} on 127.0.0.1 is taken ({exc.strerror}); 0 picks a free port", param_hint=option
            ) from None


def serve(broker: ServerProcess, name: str, ready: Callable[[], str]) -> None:
    """Start ``broker`` with a spinner, print ``ready()``, run until SIGINT/SIGTERM, stop it cleanly."""
    from rich.console import Console

    # SIGTERM and a closed terminal stop the broker too (finally below), which also removes a temporary data dir.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda *_: sys.exit(0))
    keep_data = False  # a broker that failed keeps its directory, logs included, even a temporary one
    try:
        with starting(name):
            broker.start()
        click.echo(ready(), err=True)
        while broker.running:
            time.sleep(0.5)
        keep_data = True
        raise click.ClickException(f"{name} exited on its own; its data and logs are kept in {broker.data_dir}")
    except KeyboardInterrupt:
        pass
    except CdcError as exc:  # the server's own start-up error: it names the cause
        keep_data = True
        raise click.ClickException(str(exc)) from None
    finally:
        with Console(stderr=True).status(f"stopping {name}..."):
            broker.stop(cleanup=False if keep_data else None)
        click.echo(f"{name} stopped", err=True)
