"""Protobuf messages of the Tablestore Tunnel service, built at import time (no generated code, no protoc).

Field numbers, labels and types match the public Java SDK's ``tunnel_service_api.proto`` (proto2,
package ``com.alicloud.openservices.tablestore.core.protocol``), so bytes produced here are read by the
real service and vice versa. The descriptors live in a private :class:`DescriptorPool`, so they never
clash with the ``tablestore`` SDK's own generated modules.

API: every message is a module attribute, a normal protobuf message class::

    from cdc.backends.tablestore import tunnel_pb as pb

    req = pb.ReadRecordsRequest(tunnel_id="t", client_id="c", channel_id="ch", token="tok")
    body = req.SerializeToString()
    resp = pb.ReadRecordsResponse.FromString(body_from_server)
    for rec in resp.records:          # rec.action_type is pb.PUT_ROW / pb.UPDATE_ROW / pb.DELETE_ROW
        ...

Messages: ``Error``, ``Tunnel``, ``TunnelInfo``, ``ChannelInfo``, ``Channel``, ``ClientConfig``,
``Record``, ``Token``, ``TokenContent``, ``TokenContentV2``, ``StreamTunnelConfig``, ``StreamColumn``,
``StreamRecordOptions``, and the request/response pair of every call:
``CreateTunnel``, ``DeleteTunnel``, ``ListTunnel``, ``DescribeTunnel``, ``Connect``, ``Heartbeat``,
``Shutdown``, ``GetCheckpoint``, ``Checkpoint``, ``ReadRecords``, ``GetRpo`` (each ``<Name>Request`` and
``<Name>Response``). Enums are module-level ints: ``BaseData``/``Stream``/``BaseAndStream``
(``TunnelType``), ``OPEN``/``CLOSING``/``CLOSE``/``TERMINATED`` (``ChannelStatus``, the versioned
heartbeat enum; DescribeTunnel reports status as a string that may also be ``WAIT``),
``PUT_ROW``/``UPDATE_ROW``/``DELETE_ROW`` (``ActionType``), ``LATEST``/``EARLIEST``, and the
``StreamColumnType`` values. :data:`URIS` maps each call to its HTTP path.

Extensions (NOT in the public proto; field numbers >= 100 so the real service ignores them and a
client that does not know them skips them as unknown fields). The tunnel protocol has no channel
lineage and no way to learn where a channel's log begins once its checkpoint moved, so our local
server reports these in ``ChannelInfo`` (DescribeTunnel); a client must work without them (real service):

* ``parent_channel_ids`` (100, repeated string): the channels this one was split or merged from.
  Without it, the backend sees no lineage (it cannot order a child after its parents; the server's WAIT
  state still does).
* ``start_token`` (101, string): the token at which the channel's log begins (its initial checkpoint),
  i.e. its earliest readable position: once old records expire (``OTSTrimmedDataAccess``) it should
  name the first record still held, so ``failOnDataLoss=false`` can skip ahead to it. Without it, a
  channel's earliest position is the tunnel's current checkpoint.
* ``sealed`` (102, bool): no record will ever be appended to this channel (closed by a split or merge,
  or a base-data channel). Without it, a channel counts as sealed once a read returned ``"finished"``.

What the client (``cdc.backends.tablestore.connection`` / ``backend``) relies on from a server, for
deterministic batches:

* A token names a fixed point in a channel's append-only log. ``ReadRecords(token)`` returns records
  that directly follow that point (possibly none, at most a server limit) and ``next_token`` names the
  point right after the last returned record (``next_token == token`` is allowed when nothing was
  returned). Re-reading a token later returns the same records, or more of them if the first read
  stopped at the head: the record sequence from a token, following ``next_token``, never changes.
* ``next_token == "finished"`` only once the channel is sealed and the returned records reach its end.
* ``ReadRecords`` accepts any live client id of the tunnel for any channel that is not in ``WAIT``
  (executors read with the driver's client id; readers on other hosts never own the channel).
"""

from __future__ import annotations

from typing import Any

from cdc.backends.tablestore.proto import Field, build

PACKAGE = "com.alicloud.openservices.tablestore.core.protocol"
FINISHED_TOKEN = "finished"
"""The token the service hands out when a channel is exhausted for good."""

URIS: dict[str, str] = {
    "create": "/tunnel/create",
    "delete": "/tunnel/delete",
    "list": "/tunnel/list",
    "describe": "/tunnel/describe",
    "connect": "/tunnel/connect",
    "heartbeat": "/tunnel/heartbeat",
    "shutdown": "/tunnel/shutdown",
    "getcheckpoint": "/tunnel/getcheckpoint",
    "readrecords": "/tunnel/readrecords",
    "checkpoint": "/tunnel/checkpoint",
    "getrpo": "/tunnel/getrpo",
}

_ENUMS: dict[str, list[tuple[str, int]]] = {
    "TunnelType": [("BaseData", 1), ("Stream", 2), ("BaseAndStream", 3)],
    "ChannelStatus": [("OPEN", 1), ("CLOSING", 2), ("CLOSE", 3), ("TERMINATED", 4)],
    "ActionType": [("PUT_ROW", 1), ("UPDATE_ROW", 2), ("DELETE_ROW", 3)],
    "StartOffsetFlag": [("LATEST", 0), ("EARLIEST", 1)],
    "StreamColumnType": [("INVALID", 0), ("SPECIFIED_COLUMN", 1), ("INPUT_COLUMNS", 2), ("ALL_COLUMNS", 3)],
}

_MESSAGES: dict[str, list[Field]] = {
    "Error": [
        ("code", 1, "req", "string"),
        ("message", 2, "opt", "string"),
        ("tunnel_id", 3, "opt", "string"),
    ],
    "Tunnel": [
        ("table_name", 1, "req", "string"),
        ("tunnel_name", 3, "req", "string"),
        ("tunnel_type", 4, "req", "TunnelType"),
        ("StreamTunnelConfig", 5, "opt", "StreamTunnelConfig"),
        ("stream_record_options", 7, "opt", "StreamRecordOptions"),
    ],
    "CreateTunnelRequest": [("tunnel", 1, "req", "Tunnel")],
    "CreateTunnelResponse": [("tunnel_id", 1, "req", "string")],
    "DeleteTunnelRequest": [
        ("table_name", 1, "req", "string"),
        ("tunnel_name", 2, "req", "string"),
        ("tunnel_id", 3, "opt", "string"),
    ],
    "DeleteTunnelResponse": [],
    "ListTunnelRequest": [("table_name", 1, "opt", "string")],
    "TunnelInfo": [
        ("tunnel_id", 1, "req", "string"),
        ("tunnel_type", 2, "req", "string"),
        ("table_name", 3, "req", "string"),
        ("instance_name", 4, "req", "string"),
        ("stream_id", 5, "req", "string"),
        ("stage", 6, "req", "string"),
        ("expired", 7, "opt", "bool"),
        ("tunnel_name", 8, "opt", "string"),
        ("public", 9, "opt", "bool"),
        ("stream_tunnel_config", 10, "opt", "StreamTunnelConfig"),
        ("create_time", 11, "opt", "int64"),
        ("stream_record_options", 14, "opt", "StreamRecordOptions"),
    ],
    "ListTunnelResponse": [("tunnels", 1, "rep", "TunnelInfo")],
    "DescribeTunnelRequest": [
        ("table_name", 1, "req", "string"),
        ("tunnel_name", 2, "req", "string"),
        ("tunnel_id", 3, "opt", "string"),
    ],
    "ChannelInfo": [
        ("channel_id", 1, "req", "string"),
        ("channel_type", 2, "opt", "string"),
        ("channel_status", 3, "opt", "string"),
        ("client_id", 4, "opt", "string"),
        ("channel_rpo", 5, "opt", "int64"),
        ("channel_count", 6, "opt", "int64"),
        # cdc-tunnel extensions (see the module docstring)
        ("parent_channel_ids", 100, "rep", "string"),
        ("start_token", 101, "opt", "string"),
        ("sealed", 102, "opt", "bool"),
    ],
    "DescribeTunnelResponse": [
        ("tunnel", 1, "req", "TunnelInfo"),
        ("channels", 2, "rep", "ChannelInfo"),
        ("tunnel_rpo", 3, "opt", "int64"),
    ],
    "GetRpoRequest": [("tunnel_id", 1, "opt", "string")],
    "GetRpoResponse": [("rpo_infos", 1, "opt", "bytes"), ("tunnel_rpo_infos", 2, "opt", "bytes")],
    "ClientConfig": [("timeout", 1, "opt", "int64"), ("client_tag", 2, "opt", "string")],
    "ConnectRequest": [("tunnel_id", 1, "req", "string"), ("client_config", 2, "opt", "ClientConfig")],
    "ConnectResponse": [("client_id", 1, "req", "string")],
    "Channel": [
        ("channel_id", 1, "req", "string"),
        ("version", 2, "req", "int64"),
        ("status", 3, "req", "ChannelStatus"),
        ("detail", 4, "opt", "bytes"),
    ],
    "HeartbeatRequest": [
        ("tunnel_id", 1, "req", "string"),
        ("client_id", 2, "req", "string"),
        ("channels", 3, "rep", "Channel"),
    ],
    "HeartbeatResponse": [("channels", 1, "rep", "Channel")],
    "ShutdownRequest": [("tunnel_id", 1, "req", "string"), ("client_id", 2, "req", "string")],
    "ShutdownResponse": [],
    "GetCheckpointRequest": [
        ("tunnel_id", 1, "req", "string"),
        ("client_id", 2, "req", "string"),
        ("channel_id", 3, "req", "string"),
    ],
    "GetCheckpointResponse": [("checkpoint", 1, "req", "string"), ("sequence_number", 2, "req", "int64")],
    "CheckpointRequest": [
        ("tunnel_id", 1, "req", "string"),
        ("client_id", 2, "req", "string"),
        ("channel_id", 3, "req", "string"),
        ("checkpoint", 4, "req", "string"),
        ("sequence_number", 5, "req", "int64"),
    ],
    "CheckpointResponse": [],
    "ReadRecordsRequest": [
        ("tunnel_id", 1, "req", "string"),
        ("client_id", 2, "req", "string"),
        ("channel_id", 3, "req", "string"),
        ("token", 4, "req", "string"),
    ],
    "Record": [
        ("action_type", 1, "req", "ActionType"),
        ("record", 2, "req", "bytes"),
        ("origin_record", 3, "opt", "bytes"),
        ("latest_record", 7, "opt", "bytes"),
    ],
    "ReadRecordsResponse": [
        ("records", 1, "rep", "Record"),
        ("next_token", 2, "req", "string"),
        ("may_more_record", 3, "opt", "bool"),
    ],
    "Token": [("version", 1, "req", "int64"), ("content", 2, "req", "bytes")],
    "TokenContent": [
        ("primary_key", 1, "opt", "bytes"),
        ("iterator", 2, "opt", "string"),
        ("timestamp", 3, "opt", "int64"),
    ],
    "TokenContentV2": [
        ("primary_key", 1, "opt", "bytes"),
        ("iterator", 2, "opt", "string"),
        ("timestamp", 3, "opt", "int64"),
        ("total_count", 4, "opt", "int64"),
    ],
    "StreamTunnelConfig": [
        ("flag", 1, "opt", "StartOffsetFlag"),
        ("startOffset", 2, "opt", "uint64"),
        ("endOffset", 3, "opt", "uint64"),
    ],
    "StreamColumn": [("type", 1, "req", "StreamColumnType"), ("column_name", 2, "rep", "string")],
    "StreamRecordOptions": [
        ("get_version_generator_value", 1, "opt", "bool"),
        ("get_sys_columns", 2, "opt", "bool"),
        ("get_new_row_info", 3, "opt", "bool"),
        ("old_columns_to_get", 4, "opt", "StreamColumn"),
        ("new_columns_to_get", 5, "opt", "StreamColumn"),
    ],
}

_classes: dict[str, Any] = build("cdc_tunnel_service_api.proto", PACKAGE, _ENUMS, _MESSAGES)
# Explicit names for type checkers and readers.
Error: Any = _classes["Error"]
Tunnel: Any = _classes["Tunnel"]
TunnelInfo: Any = _classes["TunnelInfo"]
ChannelInfo: Any = _classes["ChannelInfo"]
Channel: Any = _classes["Channel"]
ClientConfig: Any = _classes["ClientConfig"]
Record: Any = _classes["Record"]
Token: Any = _classes["Token"]
TokenContent: Any = _classes["TokenContent"]
TokenContentV2: Any = _classes["TokenContentV2"]
StreamTunnelConfig: Any = _classes["StreamTunnelConfig"]
StreamColumn: Any = _classes["StreamColumn"]
StreamRecordOptions: Any = _classes["StreamRecordOptions"]
CreateTunnelRequest: Any = _classes["CreateTunnelRequest"]
CreateTunnelResponse: Any = _classes["CreateTunnelResponse"]
DeleteTunnelRequest: Any = _classes["DeleteTunnelRequest"]
DeleteTunnelResponse: Any = _classes["DeleteTunnelResponse"]
ListTunnelRequest: Any = _classes["ListTunnelRequest"]
ListTunnelResponse: Any = _classes["ListTunnelResponse"]
DescribeTunnelRequest: Any = _classes["DescribeTunnelRequest"]
DescribeTunnelResponse: Any = _classes["DescribeTunnelResponse"]
GetRpoRequest: Any = _classes["GetRpoRequest"]
GetRpoResponse: Any = _classes["GetRpoResponse"]
ConnectRequest: Any = _classes["ConnectRequest"]
ConnectResponse: Any = _classes["ConnectResponse"]
HeartbeatRequest: Any = _classes["HeartbeatRequest"]
HeartbeatResponse: Any = _classes["HeartbeatResponse"]
ShutdownRequest: Any = _classes["ShutdownRequest"]
ShutdownResponse: Any = _classes["ShutdownResponse"]
GetCheckpointRequest: Any = _classes["GetCheckpointRequest"]
GetCheckpointResponse: Any = _classes["GetCheckpointResponse"]
CheckpointRequest: Any = _classes["CheckpointRequest"]
CheckpointResponse: Any = _classes["CheckpointResponse"]
ReadRecordsRequest: Any = _classes["ReadRecordsRequest"]
ReadRecordsResponse: Any = _classes["ReadRecordsResponse"]

BaseData, Stream, BaseAndStream = 1, 2, 3
OPEN, CLOSING, CLOSE, TERMINATED = 1, 2, 3, 4
PUT_ROW, UPDATE_ROW, DELETE_ROW = 1, 2, 3
LATEST, EARLIEST = 0, 1
INVALID, SPECIFIED_COLUMN, INPUT_COLUMNS, ALL_COLUMNS = 0, 1, 2, 3

TUNNEL_TYPES: dict[str, int] = dict(_ENUMS["TunnelType"])
"""Tunnel type name (as DescribeTunnel reports it) -> enum value."""
ACTION_TYPES: dict[int, str] = {v: k for k, v in _ENUMS["ActionType"]}
CHANNEL_STATUSES: tuple[str, ...] = ("WAIT", "OPEN", "CLOSING", "CLOSE", "TERMINATED")
"""Channel status strings as DescribeTunnel reports them (``WAIT`` has no heartbeat enum value)."""

MESSAGE_NAMES: tuple[str, ...] = tuple(_MESSAGES)
