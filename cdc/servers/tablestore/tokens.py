"""Tunnel tokens: ``base64(Token{version=1, content=TokenContent{iterator="<channel>:<position>"}})``.

A token names a position in one channel; reading from it returns the records after that position.
"""

from __future__ import annotations

import base64

from cdc.backends.tablestore import tunnel_pb as tpb

from .errors import param_invalid

FINISHED = tpb.FINISHED_TOKEN


def make_token(channel_id: str, position: int) -> str:
    content = tpb.TokenContent(iterator=f"{channel_id}:{position}").SerializeToString()
    return base64.b64encode(tpb.Token(version=1, content=content).SerializeToString()).decode("ascii")


def parse_token(token: str, channel_id: str) -> int:
    """The position a token names; OTSParameterInvalid if it is malformed or of another channel."""
    try:
        outer = tpb.Token.FromString(base64.b64decode(token.encode("ascii"), validate=True))
        iterator = tpb.TokenContent.FromString(outer.content).iterator
        owner, _, position = iterator.rpartition(":")
        value = int(position)
    except Exception as exc:  # noqa: BLE001 - base64, protobuf and int errors all mean "bad token"
        raise param_invalid(f"token {token[:40]!r} is malformed") from exc
    if owner != channel_id or value < 0:
        raise param_invalid(f"token {token[:40]!r} does not belong to channel {channel_id}")
    return value
