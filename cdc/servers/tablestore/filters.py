"""Column conditions and filters (``table_store_filter.proto``), as the SDK sends them.

Supported: ``SingleColumnValueFilter`` (every comparator, ``filter_if_missing``) and
``CompositeColumnValueFilter`` (NOT/AND/OR). ``ColumnPaginationFilter`` and value-transfer rules are
refused with ``OTSParameterInvalid`` rather than ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from cdc.backends.tablestore import table_pb as fpb

from .errors import param_invalid

Predicate = Callable[[dict[str, Any] | None], bool]

_VT_INTEGER, _VT_DOUBLE, _VT_BOOLEAN, _VT_STRING, _VT_BLOB = 0x0, 0x1, 0x2, 0x3, 0x7


def _variant(raw: bytes) -> Any:
    """A column value serialised without length prefix (``PlainBufferBuilder.serialize_column_value``)."""
    if not raw:
        raise param_invalid("filter column value is empty")
    vtype = raw[0]
    if vtype == _VT_INTEGER:
        return struct.unpack_from("<q", raw, 1)[0]
    if vtype == _VT_DOUBLE:
        return struct.unpack_from("<d", raw, 1)[0]
    if vtype == _VT_BOOLEAN:
        return raw[1] != 0
    if vtype in (_VT_STRING, _VT_BLOB):
        size = struct.unpack_from("<i", raw, 1)[0]
        data = bytes(raw[5 : 5 + size])
        return data.decode("utf-8") if vtype == _VT_STRING else data
    raise param_invalid(f"filter column value has unsupported type 0x{vtype:02x}")


def _compare(op: int, actual: Any, expected: Any) -> bool:
    if type(actual) is not type(expected) and not (
        isinstance(actual, int | float)
        and isinstance(expected, int | float)
        and not isinstance(actual, bool)
        and not isinstance(expected, bool)
    ):
        return bool(op == fpb.CT_NOT_EQUAL)
    if op == fpb.CT_EQUAL:
        return bool(actual == expected)
    if op == fpb.CT_NOT_EQUAL:
        return bool(actual != expected)
    if op == fpb.CT_GREATER_THAN:
        return bool(actual > expected)
    if op == fpb.CT_GREATER_EQUAL:
        return bool(actual >= expected)
    if op == fpb.CT_LESS_THAN:
        return bool(actual < expected)
    if op == fpb.CT_LESS_EQUAL:
        return bool(actual <= expected)
    raise param_invalid(f"unsupported comparator {op}")


def parse_filter(raw: bytes) -> Predicate:
    """Build a predicate over a row's columns (``None`` = the row does not exist)."""
    try:
        proto = fpb.Filter.FromString(raw)
    except Exception as exc:  # noqa: BLE001 - protobuf DecodeError and missing required fields
        raise param_invalid(f"column condition is not a valid Filter: {exc}") from exc
    return _build(proto)


def _build(proto: Any) -> Predicate:
    if proto.type == fpb.FT_SINGLE_COLUMN_VALUE:
        single = fpb.SingleColumnValueFilter.FromString(proto.filter)
        if single.HasField("value_trans_rule"):
            raise param_invalid("value transfer rules are not supported by the local server")
        name, op, missing = single.column_name, single.comparator, single.filter_if_missing
        expected = None if op in (fpb.CT_EXIST, fpb.CT_NOT_EXIST) else _variant(single.column_value)

        def single_pred(columns: dict[str, Any] | None) -> bool:
            present = columns is not None and name in columns
            if op == fpb.CT_EXIST:
                return present
            if op == fpb.CT_NOT_EXIST:
                return not present
            if not present:
                return not missing
            assert columns is not None
            return _compare(op, columns[name], expected)

        return single_pred
    if proto.type == fpb.FT_COMPOSITE_COLUMN_VALUE:
        composite = fpb.CompositeColumnValueFilter.FromString(proto.filter)
        subs = [_build(sub) for sub in composite.sub_filters]
        if composite.combinator == fpb.LO_NOT:
            if len(subs) != 1:
                raise param_invalid("NOT takes exactly one sub-condition")
            return lambda columns: not subs[0](columns)
        if composite.combinator == fpb.LO_AND:
            return lambda columns: all(s(columns) for s in subs)
        if composite.combinator == fpb.LO_OR:
            return lambda columns: any(s(columns) for s in subs)
        raise param_invalid(f"unsupported logical operator {composite.combinator}")
    raise param_invalid(f"filter type {proto.type} is not supported by the local server")
