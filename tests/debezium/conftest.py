"""Fixtures of the real-Debezium tests: a PostgreSQL server with logical decoding, and Debezium's embedded
engine run against it once per module.

The PostgreSQL server is started here from the Debian/Ubuntu binaries (/usr/lib/postgresql/<version>/bin):
the project's shared PostgreSQL fixture (issue 14) is being built in parallel; this one should give way to it
when it lands."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdc.servers.ports import free_port


@dataclass(frozen=True)
class Postgres:
    port: int

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True)


def _bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        pytest.fail("PostgreSQL server binaries are required (Debian/Ubuntu: apt-get install -y postgresql)")
    return Path(initdb).parent


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """PostgreSQL with wal_level=logical on a free loopback port (trust authentication, user postgres)."""
    # Not under pytest's temporary folder: as root, that is private to root, and PostgreSQL refuses to run as
    # root, so there it runs as the postgres system user the package creates, in a folder that user owns.
    bindir, root = _bin(), Path(tempfile.mkdtemp(prefix="cdc-postgres-"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    _run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"])
    opts = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_replication_slots=10 "
            "-c max_wal_senders=10 -c fsync=off")
    _run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", opts, "-w", "start"])
    try:
        server = Postgres(port)
        deadline = time.monotonic() + 30
        while True:
            try:
                server.connect().close()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield server
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}): {done.stdout[-1500:]} {done.stderr[-1500:]}")
