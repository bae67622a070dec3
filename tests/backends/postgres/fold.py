"""Folding delivered change records into table state, to compare with ``SELECT *`` of the source."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa


def fold_typed(tables: list[pa.Table], keys: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Apply typed change records in delivery order; partial updates keep the unchanged columns' values, and
    the insert half of a key change takes them from the old key's row (see ``_old_key`` in cdc.model)."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    deleted: dict[tuple[Any, ...], dict[str, Any]] = {}
    for t in tables:
        for row in t.to_pylist():
            key = tuple(row[k] for k in keys)
            values = {k: v for k, v in row.items() if not k.startswith("_")}
            if row["_op"] == "delete":
                if key in state:
                    deleted[key] = state.pop(key)
                continue
            old = row.get("_old_key")
            for col in row.get("_unchanged") or []:
                values[col] = (state[key] if old is None else deleted[tuple(old[k] for k in keys)])[col]
            state[key] = values
    return state


def fold_json(tables: list[pa.Table]) -> dict[tuple[str, str], dict[str, Any]]:
    state: dict[tuple[str, str], dict[str, Any]] = {}
    deleted: dict[tuple[str, str], dict[str, Any]] = {}
    for t in tables:
        for row in t.to_pylist():
            key = (row["_table"], row["_key"])
            if row["_op"] == "delete":
                if key in state:
                    deleted[key] = state.pop(key)
                continue
            values = json.loads(row["_row"])
            old = row.get("_old_key")
            for col in row.get("_unchanged") or []:
                values[col] = (state[key] if old is None else deleted[(old["_table"], old["_key"])])[col]
            state[key] = values
    return state
