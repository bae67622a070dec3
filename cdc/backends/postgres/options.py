"""Options of ``backend=postgres``.

``dsn`` is a libpq connection string or URI; it may hold a password, so it is a ``SecretStr`` (never in
reprs, logs, errors or offsets); prefer ``PGPASSWORD`` or a ``.pgpass`` file. ``tables`` names the tables
whose changes are read, ``schema.table`` or ``table`` (schema ``public``).
"""

from __future__ import annotations

import hashlib
import re

from pydantic import PositiveInt, field_validator

from cdc.options import BackendOptions, Field, SecretStr

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def qualified(name: str) -> str:
    """``schema.table`` for a table named with or without its schema."""
    return name if "." in name else f"public.{name}"


class PostgresOptions(BackendOptions):
    """Options of ``backend=postgres``."""

    dsn: SecretStr = Field(alias="dsn", description="libpq connection string or URI of the database.")
    tables: str = Field(
        alias="tables",
        description="Comma-separated tables to read (`schema.table` or `table` for schema public); each needs a "
        "primary key. One table: typed columns; several: `_table`, `_key` and `_row` (JSON) columns.",
    )
    slot_name: str | None = Field(
        None,
        alias="slot.name",
        description="Logical replication slot of the query (created if missing). Default: `cdc_` and a hash of "
        "the database, tables and publication; give one per query when two queries read the same tables.",
    )
    publication_name: str | None = Field(
        None,
        alias="publication.name",
        description="Publication naming the tables (created for them if missing). Default: the slot's name.",
    )
    snapshot_path: str | None = Field(
        None,
        alias="snapshot.path",
        description="Directory (readable by every executor) where `startingOffsets=snapshot` materialises the "
        "exported snapshot's chunks; required for snapshots.",
    )
    snapshot_chunk_rows: PositiveInt = Field(
        100_000, alias="snapshot.chunkRows", description="Rows per snapshot chunk (a chunk is a channel)."
    )
    snapshot_parallelism: PositiveInt = Field(
        4, alias="snapshot.parallelism", description="Connections reading snapshot chunks at once."
    )

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: str) -> str:
        names = [t.strip() for t in value.split(",") if t.strip()]
        if not names:
            raise ValueError("name at least one table, e.g. public.orders,public.customers")
        for n in names:
            if n.count(".") > 1 or not all(part for part in n.split(".")):
                raise ValueError(f"table {n!r} is not `schema.table` or `table`")
        return ",".join(qualified(n) for n in names)

    @field_validator("slot_name", "publication_name")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError("accepted values: lower-case letters, digits and _ (at most 63, not starting with a digit)")
        return value

    @property
    def table_list(self) -> tuple[str, ...]:
        return tuple(self.tables.split(","))

    def database(self) -> str:
        """The database the DSN names (for the derived slot name); never the DSN itself."""
        from psycopg.conninfo import conninfo_to_dict

        return str(conninfo_to_dict(self.dsn.get_secret_value()).get("dbname", ""))

    @property
    def slot(self) -> str:
        if self.slot_name:
            return self.slot_name
        seed = "|".join([self.database(), self.tables, self.publication_name or ""])
        return "cdc_" + hashlib.sha1(seed.encode()).hexdigest()[:20]

    @property
    def publication(self) -> str:
        return self.publication_name or self.slot
