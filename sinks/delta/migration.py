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

:func:`migrate_mode` switches a table between the sink's two modes (see :mod:`sinks.delta.layout`), also
with the query stopped, also on delta-rs whatever the sink's engine, and also so that a crash anywhere leaves
a table that running the migration again completes:

* ordered to safe: the state table is written (overwritten) from the main table's key heads, exactly the
  rows safe mode would hold for them (:func:`state_rows`), then the property ``cdc-tunnel.mode`` is set to
  ``safe``. A crash between the two leaves an ordered table, which a query claiming safe mode refuses; the
  run again overwrites the state table from the main table. A key deleted while the table was ordered left
  no row to take a tombstone from (SCD type 1): a change older than that delete arriving later can still
  bring the key back, as it could in ordered mode.
* safe to ordered: the property is set to ``ordered`` first, then the state table is removed (ordered mode
  must not find one: its key changes would read stale heads from it). A crash between the two leaves an
  ordered table with its old state table, which the run again removes (an ordered table with a state table
  is not "already ordered"). Ordered mode gives up the tombstones: a change older than a delete, arriving
  after it, brings the key back (SCD type 1).

The property is set by a metadata-only commit (delta-rs ``alter.set_table_properties``), which delta-spark
reads as any table property.
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from cdc.errors import OptionError, TerminalError
from sinks.delta.layout import (
    DELETED_AT,
    IS_CURRENT,
    MODE_PROPERTY,
    ORDERED,
    SAFE,
    TIMESTAMP,
    VALID_TO,
    LegacyLayoutError,
    state_path,
)
from sinks.delta.schema import normalise_type, state_schema
from sinks.delta.spec import SinkSpec
from sinks.delta.state import version_heads

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



MODES = (ORDERED, SAFE)


def run_migration(path: str, spec: SinkSpec, mode: str | None, storage_options: dict[str, str] | None,
                  now: datetime) -> bool:
    """``mode=None``: :func:`migrate_layout`; else :func:`migrate_mode` (``now``: the tombstones' time)."""
    if mode is None:
        return migrate_layout(path, spec, storage_options)
    return migrate_mode(path, spec, mode, storage_options, now)


def migrate_mode(path: str, spec: SinkSpec, mode: str, storage_options: dict[str, str] | None,
                 now: datetime) -> bool:
    """Switch the table at ``path`` (written with the options ``spec``) to ``mode``; False when it is in that
    mode already. Raises :class:`OptionError` for a mode that is not one of :data:`MODES`, for a table that
    does not exist (a new table takes its mode from the query's ``ordered``), and for an ordered table that
    does not keep ``sequence_by``; :class:`LegacyLayoutError` for a table of the previous layout."""
    if mode not in MODES:
        raise OptionError(f"parameter 'mode' of migrate(): {mode!r} is not accepted; accepted: "
                          f"{', '.join(MODES)}, or None (convert a table of the previous layout)", "mode")
    try:
        dt = DeltaTable(path, storage_options=storage_options)
    except TableNotFoundError:
        raise OptionError(f"no Delta table at {path}: nothing to migrate (a new table takes its mode from the "
                          "query's option 'ordered' when the sink creates it)", "path") from None
    if DELETED_AT in dt.schema().to_arrow().names:
        raise LegacyLayoutError(f"{path} was written by the previous layout of DeltaUpsertSink; run migrate() "
                                f"(without a mode) first, then migrate(mode={mode!r})")
    current = dt.metadata().configuration.get(MODE_PROPERTY) or SAFE
    if mode == SAFE:
        if current == SAFE:
            return False
        state = seed_state(path, spec, storage_options, now)
        set_mode(path, SAFE, storage_options)
        log.info("migrated %s to safe mode: %d key heads written to its state table", path, state)
        return True
    leftover = has_state(path, storage_options)
    if current == ORDERED and not leftover:
        return False
    if current != ORDERED:
        set_mode(path, ORDERED, storage_options)
    drop_state(path, storage_options)
    log.warning("migrated %s to ordered mode: its state table (sequences and tombstones) is removed; from now on "
                "a change older than a delete, arriving after it, can bring the key back (SCD type 1), and the "
                "query must deliver every key's changes in order", path)
    return True


def state_rows(path: str, spec: SinkSpec, storage_options: dict[str, str] | None, now: datetime) -> pa.Table:
    """The state table's rows for the ordered table at ``path``: each key's head as safe mode holds it (key,
    sequence of its last applied change, ``__cdc_deleted_at``). SCD type 1: each live row, at its
    ``sequence_by``. SCD type 2: each current version at its ``sequence_by``, and each key without one at its
    last closed version's ``_valid_to`` (its delete's sequence) as a tombstone stamped ``now``."""
    dt = DeltaTable(path, storage_options=storage_options)
    names = dt.schema().to_arrow().names
    seq = spec.sequence_by
    if seq not in names:
        raise OptionError(
            f"{path} does not keep its sequence column {seq!r} (option 'sequence_by'; the table was created "
            "with option 'bookkeeping_columns' without 'sequence', or with another sequence_by): an ordered "
            "table without its sequence cannot seed the state table safe mode guards with; nothing was "
            "written. Rebuild the table in safe mode (a new path, from a snapshot) instead",
            "bookkeeping_columns" if seq in spec.hidden else "sequence_by")
    read = dt.to_pyarrow_table(columns=[*spec.keys, seq, *([VALID_TO] if spec.scd_type == 2 else [])])
    read = read.cast(pa.schema([f.with_type(normalise_type(f.type)) for f in read.schema]))  # (string_view)
    if spec.scd_type == 2:
        heads = version_heads(spec, read, read.schema.field(seq).type)
        dead = pc.is_valid(heads.column(DELETED_AT))
        stamp = pc.if_else(dead, pa.scalar(now, TIMESTAMP), pa.nulls(heads.num_rows, TIMESTAMP))
        heads = heads.set_column(heads.column_names.index(DELETED_AT), DELETED_AT, stamp)
    else:
        heads = read.append_column(pa.field(DELETED_AT, TIMESTAMP), pa.nulls(read.num_rows, TIMESTAMP))
    schema = state_schema(spec, read.schema)
    return heads.select(schema.names).cast(schema)


def seed_state(path: str, spec: SinkSpec, storage_options: dict[str, str] | None, now: datetime) -> int:
    """The first step to safe mode: (over)write the state table from the main table; the rows written."""
    state = state_rows(path, spec, storage_options, now)
    write_deltalake(state_path(path), state, mode="overwrite", schema_mode="overwrite",
                    storage_options=storage_options)
    return int(state.num_rows)


def set_mode(path: str, mode: str, storage_options: dict[str, str] | None) -> None:
    """Record ``mode`` in the table's property (one metadata-only commit)."""
    dt = DeltaTable(path, storage_options=storage_options)
    dt.alter.set_table_properties({MODE_PROPERTY: mode}, raise_if_not_exists=False)


def _local(path: str) -> str | None:
    """``path`` as a local file-system path, or None for an object-store URI."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path


def has_state(path: str, storage_options: dict[str, str] | None) -> bool:
    """Whether anything of a state table is left at ``<path>/_cdc_state`` (or its removal's folder)."""
    target = state_path(path)
    local = _local(target)
    if local is not None:
        return os.path.exists(local) or os.path.exists(local + _DROPPED)
    try:
        DeltaTable(target, storage_options=storage_options)
    except TableNotFoundError:
        return False
    return True


#: Suffix of the folder a local state table is renamed to before its removal (``_``-prefixed like the state
#: folder itself, so Delta ignores it): a crash during the removal never leaves a partial log at the state's
#: path, where it would read as an older state table.
_DROPPED = ".dropped"


def drop_state(path: str, storage_options: dict[str, str] | None) -> None:
    """Remove the state table of the table at ``path`` (the last step to ordered mode)."""
    target = state_path(path)
    local = _local(target)
    if local is not None:
        if os.path.exists(local):
            shutil.rmtree(local + _DROPPED, ignore_errors=True)
            os.replace(local, local + _DROPPED)
        shutil.rmtree(local + _DROPPED, ignore_errors=True)
        return
    from pyarrow import fs

    try:
        filesystem, root = fs.FileSystem.from_uri(target)
        filesystem.delete_dir(root)
    except Exception as e:  # (pyarrow takes credentials from the environment, not from storage_options)
        raise TerminalError(
            f"{path} is in ordered mode now, but its state table {target} could not be removed ({e}); remove "
            "that folder yourself (or run migrate(mode='ordered') again where pyarrow finds the object store's "
            "credentials) before the query restarts: ordered mode must not find a state table") from e
