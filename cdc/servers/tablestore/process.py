"""The local server as a child process (``python -m cdc.servers.tablestore``), for kill/restart tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cdc.servers.ports import free_port

from .admin import AdminClient
from .limits import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS


class TablestoreProcess:
    """``python -m cdc.servers.tablestore`` as a child process on a fixed free port (kept across restarts).

    The secret reaches the child through its environment, never its command line.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        instance: str = "local",
        access_key_id: str = "local-access-key-id",
        access_key_secret: str = "local-access-key-secret",
        max_records_per_read: int = 1000,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        log_file: Path | str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.instance = instance
        self.access_key_id = access_key_id
        self.access_key_secret = access_key_secret
        self.max_records_per_read = max_records_per_read
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.log_file = Path(log_file) if log_file else self.data_dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.admin = AdminClient(self.endpoint, access_key_secret)

    def __repr__(self) -> str:
        return f"TablestoreProcess(endpoint={self.endpoint!r}, instance={self.instance!r})"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> TablestoreProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CDC_TABLESTORE_ACCESS_KEY_SECRET=self.access_key_secret)
        cmd = [
            sys.executable,
            "-m",
            "cdc.servers.tablestore",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--instance",
            self.instance,
            "--access-key-id",
            self.access_key_id,
            "--max-records-per-read",
            str(self.max_records_per_read),
            "--idle-timeout",
            str(self.idle_timeout),
            "--max-connections",
            str(self.max_connections),
        ]
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"local Tablestore exited with {self.process.returncode}; see {self.log_file}"
                )
            if self.admin.healthy():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"local Tablestore did not come up within {timeout}s; see {self.log_file}")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Crash stop (SIGKILL): what a restart must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, *, crash: bool = True) -> TablestoreProcess:
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    # ------------------------------------------------------------------ conveniences for tests and demos
    def split(
        self, table: str, shard_id: str | None = None, split_key: list[Any] | None = None
    ) -> dict[str, Any]:
        return self.admin.split(table, shard_id, split_key)

    def merge(self, table: str, shard_ids: list[str] | None = None) -> dict[str, Any]:
        return self.admin.merge(table, shard_ids)

    def shards(self, table: str) -> list[dict[str, Any]]:
        return self.admin.shards(table)

    def fault(self, kind: str, count: int = -1, seconds: float = 0.0, path_prefix: str = "") -> None:
        self.admin.fault(kind, count, seconds, path_prefix)

    def clear_faults(self) -> None:
        self.admin.clear_faults()

    def expire_client(self, client_id: str) -> None:
        self.admin.expire_client(client_id)

    def trim(self, table: str, before_ms: int | None = None) -> dict[str, int]:
        return self.admin.trim(table, before_ms)

    def ots_client(self, **kwargs: Any) -> Any:
        """A real ``tablestore.OTSClient`` for this server (no retries unless ``retry_policy`` is given)."""
        from tablestore import OTSClient
        from tablestore.retry import NoRetryPolicy

        kwargs.setdefault("retry_policy", NoRetryPolicy())
        return OTSClient(self.endpoint, self.access_key_id, self.access_key_secret, self.instance, **kwargs)

    def __enter__(self) -> TablestoreProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
