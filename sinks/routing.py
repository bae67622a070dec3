"""A routing sink for many-table queries: each table's changes into its own Delta table.

A many-table query (``backend=postgres`` with several ``tables``) carries ``_table``, ``_key`` and
``_row`` (JSON objects) instead of typed columns, because a Spark source has one schema. This sink splits
every batch by ``_table``, decodes each table's keys and rows into columns, and hands them to a
:class:`~sinks.delta.DeltaUpsertSink` of that table (``<root>/<table>``; keys: the key object's fields,
i.e. the primary key read from the catalog). Each table commits with its own Delta application id
(``<app id>/<table>``) and the batch id, so a replayed batch skips the tables it already committed and
applies the others. A column that appears in a table's rows (``ALTER TABLE ... ADD COLUMN``) is added to
its Delta table by the upsert sink's schema evolution, without a restart.

An update that changed a key arrives as a delete and an insert whose ``_old_key`` is ``{_table, _key}``
(see :mod:`cdc.model`); it is decoded into the table's key columns, so the table's sink completes the
insert's unchanged columns from the old key's row.

Types come from JSON: integers -> long, numbers -> double, booleans, strings (numerics, timestamps and
dates arrive as strings, as PostgreSQL prints them: cast them downstream where needed). A column whose
values in a batch are all null takes the Delta table's type, else string. ::

    sink = RoutingDeltaSink("/lake/shop")
    changes.writeStream.foreachBatch(sink).option("checkpointLocation", ck).start()
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.model import OLD_KEY
from sinks.delta import DeltaUpsertSink

log = logging.getLogger(__name__)

_META = ("_op", "_seq", "_commit_ts", "_channel", "_position", "_unchanged")


class RoutingDeltaSink:
    """``foreachBatch`` sink of a many-table query: ``root/<schema.table>`` per table (see the module)."""

    def __init__(self, root: str, *, app_id: str | None = None, **sink_options: Any) -> None:
        self.root = str(root).rstrip("/")
        self.app_id = app_id
        self.sink_options = sink_options
        self._sinks: dict[str, DeltaUpsertSink] = {}

    def __repr__(self) -> str:
        return f"RoutingDeltaSink({self.root!r}, tables={sorted(self._sinks)})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sinks": {}}

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def sink(self, table: str, keys: tuple[str, ...]) -> DeltaUpsertSink:
        if table not in self._sinks:
            self._sinks[table] = DeltaUpsertSink(self.path(table), list(keys), **self.sink_options)
        return self._sinks[table]

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        app = self.app_id
        if app is None:
            qid = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
            app = f"cdc-tunnel-{qid}"
        self.write(batch_df.toArrow(), batch_id, app)

    def write(self, changes: pa.Table, batch_id: int, app_id: str) -> dict[str, bool]:
        """Apply one batch; returns, per table in the batch, whether it was applied (False: already committed)."""
        out: dict[str, bool] = {}
        if changes.num_rows == 0:
            return out
        for table in sorted(set(changes.column("_table").to_pylist())):
            part = changes.filter(pc.equal(changes.column("_table"), table))
            keys, typed = self._decode(table, part)
            out[table] = self.sink(table, keys).write(typed, batch_id, app_id=f"{app_id}/{table}")
        return out

    def _decode(self, table: str, part: pa.Table) -> tuple[tuple[str, ...], pa.Table]:
        key_objs = [json.loads(k) for k in part.column("_key").to_pylist()]
        rows = [json.loads(r) if r is not None else None for r in part.column("_row").to_pylist()]
        keys = tuple(key_objs[0])
        columns: dict[str, None] = dict.fromkeys(keys)
        for r in rows:
            columns.update(dict.fromkeys(r or ()))
        try:  # the Delta table's types for columns a batch leaves all null
            existing = self.sink(table, keys).engine().schema()
        except Exception:  # noqa: BLE001 - no table yet, or not readable: fall back to strings
            existing = None
        arrays: dict[str, pa.Array] = {c: part.column(c).combine_chunks() for c in _META if c in part.column_names}
        for c in columns:
            values = [(r if r is not None else k).get(c) for r, k in zip(rows, key_objs, strict=True)]
            arr = pa.array(values)
            if pa.types.is_null(arr.type):
                target = existing.field(c).type if existing is not None and c in existing.names else pa.string()
                arr = pa.array(values, type=target)
            arrays[c] = arr
        if OLD_KEY in part.column_names:
            arrays[OLD_KEY] = self._old_keys(part.column(OLD_KEY).to_pylist(), keys, arrays)
        return keys, pa.table(arrays)

    @staticmethod
    def _old_keys(old: list[dict[str, Any] | None], keys: tuple[str, ...], arrays: dict[str, pa.Array]) -> pa.Array:
        """``_old_key`` ``{_table, _key}`` as a struct of the table's key columns, typed like them."""
        objs = [None if o is None else json.loads(o["_key"]) for o in old]
        children = [pa.array([None if o is None else o.get(k) for o in objs], type=arrays[k].type) for k in keys]
        fields = [pa.field(k, arrays[k].type) for k in keys]
        return pa.StructArray.from_arrays(children, fields=fields, mask=pa.array([o is None for o in objs], pa.bool_()))
