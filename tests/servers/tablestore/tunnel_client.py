"""A raw tunnel client for the server tests: the tunnel service's calls signed by the official ``tablestore``
SDK's own signer (the SDK has no tunnel client), with the responses' signatures verified."""

from __future__ import annotations

from typing import Any

from tablestore import (
    CapacityUnit,
    Condition,
    OTSClient,
    ReservedThroughput,
    RowExistenceExpectation,
    TableMeta,
    TableOptions,
)
from tablestore.auth import RequestContext
from tablestore.retry import NoRetryPolicy

from cdc.backends.tablestore import tunnel_pb as pb

IGNORE = Condition(RowExistenceExpectation.IGNORE)


class ServiceError(Exception):
    """The service answered with an error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Tunnel:
    """Raw tunnel calls for one server, signed by the SDK; response signatures verified."""

    def __init__(self, endpoint: str, key_id: str, secret: str, instance: str) -> None:
        self.ots = OTSClient(endpoint, key_id, secret, instance, retry_policy=NoRetryPolicy())

    def call(self, name: str, request: Any, response_type: Any) -> Any:
        uri = pb.URIS[name]
        body = request.SerializeToString()
        context = RequestContext(self.ots.credentials_provider.get_credentials())
        headers = self.ots.protocol._make_request_headers(body, uri, self.ots._signer, context)
        status, _, res_headers, res_body = self.ots.connection.send_receive(uri, headers, body)
        std = self.ots.protocol._convert_urllib3_headers(res_headers)
        if status >= 300:
            error = pb.Error.FromString(res_body)
            raise ServiceError(error.code, error.message)
        self.ots.protocol._check_headers(std, res_body, status=status)
        self.ots.protocol._check_authorization(uri, std, status, self.ots._signer, context)
        return response_type.FromString(res_body)

    def create(self, table: str, name: str, kind: int) -> str:
        req = pb.CreateTunnelRequest(tunnel=pb.Tunnel(table_name=table, tunnel_name=name, tunnel_type=kind))
        return str(self.call("create", req, pb.CreateTunnelResponse).tunnel_id)

    def describe(self, tunnel_id: str) -> Any:
        return self.call(
            "describe",
            pb.DescribeTunnelRequest(table_name="", tunnel_name="", tunnel_id=tunnel_id),
            pb.DescribeTunnelResponse,
        )

    def channels(self, tunnel_id: str) -> dict[str, Any]:
        return {c.channel_id: c for c in self.describe(tunnel_id).channels}

    def connect(self, tunnel_id: str, timeout: int = 60) -> str:
        req = pb.ConnectRequest(tunnel_id=tunnel_id, client_config=pb.ClientConfig(timeout=timeout))
        return str(self.call("connect", req, pb.ConnectResponse).client_id)

    def heartbeat(self, tunnel_id: str, client_id: str, channels: list[Any] = ()) -> list[Any]:
        req = pb.HeartbeatRequest(tunnel_id=tunnel_id, client_id=client_id, channels=list(channels))
        return list(self.call("heartbeat", req, pb.HeartbeatResponse).channels)

    def get_checkpoint(self, tunnel_id: str, client_id: str, channel_id: str) -> tuple[str, int]:
        req = pb.GetCheckpointRequest(tunnel_id=tunnel_id, client_id=client_id, channel_id=channel_id)
        resp = self.call("getcheckpoint", req, pb.GetCheckpointResponse)
        return resp.checkpoint, resp.sequence_number

    def checkpoint(self, tunnel_id: str, client_id: str, channel_id: str, token: str, seq: int) -> None:
        req = pb.CheckpointRequest(
            tunnel_id=tunnel_id,
            client_id=client_id,
            channel_id=channel_id,
            checkpoint=token,
            sequence_number=seq,
        )
        self.call("checkpoint", req, pb.CheckpointResponse)

    def read(self, tunnel_id: str, client_id: str, channel_id: str, token: str) -> Any:
        req = pb.ReadRecordsRequest(
            tunnel_id=tunnel_id, client_id=client_id, channel_id=channel_id, token=token
        )
        return self.call("readrecords", req, pb.ReadRecordsResponse)

    def read_all(self, tunnel_id: str, client_id: str, channel_id: str, token: str) -> tuple[list[Any], str]:
        """Follow next_token until "finished" or until a read returns nothing; (records, last token)."""
        records: list[Any] = []
        while token != pb.FINISHED_TOKEN:
            resp = self.read(tunnel_id, client_id, channel_id, token)
            records.extend(resp.records)
            if not resp.records and resp.next_token == token:
                break
            token = resp.next_token
        return records, token


def tunnel_of(server: Any) -> Tunnel:
    return Tunnel(server.endpoint, server.access_key_id, server.access_key_secret, server.instance)


def create_table(client: OTSClient, name: str = "t") -> None:
    client.create_table(
        TableMeta(name, [("id", "INTEGER")]), TableOptions(), ReservedThroughput(CapacityUnit(0, 0))
    )


