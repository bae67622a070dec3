"""Options of ``backend=postgres``.

``dsn`` is a libpq connection string or URI; it may hold a password, so it is a ``SecretStr`` (never in
reprs, logs, errors or offsets); prefer ``PGPASSWORD`` or a ``.pgpass`` file. ``tables`` names the tables
whose changes are read, ``schema.table`` or ``table`` (schema ``public``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import PositiveInt, field_validator

from cdc.options import BackendOptions, Field, SecretStr
from cdc.snapshots.planning import DEFAULT_CHUNK_ROWS, DEFAULT_CHUNKS_PER_BATCH

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
    layout: Literal["auto", "json"] = Field(
        "auto",
        alias="layout",
        description="Record layout. `auto`: typed columns for one table, `_table`, `_key` and `_row` (JSON) for "
        "several; `json`: the many-table layout for one table too, so that tables can be added to the query "
        "later (a query's layout never changes).",
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
    snapshot_mode: Literal["chunked", "exported"] = Field(
        "chunked",
        alias="snapshot.mode",
        description="How `startingOffsets=snapshot` reads the tables. `chunked`: key-range chunks read by the "
        "executors, a few per batch, each at a cut that also ends the batch's changes; changes keep flowing "
        "meanwhile. `exported`: the snapshot the query's slot exports, materialised under `snapshot.path` "
        "before the first batch, then every change (batch reads always take this one).",
    )
    snapshot_path: str | None = Field(
        None,
        alias="snapshot.path",
        description="Directory every executor can write and read; required for snapshots. `chunked`: the rows "
        "of the chunks in flight (a few batches' worth, removed as batches commit), so that a replayed batch "
        "yields the same rows; `exported`: the whole materialised snapshot.",
    )
    snapshot_chunk_rows: int = Field(
        DEFAULT_CHUNK_ROWS, ge=1, le=10_000_000, alias="snapshot.chunkRows",
        description="Rows per snapshot chunk, 1 to 10,000,000 (`chunked`: one Spark partition each, at most "
        "twice as many rows, read whole into the task's Python worker: lower it for wide rows; `exported`: a "
        "channel each).",
    )
    snapshot_chunks_per_batch: int = Field(
        DEFAULT_CHUNKS_PER_BATCH, ge=1, le=10_000, alias="snapshot.chunksPerBatch",
        description="`chunked`: chunks one batch reads at most (fewer under `maxRecordsPerTrigger`); the cut is "
        "held while they are read. Each batch costs a cut and Spark's logs: more chunks a batch read a table "
        "faster, fewer deliver the changes between batches sooner.",
    )
    snapshot_cut_timeout_s: float = Field(
        5.0, gt=0, le=3600, alias="snapshot.cutTimeout",
        description="`chunked`: seconds a batch waits for a cut (PostgreSQL waits for the write transactions "
        "in flight) before it delivers changes only and tries again at the next batch.",
    )
    snapshot_parallelism: PositiveInt = Field(
        4, alias="snapshot.parallelism", description="`exported`: connections reading snapshot chunks at once."
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
