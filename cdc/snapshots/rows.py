"""Snapshot rows as change records: a table's rows read at a cut, with the metadata columns every backend gives
them (``_op = snapshot``, the cut's ``_seq``, the chunk's channel, positions counting the rows)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pyarrow as pa

from cdc.model import RESERVED_COLUMNS, Op


def with_meta(schema: pa.Schema, data: pa.Table, channel: str, seq: int, when: datetime) -> pa.Table:
    """``data`` (the table's columns of ``schema``) as snapshot records of ``schema``."""
    n = data.num_rows
    # Constant columns built by Arrow, not from n Python objects each.
    meta = {
        "_op": pa.repeat(pa.scalar(Op.SNAPSHOT.value, pa.string()), n),
        "_seq": pa.repeat(pa.scalar(seq, pa.int64()), n),
        "_commit_ts": pa.repeat(pa.scalar(when, pa.timestamp("us", tz="UTC")), n),
        "_channel": pa.repeat(pa.scalar(channel, pa.string()), n),
        "_position": pa.array(np.arange(n, dtype=np.int64)),
    }
    columns = [meta_column(f, meta, n) for f in schema]
    return pa.table([data.column(f.name) if c is None else c for f, c in zip(schema, columns, strict=True)],
                    schema=schema)


def meta_column(f: pa.Field, meta: dict[str, pa.Array], n: int) -> pa.Array | None:
    """A metadata column of snapshot rows: given in ``meta``, else null (``_unchanged``: a snapshot row is whole;
    ``_old_key``: it moved no key); None for a table column."""
    if f.name in meta:
        return meta[f.name]
    return pa.nulls(n, f.type) if f.name in RESERVED_COLUMNS else None


def refresh_batch(schema: pa.Schema, keys: Sequence[str], channel: str, seq: int, when: datetime) -> pa.RecordBatch:
    """The ``refresh`` record of a re-snapshot that started at ``seq`` (see :class:`cdc.model.Op`), in a typed
    schema: its key columns (not null) hold values that mean nothing, its other columns null."""
    from cdc.formats.rows import type_default

    meta = {
        "_op": pa.array([Op.REFRESH.value], pa.string()),
        "_seq": pa.array([seq], pa.int64()),
        "_commit_ts": pa.array([when], pa.timestamp("us", tz="UTC")),
        "_channel": pa.array([channel], pa.string()),
        "_position": pa.array([0], pa.int64()),
    }
    arrays = []
    for f in schema:
        given = meta_column(f, meta, 1)
        if given is None:
            given = pa.array([type_default(f.type) if f.name in keys else None], f.type)
        arrays.append(given)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
