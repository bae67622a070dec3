"""The sequence that orders a key's changes (option ``sequence_by``): one column, or several compared in turn.

``sequence_by`` names one integer or timestamp column, a struct column whose fields are integers or
timestamps (nested structs too), or a list of such columns. A list is compared as the struct of those columns
in the order given, which the sink adds to the batch as the column ``_sequence`` (:data:`SEQUENCE`) and keeps
where it keeps a single sequence column (the state table's guard, SCD type 2's ``_valid_from``/``_valid_to``).

Structs compare **lexicographically, field by field in the order given**: the first field decides, the second
breaks its ties, and so on (as Spark and DataFusion compare structs, so the MERGE text compares them alike on
both engines). Arrow's kernels neither compare nor join structs, so the sink's Arrow steps compare
:func:`order_key`: an order-preserving binary encoding of the value (each field as 8 big-endian bytes with the
sign bit flipped), which compares as bytes exactly as the struct compares field by field.

Bad sequences fail the batch, nothing written: a null sequence (or a null field of one), and two changes of one
key with the same sequence and different values (:func:`check_ties`: which one is the later is unknowable, so
the sink does not pick). Two identical changes (a redelivery) count as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import MalformedRecordError, OptionError
from cdc.model import CHANNEL, POSITION

#: The column a list ``sequence_by`` becomes: the struct of the listed columns, in the order given.
SEQUENCE = "_sequence"

_SIGN = np.uint64(1 << 63)


def with_sequence(columns: Sequence[str], batch: pa.Table) -> pa.Table:
    """``batch`` with :data:`SEQUENCE` built from ``columns`` (a list ``sequence_by``; empty: unchanged)."""
    if not columns:
        return batch
    missing = [c for c in columns if c not in batch.column_names]
    if missing:
        raise OptionError(
            f"option 'sequence_by': the changes have no column(s) {missing}; columns: {batch.column_names}",
            "sequence_by",
        )
    fields = [batch.column(c).combine_chunks() for c in columns]
    built = pa.StructArray.from_arrays(fields, names=list(columns))
    if SEQUENCE in batch.column_names:  # built before (by the foreachBatch wrapper), or the changes' own
        given = batch.schema.field(SEQUENCE).type
        if not pa.types.is_struct(given) or [given.field(i).name for i in range(given.num_fields)] != list(
            columns
        ):
            raise _clash(columns)
        return batch.set_column(batch.column_names.index(SEQUENCE), SEQUENCE, built)
    return batch.append_column(SEQUENCE, built)


def _clash(columns: Sequence[str]) -> OptionError:
    return OptionError(
        f"option 'sequence_by': the changes carry a column {SEQUENCE!r}, the name the sink gives the struct of "
        f"the columns {list(columns)}; rename that column",
        "sequence_by",
    )


def with_sequence_frame(columns: Sequence[str], df: Any) -> Any:
    """:func:`with_sequence` for a Spark DataFrame."""
    from pyspark.sql import functions as F

    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise OptionError(
            f"option 'sequence_by': the changes have no column(s) {missing}; columns: {df.columns}",
            "sequence_by",
        )
    if SEQUENCE in df.columns:
        given = df.schema[SEQUENCE].dataType
        if [f.name for f in getattr(given, "fields", [])] != list(columns):
            raise _clash(columns)
    return df.withColumn(
        SEQUENCE, F.struct(*[F.col("`" + c.replace("`", "``") + "`").alias(c) for c in columns])
    )


def check_type(name: str, t: pa.DataType) -> None:
    """``sequence_by``'s column ``name`` has an orderable type: integer, timestamp, or a struct of them."""
    leaves = _leaves(t)
    bad = [str(x) for x in leaves if not (pa.types.is_integer(x) or pa.types.is_timestamp(x))]
    if bad or not leaves:
        raise OptionError(
            f"option 'sequence_by': column {name!r} has type {t}; an integer or timestamp column is required "
            "(or several of them: a list of columns or a struct)",
            "sequence_by",
        )


def _leaves(t: pa.DataType) -> list[pa.DataType]:
    if pa.types.is_struct(t):
        return [leaf for i in range(t.num_fields) for leaf in _leaves(t.field(i).type)]
    return [t]


def _flat(arr: pa.Array) -> list[pa.Array]:
    """The leaf fields of a struct array, each null where the struct (or a parent) is null."""
    if not pa.types.is_struct(arr.type):
        return [arr]
    out = []
    for i in range(arr.type.num_fields):
        out.extend(_flat(arr.field(i) if arr.null_count == 0 else pc.struct_field(arr, [i])))
    return out


def order_key(column: pa.Array | pa.ChunkedArray) -> Any:
    """A sequence column as something Arrow compares, sorts and joins: the column itself, or for a struct
    its order-preserving binary encoding (null where the struct or any field is null)."""
    if not pa.types.is_struct(column.type):
        return column
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    parts, valid = [], np.ones(n, dtype=bool)
    for leaf in _flat(arr):
        valid &= leaf.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_timestamp(leaf.type):
            leaf = leaf.cast(pa.timestamp("us", leaf.type.tz)).cast(pa.int64())
        if pa.types.is_unsigned_integer(leaf.type):
            u = pc.fill_null(leaf.cast(pa.uint64()), 0).to_numpy(zero_copy_only=False).astype(np.uint64)
        else:
            u = (
                pc.fill_null(leaf.cast(pa.int64()), 0)
                .to_numpy(zero_copy_only=False)
                .astype(np.int64)
                .view(np.uint64)
            )
            u = u ^ _SIGN
        parts.append(u.astype(">u8").view(np.uint8).reshape(n, 8))
    data = np.ascontiguousarray(np.hstack(parts)) if parts else np.zeros((n, 0), np.uint8)
    width = data.shape[1]
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    validity = None if valid.all() else pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())],
        null_count=int((~valid).sum()),
    )


def greater(a: Any, b: Any) -> Any:
    """``a > b`` for sequence columns (of the same type), as Arrow's ``greater`` (null where either is)."""
    return pc.greater(order_key(a), order_key(b))


def check_nulls(
    spec_keys: Sequence[str], name: str, columns: Sequence[str], batch: pa.Table, count: int | None = None
) -> None:
    """No change of ``batch`` has a null sequence (or a null field of a struct sequence): else a
    :class:`~cdc.errors.MalformedRecordError` naming the column and the first such change's key."""
    key = order_key(batch.column(name))
    nulls = key.null_count if count is None else count
    if not key.null_count:
        return
    first = batch.filter(pc.is_null(key)).slice(0, 1).to_pylist()[0]
    where = _null_column(first, name, columns)
    raise MalformedRecordError(
        f"{nulls} change record(s) have a null sequence ({where}); first at key {key_text(first, spec_keys)}"
        f"{_position(first)}. A change without a sequence cannot be ordered; nothing was written"
    )


def _null_column(row: dict[str, Any], name: str, columns: Sequence[str]) -> str:
    if columns:
        nulls = [c for c in columns if row.get(c) is None]
        return f"column {nulls[0]!r} of sequence_by {list(columns)}" if nulls else f"column {name!r}"
    path = _null_path(row.get(name))
    return f"column {name!r}" + (f", field {path!r}" if path else "")


def _null_path(value: Any) -> str:
    if not isinstance(value, dict):
        return ""
    for k, v in value.items():
        if v is None:
            return str(k)
        inner = _null_path(v)
        if inner:
            return f"{k}.{inner}"
    return ""


def key_text(row: dict[str, Any], keys: Sequence[str]) -> str:
    """A change's key for a message: each key column and its value's ``repr``."""
    return ", ".join(f"{k}={row.get(k)!r}" for k in keys)


def _position(row: dict[str, Any]) -> str:
    if row.get(CHANNEL) is not None and row.get(POSITION) is not None:
        return f", channel {row[CHANNEL]!r} position {row[POSITION]}"
    return ""


def check_ties(keys: Sequence[str], name: str, batch: pa.Table, ignore: Sequence[str] = ()) -> None:
    """No two changes of one key have the same sequence and differ in any other column (but ``ignore``: delivery
    metadata); else a :class:`~cdc.errors.MalformedRecordError` naming the key, the sequence and the columns that
    differ. Identical changes (redeliveries) pass: the steps after this keep one of them."""
    n = batch.num_rows
    if n < 2:
        return
    seq_key = order_key(batch.column(name))
    tagged = batch.select(list(keys)).append_column("__cdc_seq_key", seq_key)
    counts = tagged.group_by([*keys, "__cdc_seq_key"]).aggregate([([], "count_all")])
    tied = counts.filter(pc.greater(counts.column("count_all"), 1))
    if tied.num_rows == 0:
        return
    rows = tagged.append_column("__cdc_row", pa.array(np.arange(n, dtype=np.int64)))
    rows = rows.join(
        tied.select([*keys, "__cdc_seq_key"]), [*keys, "__cdc_seq_key"], join_type="inner", use_threads=False
    )
    rows = rows.take(
        pc.sort_indices(
            rows,
            sort_keys=[
                *((k, "ascending") for k in keys),
                ("__cdc_seq_key", "ascending"),
                ("__cdc_row", "ascending"),
            ],
        )
    )
    compared = [c for c in batch.column_names if c not in ignore]
    records = batch.select(compared).take(rows.column("__cdc_row")).to_pylist()
    group = rows.select([*keys, "__cdc_seq_key"]).to_pylist()
    for i in range(1, len(records)):
        if group[i] != group[i - 1]:
            continue
        differ = [c for c in compared if not _same(records[i][c], records[i - 1][c])]
        if differ:
            raise tie_error(records[i], keys, name, differ)


def tie_error(row: dict[str, Any], keys: Sequence[str], name: str, differ: Sequence[str], held: str = "") -> MalformedRecordError:
    """The error for two changes of one key with the same sequence and different values (in the batch, or one
    of the batch and one the table holds: ``held`` says where, e.g. "the table holds a change at that
    sequence"): names the key, the sequence and the columns that differ (``_op``: a delete and an upsert)."""
    where = f"{held}, and " if held else ""
    return MalformedRecordError(
        f"two changes of key {key_text(row, keys)} have the same sequence ({name} {row.get(name)!r}) and "
        f"different values in column(s) {list(differ)}: {where}which one is the later cannot be told, so nothing "
        "was written. Give sequence_by a column (or several) that orders every key's changes; identical changes "
        "(redeliveries) are fine"
    )


def _same(a: Any, b: Any) -> bool:
    """Equal values, a NaN equal to a NaN (a redelivered NaN is the same value)."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
