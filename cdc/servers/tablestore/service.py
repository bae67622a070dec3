"""Protobuf request handlers: the table API (``/PutRow``...) and the tunnel API (``/tunnel/...``).

Each handler takes the request body and returns the serialized response body, or raises
:class:`~cdc.servers.tablestore.errors.OTSError`. Table messages come from the SDK's own
``tablestore.protobuf.table_store_pb2``; tunnel messages from :mod:`cdc.backends.tablestore.tunnel_pb`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc.backends.tablestore import table_pb as pb
from cdc.backends.tablestore import tunnel_pb as tpb
from cdc.backends.tablestore.plainbuffer import (
    Cell,
    PlainBufferError,
    Row,
    decode_row,
    encode_row,
    encode_rows,
)

from .errors import param_invalid
from .filters import Predicate, parse_filter
from .limits import MAX_COLUMNS_TO_GET, check_write_size, data_size
from .rows import ACTION_DELETE, ACTION_PUT, ACTION_UPDATE, WriteOp
from .store import Store
from .tables import PK_TYPES
from .tokens import make_token

Handler = Callable[[Store, bytes], bytes]

_DEFINED_TYPES = {pb.DCT_INTEGER, pb.DCT_DOUBLE, pb.DCT_BOOLEAN, pb.DCT_STRING, pb.DCT_BLOB}
_MAX_BATCH_ROWS = 200
_MAX_RANGE_ROWS = 5000
# DescribeTableResponse.table_status (field 4, varint) = ACTIVE (1). The service's proto marks it required
# and the Node.js SDK refuses a response without it, but the Python SDK's table_store_pb2 omits the field,
# so it is appended as raw bytes (fields may come in any order).
_TABLE_STATUS_ACTIVE = bytes([4 << 3, 1])


def _parse(message_type: Any, body: bytes) -> Any:
    try:
        return message_type.FromString(body)
    except Exception as exc:  # noqa: BLE001 - DecodeError, missing required fields
        raise param_invalid(f"request is not a valid {message_type.DESCRIPTOR.name}: {exc}") from exc


def _row(data: bytes, what: str) -> Row:
    try:
        return decode_row(data)
    except PlainBufferError as exc:
        raise param_invalid(f"{what}: {exc}") from exc


def _consumed(msg: Any, read: int = 0, write: int = 0) -> None:
    msg.capacity_unit.read = read
    msg.capacity_unit.write = write


# ---------------------------------------------------------------------------------------------- tables


def create_table(store: Store, body: bytes) -> bytes:
    req = _parse(pb.CreateTableRequest, body)
    meta = req.table_meta
    pk = []
    for col in meta.primary_key:
        if col.type not in PK_TYPES:
            raise param_invalid(f"primary key {col.name!r} has an unsupported type {col.type}")
        pk.append((col.name, PK_TYPES[col.type], col.HasField("option") and col.option == pb.AUTO_INCREMENT))
    defined = []
    for col in meta.defined_column:
        if col.type not in _DEFINED_TYPES:
            raise param_invalid(f"defined column {col.name!r} has an unsupported type {col.type}")
        defined.append((col.name, int(col.type)))
    opts = req.table_options
    options = {
        "time_to_live": opts.time_to_live if opts.HasField("time_to_live") else -1,
        "max_versions": opts.max_versions if opts.HasField("max_versions") else 1,
        "deviation": opts.deviation_cell_version_in_sec
        if opts.HasField("deviation_cell_version_in_sec")
        else 86400,
        "allow_update": opts.allow_update if opts.HasField("allow_update") else True,
    }
    stream = {"enable_stream": True, "expiration_time": 168}
    if req.HasField("stream_spec"):
        stream = {
            "enable_stream": req.stream_spec.enable_stream,
            "expiration_time": req.stream_spec.expiration_time or 168,
        }
    store.create_table(meta.table_name, pk, defined, options, stream)
    return pb.CreateTableResponse().SerializeToString()  # type: ignore[no-any-return]


def list_table(store: Store, body: bytes) -> bytes:
    _parse(pb.ListTableRequest, body)
    return pb.ListTableResponse(table_names=store.list_tables()).SerializeToString()  # type: ignore[no-any-return]


def delete_table(store: Store, body: bytes) -> bytes:
    req = _parse(pb.DeleteTableRequest, body)
    store.delete_table(req.table_name)
    return pb.DeleteTableResponse().SerializeToString()  # type: ignore[no-any-return]


def describe_table(store: Store, body: bytes) -> bytes:
    req = _parse(pb.DescribeTableRequest, body)
    info = store.table(req.table_name)
    resp = pb.DescribeTableResponse()
    resp.table_meta.table_name = info.name
    type_ids = {v: k for k, v in PK_TYPES.items()}
    for name, ptype in info.pk:
        col = resp.table_meta.primary_key.add(name=name, type=type_ids[ptype])
        if name in info.auto_increment:
            col.option = pb.AUTO_INCREMENT
    for name, dtype in info.defined:
        resp.table_meta.defined_column.add(name=name, type=dtype)
    resp.reserved_throughput_details.capacity_unit.read = 0
    resp.reserved_throughput_details.capacity_unit.write = 0
    resp.reserved_throughput_details.last_increase_time = info.created_ms // 1000
    o = info.options
    resp.table_options.time_to_live = o["time_to_live"]
    resp.table_options.max_versions = o["max_versions"]
    resp.table_options.deviation_cell_version_in_sec = o["deviation"]
    resp.table_options.allow_update = o["allow_update"]
    s = info.stream
    resp.stream_details.enable_stream = s["enable_stream"]
    resp.stream_details.stream_id = s["stream_id"]
    resp.stream_details.expiration_time = s["expiration_time"]
    resp.stream_details.last_enable_time = s["last_enable_time"]
    return resp.SerializeToString() + _TABLE_STATUS_ACTIVE  # type: ignore[no-any-return]


def _condition(cond: Any) -> tuple[int, Predicate | None]:
    predicate = (
        parse_filter(cond.column_condition)
        if cond.HasField("column_condition") and cond.column_condition
        else None
    )
    return int(cond.row_existence), predicate


def _op(kind: int, row_bytes: bytes, cond: Any, return_content: Any | None, what: str) -> WriteOp:
    row = _row(row_bytes, what)
    if kind == ACTION_DELETE:
        row = Row(row.primary_key)
    expect, predicate = _condition(cond)
    return_pk = return_content is not None and return_content.return_type == pb.RT_PK
    return WriteOp(kind, row, expect, predicate, return_pk)


def _returned(op: WriteOp, pk: Any) -> bytes:
    return encode_row(Row(pk)) if op.return_pk else b""


def _single_write(store: Store, table: str, op: WriteOp, resp: Any) -> bytes:
    [result] = store.write(table, [op])
    if not result.ok:
        assert result.error is not None
        raise result.error
    _consumed(resp.consumed, write=1)
    returned = _returned(op, result.primary_key)
    if returned:
        resp.row = returned
    return resp.SerializeToString()  # type: ignore[no-any-return]


def put_row(store: Store, body: bytes) -> bytes:
    req = _parse(pb.PutRowRequest, body)
    op = _op(
        ACTION_PUT,
        req.row,
        req.condition,
        req.return_content if req.HasField("return_content") else None,
        "PutRow row",
    )
    return _single_write(store, req.table_name, op, pb.PutRowResponse())


def update_row(store: Store, body: bytes) -> bytes:
    req = _parse(pb.UpdateRowRequest, body)
    rc = req.return_content if req.HasField("return_content") else None
    op = _op(ACTION_UPDATE, req.row_change, req.condition, rc, "UpdateRow row_change")
    return _single_write(store, req.table_name, op, pb.UpdateRowResponse())


def delete_row(store: Store, body: bytes) -> bytes:
    req = _parse(pb.DeleteRowRequest, body)
    rc = req.return_content if req.HasField("return_content") else None
    op = _op(ACTION_DELETE, req.primary_key, req.condition, rc, "DeleteRow primary_key")
    return _single_write(store, req.table_name, op, pb.DeleteRowResponse())


def batch_write_row(store: Store, body: bytes) -> bytes:
    req = _parse(pb.BatchWriteRowRequest, body)
    total = sum(len(t.rows) for t in req.tables)
    if total > _MAX_BATCH_ROWS:
        raise param_invalid(f"Rows count exceeds the upper limit: {_MAX_BATCH_ROWS}.")
    kinds = {pb.PUT: ACTION_PUT, pb.UPDATE: ACTION_UPDATE, pb.DELETE: ACTION_DELETE}
    resp = pb.BatchWriteRowResponse()
    batches: list[tuple[str, list[WriteOp]]] = []
    for table_req in req.tables:
        store.table(table_req.table_name)
        ops = []
        for i, r in enumerate(table_req.rows):
            rc = r.return_content if r.HasField("return_content") else None
            ops.append(_op(kinds[r.type], r.row_change, r.condition, rc, f"BatchWriteRow row {i}"))
        batches.append((table_req.table_name, ops))
    check_write_size(sum(data_size(op.row.primary_key, op.row.cells) for _, ops in batches for op in ops))
    for table_name, ops in batches:
        results = store.write(table_name, ops)
        table_resp = resp.tables.add(table_name=table_name)
        for op, result in zip(ops, results, strict=True):
            item = table_resp.rows.add(is_ok=result.ok)
            if result.ok:
                _consumed(item.consumed, write=1)
                returned = _returned(op, result.primary_key)
                if returned:
                    item.row = returned
            else:
                assert result.error is not None
                item.error.code = result.error.code
                item.error.message = result.error.message
    return resp.SerializeToString()  # type: ignore[no-any-return]


def _columns_to_get(req: Any) -> list[str]:
    columns = list(req.columns_to_get)
    if len(columns) > MAX_COLUMNS_TO_GET:
        raise param_invalid(f"The number of columns to get must be in range: [0, {MAX_COLUMNS_TO_GET}].")
    return columns


def _project(row: Row, columns: list[str], predicate: Predicate | None) -> Row | None:
    if predicate is not None and not predicate({c.name: c.value for c in row.cells}):
        return None
    if not columns:
        return row
    wanted = set(columns)
    pk_names = {n for n, _ in row.primary_key}
    cells = tuple(c for c in row.cells if c.name in wanted)
    if not cells and not (wanted & pk_names):
        return None
    return Row(row.primary_key, cells)


def _for_sdk(row: Row) -> Row:
    return Row(row.primary_key, tuple(Cell(c.name, c.value, None, c.timestamp) for c in row.cells))


def get_row(store: Store, body: bytes) -> bytes:
    req = _parse(pb.GetRowRequest, body)
    pk = _row(req.primary_key, "GetRow primary_key").primary_key
    predicate = parse_filter(req.filter) if req.HasField("filter") and req.filter else None
    row = store.get_row(req.table_name, pk)
    projected = None if row is None else _project(row, _columns_to_get(req), predicate)
    resp = pb.GetRowResponse()
    _consumed(resp.consumed, read=1)
    resp.row = encode_row(_for_sdk(projected)) if projected is not None else b""
    return resp.SerializeToString()  # type: ignore[no-any-return]


def get_range(store: Store, body: bytes) -> bytes:
    req = _parse(pb.GetRangeRequest, body)
    start = _row(req.inclusive_start_primary_key, "GetRange inclusive_start_primary_key").primary_key
    end = _row(req.exclusive_end_primary_key, "GetRange exclusive_end_primary_key").primary_key
    if req.HasField("limit") and req.limit <= 0:
        raise param_invalid(f"The limit of GetRange must be greater than 0, got {req.limit}.")
    limit = min(req.limit if req.HasField("limit") else _MAX_RANGE_ROWS, _MAX_RANGE_ROWS)
    predicate = parse_filter(req.filter) if req.HasField("filter") and req.filter else None
    rows, next_row = store.get_range(req.table_name, start, end, req.direction == pb.FORWARD, limit)
    columns = _columns_to_get(req)
    out = [p for p in (_project(r, columns, predicate) for r in rows) if p is not None]
    resp = pb.GetRangeResponse()
    _consumed(resp.consumed, read=max(1, len(rows)))
    resp.rows = encode_rows(_for_sdk(r) for r in out) if out else b""
    if next_row is not None:
        resp.next_start_primary_key = encode_row(Row(decode_row(next_row).primary_key))
    return resp.SerializeToString()  # type: ignore[no-any-return]


_SPLIT_UNIT_BYTES = 100 * 1024 * 1024  # the request's split_size is in 100 MB unless it names a unit


def compute_split_points_by_size(store: Store, body: bytes) -> bytes:
    """Split points every ``split_size`` (estimated) bytes: PlainBuffer primary keys, in increasing order,
    each as long as the table's key (the service may omit trailing INF_MIN columns; none are here), and
    one location hint for every range (this server has one: an empty location, as the service sends
    when a location is not suitable to be seen)."""
    req = _parse(pb.ComputeSplitPointsBySizeRequest, body)
    unit = req.split_size_unit_in_byte if req.HasField("split_size_unit_in_byte") else _SPLIT_UNIT_BYTES
    if req.split_size <= 0 or unit <= 0:
        raise param_invalid(f"split size must be greater than 0, got {req.split_size} x {unit} bytes")
    info = store.table(req.table_name)
    points = store.split_points(req.table_name, req.split_size * unit)
    resp = pb.ComputeSplitPointsBySizeResponse()
    _consumed(resp.consumed, read=1 + len(points))
    type_ids = {v: k for k, v in PK_TYPES.items()}
    for name, ptype in info.pk:
        resp.schema.add(name=name, type=type_ids[ptype])
    resp.split_points.extend(encode_row(point) for point in points)
    resp.locations.add(location="", repeat=len(points) + 1)
    return resp.SerializeToString()  # type: ignore[no-any-return]


TABLE_API: dict[str, Handler] = {
    "/CreateTable": create_table,
    "/ListTable": list_table,
    "/DeleteTable": delete_table,
    "/DescribeTable": describe_table,
    "/PutRow": put_row,
    "/UpdateRow": update_row,
    "/DeleteRow": delete_row,
    "/BatchWriteRow": batch_write_row,
    "/GetRow": get_row,
    "/GetRange": get_range,
    "/ComputeSplitPointsBySize": compute_split_points_by_size,
}


# ---------------------------------------------------------------------------------------------- tunnels


def _tunnel_info(msg: Any, info: dict[str, Any], instance: str) -> None:
    msg.tunnel_id = info["tunnel_id"]
    msg.tunnel_type = info["type"]
    msg.table_name = info["table"]
    msg.instance_name = instance
    msg.stream_id = info["stream_id"]
    msg.stage = info["stage"]
    msg.expired = bool(info["expired"])
    msg.tunnel_name = info["name"]
    msg.create_time = info["created_ms"]


def create_tunnel(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.CreateTunnelRequest, body)
    types = {v: k for k, v in tpb.TUNNEL_TYPES.items()}
    if req.tunnel.tunnel_type not in types:
        raise param_invalid(
            f"tunnel type {req.tunnel.tunnel_type}: expected one of {sorted(tpb.TUNNEL_TYPES)}"
        )
    tunnel_id = store.create_tunnel(
        req.tunnel.table_name, req.tunnel.tunnel_name, types[req.tunnel.tunnel_type]
    )
    return tpb.CreateTunnelResponse(tunnel_id=tunnel_id).SerializeToString()  # type: ignore[no-any-return]


def delete_tunnel(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.DeleteTunnelRequest, body)
    tunnel_id = store.find_tunnel(req.table_name, req.tunnel_name, req.tunnel_id or None)
    store.delete_tunnel(tunnel_id)
    return tpb.DeleteTunnelResponse().SerializeToString()  # type: ignore[no-any-return]


def list_tunnel(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.ListTunnelRequest, body)
    resp = tpb.ListTunnelResponse()
    for info in store.list_tunnels(req.table_name or None):
        _tunnel_info(resp.tunnels.add(), info, store.instance)
    return resp.SerializeToString()  # type: ignore[no-any-return]


def describe_tunnel(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.DescribeTunnelRequest, body)
    tunnel_id = store.find_tunnel(req.table_name, req.tunnel_name, req.tunnel_id or None)
    info, channels = store.describe_tunnel(tunnel_id)
    resp = tpb.DescribeTunnelResponse()
    _tunnel_info(resp.tunnel, info, store.instance)
    stream = [c["consume_point_ns"] for c in channels if c["kind"] != "BaseData"]
    resp.tunnel_rpo = min(stream, default=0)  # the slowest stream channel's point, as the service reports
    for c in channels:
        msg = resp.channels.add(
            channel_id=c["channel_id"], channel_type=c["kind"], channel_status=c["status"]
        )
        msg.client_id = c["owner"] if c["status"] == "OPEN" else ""
        msg.channel_rpo = c["consume_point_ns"]
        msg.parent_channel_ids.extend(c["parents"])
        msg.start_token = _start_token(c)
        msg.sealed = bool(c["sealed"])
    return resp.SerializeToString()  # type: ignore[no-any-return]


def _start_token(channel: dict[str, Any]) -> str:
    return make_token(channel["channel_id"], channel["held_from"])


def connect(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.ConnectRequest, body)
    timeout = req.client_config.timeout if req.HasField("client_config") else 0
    tag = req.client_config.client_tag if req.HasField("client_config") else None
    client_id = store.connect(req.tunnel_id, int(timeout), tag)
    return tpb.ConnectResponse(client_id=client_id).SerializeToString()  # type: ignore[no-any-return]


def heartbeat(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.HeartbeatRequest, body)
    reported = [(c.channel_id, c.version, c.status) for c in req.channels]
    resp = tpb.HeartbeatResponse()
    for channel_id, version, status in store.heartbeat(req.tunnel_id, req.client_id, reported):
        resp.channels.add(channel_id=channel_id, version=version, status=status)
    return resp.SerializeToString()  # type: ignore[no-any-return]


def shutdown(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.ShutdownRequest, body)
    store.shutdown(req.tunnel_id, req.client_id)
    return tpb.ShutdownResponse().SerializeToString()  # type: ignore[no-any-return]


def get_checkpoint(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.GetCheckpointRequest, body)
    token, seqno = store.get_checkpoint(req.tunnel_id, req.client_id, req.channel_id)
    return tpb.GetCheckpointResponse(checkpoint=token, sequence_number=seqno).SerializeToString()  # type: ignore[no-any-return]


def checkpoint(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.CheckpointRequest, body)
    store.checkpoint(req.tunnel_id, req.client_id, req.channel_id, req.checkpoint, req.sequence_number)
    return tpb.CheckpointResponse().SerializeToString()  # type: ignore[no-any-return]


def read_records(store: Store, body: bytes) -> bytes:
    req = _parse(tpb.ReadRecordsRequest, body)
    result = store.read_records(req.tunnel_id, req.client_id, req.channel_id, req.token)
    resp = tpb.ReadRecordsResponse(next_token=result.next_token, may_more_record=result.more)
    for action, record in result.records:
        resp.records.add(action_type=action, record=record)
    return resp.SerializeToString()  # type: ignore[no-any-return]


TUNNEL_API: dict[str, Handler] = {
    "/tunnel/create": create_tunnel,
    "/tunnel/delete": delete_tunnel,
    "/tunnel/list": list_tunnel,
    "/tunnel/describe": describe_tunnel,
    "/tunnel/connect": connect,
    "/tunnel/heartbeat": heartbeat,
    "/tunnel/shutdown": shutdown,
    "/tunnel/getcheckpoint": get_checkpoint,
    "/tunnel/checkpoint": checkpoint,
    "/tunnel/readrecords": read_records,
}

HANDLERS: dict[str, Handler] = {**TABLE_API, **TUNNEL_API}
