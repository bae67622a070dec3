"""Records of ``backend=local``: the rows a writer appends, made into change-model Arrow records.

A writer hands :meth:`~cdc.backends.local.log.LocalLog.append` Arrow tables, pandas frames or dicts, each
row optionally with ``_op`` (default ``insert``) and ``_commit_ts``; :func:`change_table` checks them against
the log's change schema, and :func:`segment_table` gives them the metadata columns of the channel they land in.
The log stores exactly these records, so reading them back needs no decoding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa

from cdc.model import CHANNEL, COMMIT_TS, OP, POSITION, SEQ, ChangeSchema, Op

if TYPE_CHECKING:
    import pandas as pd

Rows: TypeAlias = "pa.Table | Sequence[Mapping[str, Any]] | pd.DataFrame"
"""What a writer may append."""

_OPS = {o.value for o in Op}


def change_table(rows: Rows, schema: ChangeSchema) -> pa.Table:
    """``rows`` as an Arrow table of the schema's columns and ``_op``, checked: known operations, keys present
    and never null. Columns may be missing (they are null) and ``_commit_ts`` may be given."""
    import pandas as pd  # imported here: readers (Spark's planner process) never need it

    if isinstance(rows, pa.Table):
        table = rows
    elif isinstance(rows, pd.DataFrame):
        table = pa.Table.from_pandas(rows, preserve_index=False)
    else:
        rows = list(rows)
        cols: dict[str, list[Any]] = {OP: [r.get(OP, Op.INSERT.value) for r in rows]}
        for name in schema.table.names:
            cols[name] = [r.get(name) for r in rows]
        if COMMIT_TS in {k for r in rows for k in r}:
            cols[COMMIT_TS] = [r.get(COMMIT_TS) for r in rows]
        unknown = {k for r in rows for k in r} - set(cols)
        if unknown:
            raise ValueError(f"unknown columns {sorted(unknown)}; the table has {schema.table.names}")
        table = pa.table(cols)
    if OP not in table.column_names:
        table = table.append_column(OP, pa.array([Op.INSERT.value] * table.num_rows, pa.string()))
    ops = set(table.column(OP).unique().to_pylist())
    if not ops <= _OPS:
        raise ValueError(f"column {OP!r}: invalid operations {sorted(map(str, ops - _OPS))}; accepted: {sorted(_OPS)}")
    for k in schema.keys:
        if k not in table.column_names:
            raise ValueError(f"key column {k!r} is missing")
        if table.column(k).null_count:
            raise ValueError(f"key column {k!r} has nulls")
    return table


def segment_table(
    part: pa.Table, schema: ChangeSchema, channel: str, start: int, seqs: pa.Array, ts: datetime
) -> pa.Table:
    """The change records of ``part`` (from :func:`change_table`) at positions ``start...`` of ``channel``, with
    sequences ``seqs`` and commit time ``ts`` where a row carries none."""
    n = part.num_rows
    cols: dict[str, Any] = {
        OP: part.column(OP).cast(pa.string()),
        SEQ: seqs,
        COMMIT_TS: (
            part.column(COMMIT_TS).cast(pa.timestamp("us", tz="UTC"))
            if COMMIT_TS in part.column_names
            else pa.array([ts] * n, pa.timestamp("us", tz="UTC"))
        ),
        CHANNEL: pa.array([channel] * n, pa.string()),
        POSITION: pa.array(range(start, start + n), pa.int64()),
    }
    for f in schema.table:
        if f.name in part.column_names:
            cols[f.name] = part.column(f.name).cast(f.type)
        else:
            cols[f.name] = pa.nulls(n, f.type)
    return pa.Table.from_pydict(cols, schema=schema.arrow())
