"""Options of ``backend=mysql``.

``dsn`` is a ``mysql://user[:password]@host[:port][/database]`` URI; it may hold a password, so it is a
``SecretStr`` (never in reprs, logs, errors or offsets); prefer leaving the password out of it and setting
``MYSQL_PWD`` in the environment of the driver and the executors, as the MySQL and MariaDB clients read it.
``tables`` names the tables whose changes are read, ``database.table``, or ``table`` in the DSN's database.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from urllib.parse import unquote, urlsplit

from pydantic import field_validator, model_validator

from cdc.options import BackendOptions, Field, SecretStr
from cdc.snapshots.planning import DEFAULT_CHUNK_ROWS, DEFAULT_CHUNKS_PER_BATCH

DEFAULT_PORT = 3306


SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect, parsed from the DSN and the TLS options (the password stays out of reprs)."""

    host: str
    port: int
    user: str
    password: SecretStr | None
    database: str | None
    ssl_mode: str = "preferred"
    ssl_ca: str | None = None

    def __repr__(self) -> str:
        return f"Endpoint({self.user}@{self.host}:{self.port}/{self.database or ''})"

    def connect_args(self) -> dict[str, object]:
        """Keyword arguments of ``pymysql.connect`` (utf8mb4, autocommit)."""
        password = self.password.get_secret_value() if self.password is not None else os.environ.get("MYSQL_PWD", "")
        args: dict[str, object] = {"host": self.host, "port": self.port, "user": self.user, "password": password,
                                   "charset": "utf8mb4", "autocommit": True, "connect_timeout": 10}
        if self.database:
            args["database"] = self.database
        if self.ssl_mode == "disabled":
            args["ssl_disabled"] = True
        elif self.ssl_mode != "preferred":  # TLS or nothing; verified against ssl.ca (else the system's CAs)
            verify = self.ssl_mode in ("verify_ca", "verify_identity")
            args["ssl"] = {"ca": self.ssl_ca, "verify_mode": verify, "check_hostname": self.ssl_mode == "verify_identity"}
        elif self.ssl_ca:
            args["ssl"] = {"ca": self.ssl_ca, "verify_mode": True, "check_hostname": False}
        return args


def parse_dsn(dsn: str) -> Endpoint:
    """Parse a ``mysql://`` or ``mariadb://`` URI; raise ValueError (without the DSN's text) when it is not one."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ValueError("expected a URI mysql://user[:password]@host[:port][/database]")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError("the URI's port is not a number") from None
    if not parts.hostname or not parts.username:
        raise ValueError("the URI needs a user and a host: mysql://user@host[:port][/database]")
    database = unquote(parts.path.lstrip("/")) or None
    password = SecretStr(unquote(parts.password)) if parts.password is not None else None
    return Endpoint(parts.hostname, port, unquote(parts.username), password, database)


class MySQLOptions(BackendOptions):
    """Options of ``backend=mysql``."""

    dsn: SecretStr = Field(
        alias="dsn",
        description="URI of the server: `mysql://user[:password]@host[:port][/database]` (MySQL or MariaDB); "
        "without a password in it, `MYSQL_PWD` from the environment is used.",
    )
    tables: str = Field(
        alias="tables",
        description="Comma-separated tables to read (`database.table`, or `table` in the DSN's database); each "
        "needs a primary key. One table: typed columns; several: `_table`, `_key` and `_row` (JSON) columns.",
    )

    ssl_mode: str = Field(
        "preferred",
        alias="ssl.mode",
        description="TLS to the server, as the MySQL clients' `--ssl-mode`: `disabled`, `preferred` (TLS when the "
        "server offers it, unverified), `required` (TLS, unverified), `verify_ca` (TLS, the server's certificate "
        "signed by `ssl.ca` or a system CA), `verify_identity` (and its name matching the DSN's host).",
    )
    ssl_ca: str | None = Field(
        None, alias="ssl.ca", description="File of the CA certificates to verify the server's certificate with "
        "(a managed service's bundle, e.g. RDS's global-bundle.pem); present on the driver and every executor.",
    )

    snapshot_path: str | None = Field(
        None,
        alias="snapshot.path",
        description="Directory the driver and every executor can write and read; required with "
        "`startingOffsets=snapshot`. It keeps the snapshot's start and the rows of the chunks in flight (a few "
        "batches' worth, removed as batches commit), so that a replayed batch yields the same rows.",
    )
    snapshot_chunk_rows: int = Field(
        DEFAULT_CHUNK_ROWS, ge=1, le=10_000_000, alias="snapshot.chunkRows",
        description="Rows per snapshot chunk, 1 to 10,000,000 (one Spark partition each, read whole into the "
        "task's Python worker: lower it for wide rows).",
    )
    snapshot_chunks_per_batch: int = Field(
        DEFAULT_CHUNKS_PER_BATCH, ge=1, le=10_000, alias="snapshot.chunksPerBatch",
        description="Chunks one batch reads at most (fewer under `maxRecordsPerTrigger`); the batch's cut (a "
        "consistent-snapshot transaction) is held while they are read. A batch read reads as many per cut.",
    )
    snapshot_batch_read_retention_hours: float = Field(
        24.0, ge=0, alias="snapshot.batchReadRetentionHours",
        description="A batch read with `startingOffsets=snapshot` keeps the table's rows in a directory of its own "
        "under `snapshot.path/batch-reads` (every action on its DataFrame reads them); a new batch read removes "
        "the directories older than this many hours. 0 keeps them all.",
    )

    @field_validator("ssl_mode")
    @classmethod
    def _ssl_mode(cls, value: str) -> str:
        mode = value.strip().lower()
        if mode not in SSL_MODES:
            raise ValueError(f"accepted values: {', '.join(SSL_MODES)}")
        return mode

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, value: SecretStr) -> SecretStr:
        parse_dsn(value.get_secret_value())
        return value

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: str) -> str:
        names = [t.strip() for t in value.split(",") if t.strip()]
        if not names:
            raise ValueError("name at least one table, e.g. shop.orders,shop.customers")
        for n in names:
            if n.count(".") > 1 or not all(part for part in n.split(".")) or "`" in n:
                raise ValueError(f"table {n!r} is not `database.table` or `table`")
        return ",".join(names)

    @model_validator(mode="after")
    def _databases(self) -> MySQLOptions:
        if any("." not in t for t in self.tables.split(",")) and not self.endpoint.database:
            raise ValueError("tables without a database (`table` rather than `database.table`) need a database in "
                             "the dsn (mysql://user@host/database)")
        return self

    @property
    def endpoint(self) -> Endpoint:
        return replace(parse_dsn(self.dsn.get_secret_value()), ssl_mode=self.ssl_mode, ssl_ca=self.ssl_ca)

    @property
    def table_list(self) -> tuple[str, ...]:
        """Every table as ``database.table``."""
        default = self.endpoint.database
        return tuple(t if "." in t else f"{default}.{t}" for t in self.tables.split(","))
