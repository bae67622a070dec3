"""The layout of a sink-managed Delta table, and the names of the columns the sink adds to a batch.

What a sink-managed Delta table holds
-------------------------------------
* the key columns and value columns of the changes (minus ``except_columns``);
* the sequence column (``sequence_by``, ``_seq`` by default): the sequence of the last change applied to the
  row. Changes whose sequence is not greater than it are ignored, so out-of-order and replayed deliveries
  are harmless;
* ``_commit_ts`` (when the changes carry it): when the row's last change was committed at the source;
* ``__cdc_deleted_at`` (hidden): null for a live row; for a **tombstone** the wall-clock time the delete
  was applied. A delete does not remove the key's row: it nulls every value column and stamps
  ``__cdc_deleted_at``, keeping key + sequence, so an older insert arriving later cannot resurrect the key.
  SCD type 1 tombstones are purged once older than ``tombstone_retention``. Tombstones live in the same table (not a
  side table) so that a batch is one atomic Delta commit; :func:`sinks.delta.read` hides them, and any other
  reader filters ``__cdc_deleted_at IS NULL``;
* SCD type 2 only: ``_valid_from`` / ``_valid_to`` (the sequences that opened and closed a version;
  ``_valid_to`` is null for the current version; intervals are half-open ``[from, to)``) and ``_is_current``.

The change-record metadata ``_op``, ``_channel`` and ``_position`` are delivery details and are not kept.

Every name here is shared by several steps (batch preparation, staging, the MERGE, the reader), which is why
it lives in a module of its own that depends on nothing of the sink.
"""

from __future__ import annotations

import pyarrow as pa

from cdc.model import CHANNEL, OP, POSITION, Op

SOURCE_ALIAS = "s"
TARGET_ALIAS = "t"
HIDDEN_PREFIX = "__cdc_"
DELETED_AT = "__cdc_deleted_at"
IS_DELETE = "__cdc_is_delete"
NOW = "__cdc_now"
ACTION = "__cdc_action"
FROM = "__cdc_from"  # SCD type 2 staging: a version's valid-from / valid-to
TO = "__cdc_to"
#: Prefix of the per-column source columns a batch with partial changes carries: ``__cdc_set_<column>`` is
#: the sequence of the change that last set the column in the batch (null: no change of the batch set it).
SET_PREFIX = "__cdc_set_"
VALID_FROM = "_valid_from"
VALID_TO = "_valid_to"
IS_CURRENT = "_is_current"
DEFAULT_DELETE_CONDITION = f"{OP} = '{Op.DELETE.value}'"
DROPPED_METADATA = (OP, CHANNEL, POSITION)
TIMESTAMP = pa.timestamp("us", tz="UTC")

# SCD type 2 staging actions: the first group matches the key's head row, the second group inserts.
MATCHED_ACTIONS = ("close", "closeupd", "inplace", "retomb", "revive")
INSERT_ACTIONS = ("open", "tombstone")
