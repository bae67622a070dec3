"""Records: how a tunnel record (PlainBuffer row, action type) becomes a change row in Arrow.

Row images: what a change says about the row
---------------------------------------------
The backend declares a *partial* change schema (``_unchanged``, see :mod:`cdc.model`):

* ``PUT_ROW`` replaces the whole row in Tablestore: an ``insert`` whose columns absent from the record
  are null, ``_unchanged`` null.
* ``UPDATE_ROW`` carries only the columns it touches: an ``update`` whose ``_unchanged`` lists the
  catalog's value columns the record does not mention (null when it mentions all). A PUT cell gives
  the column's new value; a ``DELETE_ALL_VERSION`` or ``DELETE_ONE_VERSION`` cell sets it to null (the
  column is present, not unchanged).
* ``DELETE_ROW`` is a ``delete`` (values null, ``_unchanged`` null); base-data rows are whole
  ``snapshot`` rows.
* The EMR columns agree: ``__ots_column_type_<col>`` is ``PUT`` / ``DELETE_ONE_VERSION`` /
  ``DELETE_ALL_VERSION`` exactly for the columns the record mentions, null for the others (so an
  update's ``_unchanged`` is its value columns whose column type is null).

``DELETE_ONE_VERSION`` and ``max_versions > 1``: deleting a column's newest version makes an older
version visible, but the stream record names only the deleted version's timestamp, never the value
that becomes visible (and reading the row now would give a later value, not the one at this change, so
a batch would no longer be a function of its offsets). The backend delivers such a column as null, the
exact answer for tables that keep one version (the default, and what a table read as a change log
should use), and warns at start-up when the table keeps more versions; ``__ots_column_type_<col> =
DELETE_ONE_VERSION`` marks the records concerned so a pipeline can re-read those rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from cdc.backends.tablestore import plainbuffer
from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.connection import RecordPage, TunnelClient
from cdc.backends.tablestore.errors import ObjectNotExistError
from cdc.backends.tablestore.options import TablestoreOptions
from cdc.backends.tablestore.plainbuffer import DELETE_ALL_VERSION, DELETE_ONE_VERSION, Row, decode_row
from cdc.errors import MalformedRecordError, OptionError, PositionError
from cdc.model import ChangeSchema, Op

log = logging.getLogger(__name__)

RECORD_TYPE_COLUMN = "__ots_record_type__"
RECORD_TIMESTAMP_COLUMN = "__ots_record_timestamp__"
COLUMN_TYPE_PREFIX = "__ots_column_type_"
_OPS = {pb.PUT_ROW: Op.INSERT, pb.UPDATE_ROW: Op.UPDATE, pb.DELETE_ROW: Op.DELETE}
_OP_NAMES = {action: op.value for action, op in _OPS.items()}
_RECORD_TYPES = {pb.PUT_ROW: "PUT", pb.UPDATE_ROW: "UPDATE", pb.DELETE_ROW: "DELETE"}
_CELL_TYPES = {DELETE_ONE_VERSION: "DELETE_ONE_VERSION", DELETE_ALL_VERSION: "DELETE_ALL_VERSION"}
# the accepted-type codes of native/layout.c (layout_columns), by the Python types _row accepts
_ACCEPT_BYTES = 4
_ACCEPT_CODES: dict[tuple[type, ...], int] = {(int,): 0, (float, int): 1, (bool,): 2, (str,): 3, (bytes,): _ACCEPT_BYTES}


@dataclass(frozen=True)
class RecordLayout:
    """How decoded rows become Arrow rows. Picklable."""

    schema: ChangeSchema
    value_columns: tuple[str, ...]
    ots_columns: bool
    quarantine_path: str | None = None

    def arrow(self) -> pa.Schema:
        return self.schema.arrow()

    def to_batch(self, channel: str, base: bool, first_n: int, records: Sequence[Any]) -> pa.RecordBatch:
        """Arrow rows of ``records`` (``pb.Record``), the first being the ``first_n``-th of the channel.

        A record that cannot be decoded or does not fit the schema raises :class:`MalformedRecordError`
        naming the channel and the record, or, with ``quarantine_path``, is written there (one JSON file
        per record, named by channel and position, so a replayed batch rewrites the same file) and left
        out of the batch, with a warning.
        """
        schema = self.arrow()
        columns = self._compiled_columns(channel, base, first_n, records)
        if columns is None:
            columns = self._python_columns(channel, base, first_n, records)
        arrays = []
        for f, values in zip(schema, columns, strict=True):
            try:
                arrays.append(pa.array(values, type=f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                raise MalformedRecordError(f"channel {channel!r}: column {f.name!r}: {exc}") from None
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _compiled_columns(
        self, channel: str, base: bool, first_n: int, records: Sequence[Any]
    ) -> Sequence[Sequence[Any]] | None:
        """The columns by the compiled reader, or None when it is not built or a record is not its case.

        It applies :meth:`_row`'s rules in C (native/layout.c, ``layout_columns``) and declines (None)
        any record it would not lay out exactly as :meth:`_row` (malformed, a mismatched type, an unknown
        action...): the whole batch then goes the Python way, which raises or quarantines as documented.
        """
        if not plainbuffer.COMPILED or not records:
            return None
        from cdc.backends.tablestore import _plainbuffer  # built, as COMPILED says

        catalog, codes, nkeys, names = self._compiled_plan
        columns: list[list[Any]] | None = _plainbuffer.layout_columns(
            [r.record for r in records],
            [r.action_type for r in records],
            base,
            first_n,
            channel,
            catalog,
            codes,
            nkeys,
            self.schema.partial,
            self.ots_columns,
            names,
            self.value_columns,
        )
        return columns

    @cached_property
    def _compiled_plan(self) -> tuple[dict[str, int], bytes, int, tuple[str, ...]]:
        """What ``layout_columns`` looks up: column index by name (keys first), accepted-type codes."""
        accepts = self._accepts
        names = self.schema.keys + self.value_columns
        codes = bytes(_ACCEPT_CODES.get(accepts[name], _ACCEPT_BYTES) for name in names)
        strings: tuple[str, ...] = ("insert", "update", "delete", "snapshot", "PUT", "UPDATE", "DELETE")
        strings += (_CELL_TYPES[DELETE_ONE_VERSION], _CELL_TYPES[DELETE_ALL_VERSION])
        return {name: i for i, name in enumerate(names)}, codes, len(self.schema.keys), strings

    def _python_columns(
        self, channel: str, base: bool, first_n: int, records: Sequence[Any]
    ) -> Sequence[Sequence[Any]]:
        schema = self.arrow()
        rows: list[list[Any]] = []
        for i, rec in enumerate(records):
            n = first_n + i
            try:
                rows.append(self._row(channel, base, n, rec.action_type, decode_row(rec.record)))
            except MalformedRecordError as exc:
                if self.quarantine_path is None:
                    raise MalformedRecordError(f"channel {channel!r}, record {n}: {exc}") from None
                self._quarantine(channel, n, rec, exc)
        return list(zip(*rows, strict=True)) if rows else [() for _ in schema]

    def _quarantine(self, channel: str, n: int, rec: Any, exc: Exception) -> None:
        import base64
        import json
        from pathlib import Path

        assert self.quarantine_path is not None
        folder = Path(self.quarantine_path) / _safe_name(channel)
        folder.mkdir(parents=True, exist_ok=True)
        entry = {
            "channel": channel,
            "position": n,
            "action_type": int(rec.action_type),
            "error": str(exc),
            "record_base64": base64.b64encode(rec.record).decode("ascii"),
        }
        target = folder / f"{n:020d}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry))
        tmp.replace(target)
        log.warning("channel %s, record %d is malformed (%s); quarantined to %s", channel, n, exc, target)

    @cached_property
    def _accepts(self) -> dict[str, tuple[type, ...]]:
        """Python types a column accepts (exact types: a bool is not an integer)."""
        out: dict[str, tuple[type, ...]] = {}
        for f in self.schema.table:
            t = f.type
            if pa.types.is_int64(t):
                out[f.name] = (int,)
            elif pa.types.is_float64(t):
                out[f.name] = (float, int)
            elif pa.types.is_boolean(t):
                out[f.name] = (bool,)
            elif pa.types.is_string(t):
                out[f.name] = (str,)
            else:
                out[f.name] = (bytes,)
        return out

    @cached_property
    def _plan(self) -> tuple[dict[str, tuple[type, ...]], tuple[str, ...], frozenset[str], bool]:
        """What :meth:`_row` looks up per record, looked up once (it runs for every record read)."""
        return self._accepts, self.schema.keys, frozenset(self.value_columns), self.schema.partial

    def _row(self, channel: str, base: bool, n: int, action: int, row: Row) -> list[Any]:
        accepts, keys, value_set, partial = self._plan
        value_columns = self.value_columns
        values: dict[str, Any] = {}
        kinds: dict[str, str] = {}
        for name, value, cell_type, _ in row.cells:
            if name not in accepts:
                continue  # not in the catalog: not read (a projection, as in the EMR connector)
            if cell_type is None:
                values[name] = value
                kinds[name] = "PUT"
            else:
                values[name] = None
                kinds[name] = _CELL_TYPES.get(cell_type, f"UNKNOWN({cell_type})")
        if base:
            op, seq = "snapshot", n
            stamps = [c.timestamp for c in row.cells if c.timestamp is not None]
            commit_us = max(stamps) * 1000 if stamps else 0
            record_type, record_ts = "PUT", None
        else:
            op_name = _OP_NAMES.get(action)
            if op_name is None:
                raise MalformedRecordError(f"unknown action type {action}")
            info = row.sequence_info
            if info is None:
                raise MalformedRecordError("a stream record has no sequence info")
            if not 0 <= info.row_index < 1024:
                raise MalformedRecordError(f"sequence row_index {info.row_index} is outside [0, 1024)")
            op, seq = op_name, info.timestamp * 1024 + info.row_index
            commit_us, record_type, record_ts = info.timestamp, _RECORD_TYPES[action], info.timestamp
            if action == pb.DELETE_ROW:
                values, kinds = {}, {}
        out: list[Any] = [op, seq, commit_us, channel, n]
        if partial:
            # Only an UPDATE_ROW is partial: the columns it does not mention keep their values. PUT_ROW
            # replaces the whole row (absent columns are gone), DELETE_ROW and base-data rows are whole.
            unchanged = None
            if not base and action == pb.UPDATE_ROW:
                unchanged = [name for name in value_columns if name not in kinds] or None
            out.append(unchanged)
        pk = dict(row.primary_key)
        for key in keys:
            if key not in pk:
                raise MalformedRecordError(f"primary-key column {key!r} is missing")
            key_value = pk[key]
            if type(key_value) not in accepts[key]:
                raise _mismatch(key, key_value, self.schema.table)
            out.append(key_value)
        for name, value in values.items():  # the mentioned columns only: the others are null
            if value is not None and type(value) not in accepts[name] and name in value_set:
                raise _mismatch(name, value, self.schema.table)
        out.extend(map(values.get, value_columns))
        if self.ots_columns:
            out.append(record_type)
            out.append(record_ts)
            out.extend(map(kinds.get, value_columns))
        return out


def skip_past_page(channel: str, position: Any, page: RecordPage, token: str, skip: int) -> tuple[str, int]:
    """The token and skip after ``page`` (read at ``token``), for a gap ``skip`` > ``len(page.records)``.

    The server may cut its responses shorter than when ``position`` was planned: the gap then lies
    further along the ``next_token`` chain, and the records of this page count towards the skip. A
    channel that ends (or whose head is reached) before the gap raises :class:`PositionError` naming
    ``position``.
    """
    if page.finished or page.next_token == token:
        raise PositionError(f"channel {channel!r}: position {position!r} lies past the channel's last record")
    return page.next_token, skip - len(page.records)


def _safe_name(channel: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in channel)


def _mismatch(name: str, value: Any, table: pa.Schema) -> MalformedRecordError:
    t = table.field(name).type
    return MalformedRecordError(f"column {name!r}: value of type {type(value).__name__} does not fit {t}")


_PK_TYPES = {"INTEGER": pa.int64(), "STRING": pa.string(), "BINARY": pa.binary()}


def table_layout(client: TunnelClient, options: TablestoreOptions) -> RecordLayout:
    """The layout of the table's records (``DescribeTable`` through ``client``, the catalog)."""
    try:
        described = client.describe_table(options.table_name)
    except ObjectNotExistError:
        raise OptionError(
            f"option 'table.name': table {options.table_name!r} does not exist", "table.name"
        ) from None
    max_versions = described.max_versions
    if max_versions > 1:
        log.warning(
            "table %s keeps %d versions per column: a DELETE_ONE_VERSION change is delivered as the "
            "column becoming null, although an older version may become visible (see "
            "__ots_column_type_<col>)",
            options.table_name,
            max_versions,
        )
    keys: list[tuple[str, pa.DataType]] = []
    for name, kind in described.primary_key:
        if kind not in _PK_TYPES:
            raise OptionError(
                f"table {options.table_name!r}: primary-key column {name!r} has unsupported type {kind}"
            )
        keys.append((name, _PK_TYPES[kind]))
    key_types = dict(keys)
    values: list[tuple[str, pa.DataType]] = []
    for name, t in options.value_columns():
        if name in key_types:
            if key_types[name] != t:
                raise OptionError(
                    f"option 'catalog': column {name!r} is a primary-key column of type {key_types[name]}, "
                    f"not {t}",
                    "catalog",
                )
            continue
        values.append((name, t))
    if not options.catalog:
        log.warning(
            "table %s: no 'catalog' option, so only the primary-key columns (%s) are read",
            options.table_name,
            ", ".join(k for k, _ in keys),
        )
    columns = keys + values
    if options.ots_columns:
        columns += [(RECORD_TYPE_COLUMN, pa.string()), (RECORD_TIMESTAMP_COLUMN, pa.int64())]
        columns += [(COLUMN_TYPE_PREFIX + name, pa.string()) for name, _ in values]
    try:
        schema = ChangeSchema.of(columns, [k for k, _ in keys], partial=True)
    except ValueError as exc:
        raise OptionError(f"option 'catalog': {exc}", "catalog") from None
    quarantine = options.quarantine_path if options.on_malformed == "quarantine" else None
    return RecordLayout(schema, tuple(n for n, _ in values), options.ots_columns, quarantine)
