"""Snapshot rows as change records: a table's rows read at a cut, with the metadata columns every backend gives
them (``_op = snapshot``, the cut's ``_seq``, the chunk's channel, positions counting the rows)."""

from __future__ import annotations

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
