"""A MariaDB server in a child process, on 127.0.0.1, with the binary log set up for change capture.

The binaries are the machine's own, Debian's ``mariadb-server`` package (``mariadb-install-db`` and
``mariadbd``; MySQL's own server is not packaged there). The Debian service is never used: the server
here has its own data directory, a free port, a socket in that directory and ``--no-defaults`` (so no
``/etc/mysql`` setting applies). ::

    with MariaDBServer() as db:
        conn = pymysql.connect(**db.connect_args())

The binary log is what ``backend=mysql`` needs: ``binlog_format=ROW``, ``binlog_row_image=FULL``,
``binlog_row_metadata=FULL``, GTIDs (MariaDB's domain-server-sequence, always on), ``server_id=1``. For
tests the binary log and InnoDB skip fsync (``durable=True`` keeps ``sync_binlog=1`` and
``innodb_flush_log_at_trx_commit=1``). It dies with the process that started it, :meth:`kill` is a
``kill -9`` and :meth:`restart` brings the same data back (crash recovery after a kill). MariaDB runs as
root only when told to: started by root, the server runs as the ``mysql`` user (``--user``) and its data
directory is handed to that user. The privileges are dropped before ``mariadbd`` runs, not by its own
``--user`` (which ``mariadb-install-db`` gets): Linux clears a process's parent-death signal when its user
changes, and the server must die with the test run that started it.

A superuser ``cdc`` (no password, from 127.0.0.1) is created at first start.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Self

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from cdc.errors import CdcError, requires_extra
from cdc.servers.ports import free_port
from cdc.servers.process import ServerProcess

log = logging.getLogger(__name__)

SUPERUSER = "cdc"

INSTALL_HINT = (
    "MariaDB's server binaries (mariadb-install-db, mariadbd) were not found: install them with "
    "`sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y mariadb-server` "
    "(Debian/Ubuntu; the package's own service is not needed) or `brew install mariadb` (macOS)"
)


class MariaDBServerError(CdcError, RuntimeError):
    """The MariaDB server could not be found, initialised or started."""


def mariadb_binaries() -> tuple[Path, Path]:
    """``mariadb-install-db`` and ``mariadbd``: on ``PATH``, else where Debian puts them."""
    found = []
    for name, fallbacks in (("mariadb-install-db", ("/usr/bin",)), ("mariadbd", ("/usr/sbin", "/usr/libexec"))):
        path = shutil.which(name) or next(
            (f"{d}/{name}" for d in fallbacks if os.access(f"{d}/{name}", os.X_OK)), None
        )
        if path is None:
            raise MariaDBServerError(INSTALL_HINT)
        found.append(Path(path))
    return found[0], found[1]


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root (mariadbd refuses root unless told), else None."""
    if os.geteuid() != 0:
        return None
    for name in ("mysql", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise MariaDBServerError("running as root and no 'mysql' or 'nobody' user to run MariaDB as")


def _child_setup(user: pwd.struct_passwd | None) -> None:
    """In the child before exec: drop root, then ask for SIGKILL when the parent dies (set last: Linux clears
    it when the user changes). SIGKILL, not SIGTERM: a clean shutdown takes seconds and nothing waits for it."""
    if user is not None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    if sys.platform.startswith("linux"):  # ctypes is imported up front: root's modules may be unreadable now
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class MariaDBServer(ServerProcess):
    """A MariaDB server of our own. Parameters: ``data_dir`` (default: a fresh temporary directory, removed on
    :meth:`stop`), ``port`` (default: a free one, kept across restarts), ``durable`` (fsync the binary log and
    InnoDB's log at every commit), ``settings`` (extra server options, ``name: value``, as ``--name=value``)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        durable: bool = False,
        settings: dict[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.install_db, self.mariadbd = mariadb_binaries()
        self._user = _server_user()
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="cdc-mariadb-"))
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.durable = durable
        self.settings = dict(settings or {})
        self.start_timeout = start_timeout
        self._process = None
        self.stop_timeout = 60.0

    @property
    def tmpdir(self) -> Path:
        return self.data_dir / "tmp"

    @property
    def datadir(self) -> Path:
        return self.data_dir / "data"

    @property
    def socket(self) -> Path:
        return self.data_dir / "mysqld.sock"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "mariadbd.log"

    def dsn(self, database: str = "", user: str = SUPERUSER) -> str:
        """A ``mysql://`` URI of the server (no password: the superuser has none)."""
        return f"mysql://{user}@{self.host}:{self.port}/{database}"

    def connect_args(self, database: str | None = None, user: str = SUPERUSER) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect``."""
        args: dict[str, Any] = {"host": self.host, "port": self.port, "user": user, "autocommit": True,
                                "charset": "utf8mb4"}
        if database:
            args["database"] = database
        return args

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            for p in [path, *path.rglob("*")]:
                os.chown(p, self._user.pw_uid, self._user.pw_gid)

    def _options(self) -> list[str]:
        options = {
            "datadir": str(self.datadir),
            "tmpdir": str(self.tmpdir),
            "port": str(self.port),
            "bind-address": self.host,
            "socket": str(self.socket),
            "pid-file": str(self.data_dir / "mariadbd.pid"),
            "log-error": str(self.log_path),
            "server-id": "1",
            "log-bin": "binlog",
            "binlog-format": "ROW",
            "binlog-row-image": "FULL",
            "binlog-row-metadata": "FULL",
            "character-set-server": "utf8mb4",
            "collation-server": "utf8mb4_unicode_ci",
            "skip-name-resolve": "1",
            "max-connections": "300",
            # A small server: a test machine runs several databases and JVMs at once.
            "innodb-buffer-pool-size": "64M",
            "innodb-log-file-size": "64M",
            "performance-schema": "OFF",
            "sync-binlog": "1" if self.durable else "0",
            "innodb-flush-log-at-trx-commit": "1" if self.durable else "2",
            "innodb-doublewrite": "1" if self.durable else "0",
            **self.settings,
        }
        return [f"--{k}={v}" for k, v in options.items()]

    def _install(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Its own temporary directory (passed through to the bootstrap server): two servers installing at once
        # in the shared /tmp failed now and then ("Could not remove temporary table '/tmp/#sql-temptable-...'").
        cmd = [str(self.install_db), "--no-defaults", f"--datadir={self.datadir}", f"--tmpdir={self.tmpdir}",
               "--skip-test-db", "--auth-root-authentication-method=normal", "--skip-name-resolve"]
        if self._user is not None:
            cmd.append(f"--user={self._user.pw_name}")
        self._chown(self.data_dir)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.start_timeout)
        if done.returncode != 0:
            raise MariaDBServerError(
                f"mariadb-install-db failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-2000:]}"
            )
        self._chown(self.data_dir)

    def start(self) -> Self:
        if self.running:
            return self
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        first = not (self.datadir / "mysql").exists()
        if first:
            self._install()
        self._chown(self.tmpdir)
        with open(self.data_dir / "mariadbd.out", "ab") as out:
            self._process = subprocess.Popen(
                [str(self.mariadbd), "--no-defaults", *self._options()],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=lambda: _child_setup(self._user),
            )
        self._wait_until_serving()
        if first:
            self._create_superuser()
        log.info("MariaDB on %s:%s (pid %s, data %s)", self.host, self.port, self.pid, self.datadir)
        return self

    def _wait_until_serving(self) -> None:
        with requires_extra("mysql", "the MariaDB server"):
            import pymysql

        process = self._process
        assert process is not None
        try:
            for attempt in Retrying(stop=stop_after_delay(self.start_timeout), wait=wait_fixed(0.1),
                                    retry=retry_if_exception_type(pymysql.err.OperationalError), reraise=True):
                with attempt:
                    if process.poll() is not None:
                        raise MariaDBServerError(f"mariadbd exited at start (code {process.returncode})")
                    pymysql.connect(unix_socket=str(self.socket), user="root", connect_timeout=2).close()
        except MariaDBServerError:
            self._process = None
            raise MariaDBServerError(f"mariadbd exited at start; log tail: {self._log_tail()}") from None
        except pymysql.err.OperationalError as exc:
            self.kill()
            raise MariaDBServerError(
                f"MariaDB did not start within {self.start_timeout} s: {exc}; log tail: {self._log_tail()}"
            ) from exc

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"

    def root(self) -> Any:
        """A connection as root through the server's socket (for set-up: users, grants)."""
        with requires_extra("mysql", "the MariaDB server"):
            import pymysql

        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True, charset="utf8mb4")

    def _create_superuser(self) -> None:
        with self.root() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE USER IF NOT EXISTS '{SUPERUSER}'@'127.0.0.1'")
            cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{SUPERUSER}'@'127.0.0.1' WITH GRANT OPTION")

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropping an old one of that name) and return its DSN."""
        with self.root() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return self.dsn(name)
