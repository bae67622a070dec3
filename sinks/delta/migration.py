"""Migration of a table written by the previous layout (tombstones and ``__cdc_deleted_at`` in the main
table, no state table) to the current one (see :mod:`sinks.delta.layout`).

The sink refuses such a table (:class:`sinks.delta.layout.LegacyLayoutError`) rather than migrating it on
its own: the migration rewrites the whole table, which a user should choose to run (once, with the query
stopped), not find happening inside a micro-batch. It runs on delta-rs whatever the sink's engine, in two
commits: the state table is written (overwritten) from the main table's key heads, then the main table is
rewritten without its tombstones and without ``__cdc_deleted_at`` in one overwrite commit. A crash between
the two leaves the main table as it was, still detected as the previous layout, and running the migration
again overwrites the state table from it: harmless. The main table's application transactions stay in its
log, so a replay of the last batch after the migration is still skipped there; the new state table has no
transaction yet, and replaying a batch into it changes nothing (its MERGE is guarded by sequence).
"""

from __future__ import annotations

import logging

import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from sinks.delta.layout import DELETED_AT, IS_CURRENT, state_path
from sinks.delta.schema import state_schema
from sinks.delta.spec import SinkSpec

log = logging.getLogger(__name__)


def migrate_layout(path: str, spec: SinkSpec, storage_options: dict[str, str] | None = None) -> bool:
    """Migrate the table at ``path`` written with the options ``spec``; False when it needs no migration."""
    try:
        dt = DeltaTable(path, storage_options=storage_options)
    except TableNotFoundError:
        return False
    rows = dt.to_pyarrow_table()
    if DELETED_AT not in rows.column_names:
        return False
    tombstone = pc.is_valid(rows.column(DELETED_AT))
    if spec.scd_type == 2:
        heads = rows.filter(pc.or_kleene(tombstone, pc.fill_null(rows.column(IS_CURRENT), False)))
    else:
        heads = rows
    schema = state_schema(spec, heads.schema)
    state = heads.select(schema.names).cast(schema)
    write_deltalake(state_path(path), state, mode="overwrite", schema_mode="overwrite",
                    storage_options=storage_options)
    live = rows.filter(pc.invert(tombstone)).drop_columns([DELETED_AT])
    live = live.drop_columns([c for c in live.column_names if c in spec.hidden])
    write_deltalake(path, live, mode="overwrite", schema_mode="overwrite", storage_options=storage_options)
    log.info("migrated %s: %d live rows kept, %d key heads moved to the state table", path, live.num_rows,
             state.num_rows)
    return True

