"""Folding delivered change records into table state, to compare with ``SELECT *`` of the source."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa


def fold_typed(tables: list[pa.Table], keys: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Apply typed change records in delivery order; partial updates keep the unchanged columns' values."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for t in tables:
        for row in t.to_pylist():
            key = tuple(row[k] for k in keys)
            values = {k: v for k, v in row.items() if not k.startswith("_")}
            if row["_op"] == "delete":
                state.pop(key, None)
                continue
            for col in row.get("_unchanged") or []:
                values[col] = state[key][col]
            state[key] = values
    return state


def fold_json(tables: list[pa.Table]) -> dict[tuple[str, str], dict[str, Any]]:
    state: dict[tuple[str, str], dict[str, Any]] = {}
    for t in tables:
        for row in t.to_pylist():
            key = (row["_table"], row["_key"])
            if row["_op"] == "delete":
                state.pop(key, None)
                continue
            values = json.loads(row["_row"])
            for col in row.get("_unchanged") or []:
                values[col] = state[key][col]
            state[key] = values
    return state
