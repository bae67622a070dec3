"""The layout of a sink-managed Delta table, and the names of the columns the sink adds to a batch.

Two Delta tables per sink
-------------------------
The **main table** (at ``path``) is a plain Delta table that any Delta reader (Spark ``format("delta")``,
``deltalake``, DuckDB ``delta_scan``, polars, Trino) sees as the source table now. It holds only live rows:

* the key columns and value columns of the changes (``column_list``, or all but ``except_column_list``);
* the visible bookkeeping columns (option ``bookkeeping_columns``, default all of them): the sequence column
  (``sequence_by``, ``_seq`` by default: the sequence of the row's last applied change), ``_commit_ts``
  (when the changes carry it: when the row's last change was committed at the source) and, SCD type 2 only,
  ``_is_current``;
* SCD type 2 only, always: ``_valid_from`` / ``_valid_to`` (the sequences that opened and closed a version;
  ``_valid_to`` is null for the current version; intervals are half-open ``[from, to)``). They are the
  history itself: without them a key's versions could not be told apart, so they cannot be hidden.

A deleted key has no row there (SCD type 2: its last version is closed). Hiding a bookkeeping column only
hides it: nothing the sink decides reads it from the main table.

The **state table** (at ``<path>/_cdc_state``) holds one row per key the sink has applied a change to: the
key, the sequence of the key's last applied change (the per-key sequence guard: a change whose sequence is
not greater is ignored, so out-of-order and replayed deliveries are harmless) and ``__cdc_deleted_at``
(null while the key is live; for a **tombstone**, the wall-clock time the delete was applied, so an older
insert arriving later cannot resurrect the key). For SCD type 2 its rows are the key heads (current version
or tombstone); the head's values are the main table's current row. SCD type 1 tombstones are purged from it
once older than ``tombstone_retention``; SCD type 2 keeps them with the history.

Why inside the main directory, under a name starting with ``_``: Delta readers and writers ignore
``_``-prefixed folders of a table (as ``_delta_log``; VACUUM of delta-spark and delta-rs skip hidden
folders, and OPTIMIZE only rewrites files the main log references), so maintenance of the main table never
touches the state; and a user who drops or moves the main directory drops or moves the state with it, where
a sibling folder would be left behind to guard a table that no longer exists (and to wrongly guard a new
table created at the same path).

Exactly once with two commits: each batch is one commit on each table, each carrying the application
transaction ``(app_id, batch id)``. The main table commits first, from the state as it was before the batch;
the state table second. A replay skips a table whose transaction already holds the batch id; after a crash
between the two commits the replay recomputes the state's commit alone from the unchanged state, and the
state's MERGE is guarded by sequence anyway (``s.seq > t.seq``), so applying a batch twice to it changes
nothing.

Tables of the previous layout (tombstones and ``__cdc_deleted_at`` in the main table, no state table) are
refused with :class:`LegacyLayoutError`; :meth:`sinks.delta.DeltaUpsertSink.migrate` converts one.

The change-record metadata ``_op``, ``_channel``, ``_position`` and ``_old_key`` are delivery details and are
not kept (``_old_key`` is read first: see :func:`sinks.delta.batch.complete_key_changes`).

Every name here is shared by several steps (batch preparation, staging, the MERGE, the reader), which is why
it lives in a module of its own that depends on nothing of the sink.
"""

from __future__ import annotations

import pyarrow as pa

from cdc.errors import TerminalError
from cdc.model import CHANNEL, COMMIT_TS, OLD_KEY, OP, POSITION, Op

SOURCE_ALIAS = "s"
TARGET_ALIAS = "t"
HIDDEN_PREFIX = "__cdc_"
DELETED_AT = "__cdc_deleted_at"
IS_DELETE = "__cdc_is_delete"
#: The evaluated ``apply_as_truncates`` condition of a change record (see :func:`sinks.delta.batch.after_last_truncate`).
IS_TRUNCATE = "__cdc_is_truncate"
NOW = "__cdc_now"
ACTION = "__cdc_action"
FROM = "__cdc_from"  # SCD type 2 staging: a version's valid-from / valid-to
TO = "__cdc_to"
#: SCD type 2 back-fill: the stored ``_valid_from`` of the version a ``reshape`` or ``replace`` action changes
AT = "__cdc_at"
#: SCD type 1, safe mode: the change's sequence equals its key's head (a redelivery, or a conflict the MERGE
#: fails on; see :func:`sinks.delta.merge.merge_plan`).
TIE = "__cdc_tie"
#: The text of the runtime failure a MERGE raises on such a conflict (each engine's ``tie_fail``).
TIE_MARK = "cdc-tunnel: a change ties a stored change"
#: Prefix of the per-column source columns a batch with partial changes carries: ``__cdc_set_<column>`` is
#: the sequence of the change that last set the column in the batch (null: no change of the batch set it).
SET_PREFIX = "__cdc_set_"
VALID_FROM = "_valid_from"
VALID_TO = "_valid_to"
IS_CURRENT = "_is_current"
DEFAULT_DELETE_CONDITION = f"{OP} = '{Op.DELETE.value}'"
DROPPED_METADATA = (OP, CHANNEL, POSITION, OLD_KEY)
TIMESTAMP = pa.timestamp("us", tz="UTC")

# SCD type 2 staging actions: the first group changes the key's head, the second group adds a head or a
# version. In the main table only the current version is matched (close, closeupd, inplace) and versions are
# inserted (open; a revived tombstone opens a version too); tombstones live in the state table only.
MATCHED_ACTIONS = ("close", "closeupd", "inplace", "retomb", "revive")
INSERT_ACTIONS = ("open", "tombstone")
MAIN_MATCHED_ACTIONS = ("close", "closeupd", "inplace")
# Back-fill (a late change placed into history, see sinks.delta.backfill): a stored version, matched by its
# valid-from (``__cdc_at``), gets new validity (``reshape``) or new values too (``replace``).
HISTORY_ACTIONS = ("reshape", "replace")

#: The state table's folder inside the main table's (see the module docstring for why there).
STATE_DIR = "_cdc_state"
#: Accepted values of the option ``bookkeeping_columns``: which bookkeeping columns the main table shows.
BOOKKEEPING = ("sequence", "commit_ts", "is_current")


#: The main table's property recording the sink's mode, set when the sink creates the table: ``ordered`` (one
#: MERGE per batch, no state table) or ``safe`` (tombstones and sequences in the state table). A table
#: without it was written by a release that had only the safe mode.
MODE_PROPERTY = "cdc-tunnel.mode"
ORDERED, SAFE = "ordered", "safe"


class ModeMismatchError(TerminalError):
    """The query asks for one mode and the table was created in the other; nothing was written."""


def state_path(path: str) -> str:
    """The state table of the main table at ``path`` (a local path or an object-store URI)."""
    return path.rstrip("/") + "/" + STATE_DIR


class LegacyLayoutError(TerminalError):
    """The table was written by the previous layout (tombstones in the main table); nothing was written."""


def hidden_columns(visible: frozenset[str], sequence_by: str, scd_type: int) -> frozenset[str]:
    """The bookkeeping column names a new main table does not get, given the visible ``BOOKKEEPING`` names."""
    names = {"sequence": sequence_by, "commit_ts": COMMIT_TS}
    if scd_type == 2:
        names["is_current"] = IS_CURRENT
    return frozenset(name for token, name in names.items() if token not in visible)


def quote(name: str) -> str:
    """A SQL identifier quoted for both DataFusion (delta-rs) and Spark SQL."""
    return "`" + name.replace("`", "``") + "`"
