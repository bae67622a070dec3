"""Positions in a tunnel channel, and the ordering keys that bound them.

The tunnel hands out only opaque tokens, and how many records one ``ReadRecords`` returns is the server's
choice; what stays fixed is the record sequence that follows a token along the ``next_token`` chain (see
:mod:`.backend`). A position is therefore ``{"token": T, "skip": k, "n": n, "last": key}``: the gap ``k``
records after the point ``T`` names; ``n`` counts the records before the gap since the query's origin
(the channel's start token), and ``last`` is the ordering key of the record just before the gap, or null
at the origin. A finished channel's position has the token ``"finished"``.

Ordering keys (:func:`order_key`) are strictly increasing within a channel: ``[epoch, timestamp,
row_index]`` from a stream record's sequence info, the primary key of a base-data record (base ranges are
exported in key order). Bounds (``until``) compare them, so a bound holds whatever origin it was computed
from; a bound may also be a time (``last = ["~time", micros]``, see :data:`TIME_BOUND`). A batch read's
end may be left to its reader (``last = ["~head", micros]``, see :data:`HEAD_BOUND`).

Positions are JSON: they live in Spark's offset log, binary key values as ``{"hex": ...}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.backends.tablestore import tunnel_pb as pb
from cdc.backends.tablestore.plainbuffer import Row, decode_row
from cdc.errors import MalformedRecordError, PositionError

FINISHED = pb.FINISHED_TOKEN
TIME_BOUND = "~time"
"""``last = ["~time", micros]`` in a bound: every stream record whose sequence timestamp is <= micros."""
HEAD_BOUND = "~head"
"""``last = ["~head", micros]`` in a batch read's end (:meth:`.backend.TablestoreBackend.batch_read_end`): the
reader takes every record up to the head it finds that was committed until micros (a base-data channel: every
record); ``n`` counts the records the plan saw, a lower bound. Never in a streaming offset."""

_POSITION_KEYS = {"token", "skip", "n", "last"}


@dataclass(frozen=True)
class Pos:
    """A channel position; see the module docstring."""

    token: str
    skip: int = 0
    n: int = 0
    last: tuple[Any, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        last = None if self.last is None else [_json_value(v) for v in self.last]
        return {"token": self.token, "skip": self.skip, "n": self.n, "last": last}

    @classmethod
    def parse(cls, channel: str, value: Any) -> Pos:
        if not isinstance(value, Mapping) or set(value) != _POSITION_KEYS:
            raise PositionError(
                f"channel {channel!r}: a tablestore position is an object with the keys "
                f"{sorted(_POSITION_KEYS)}, got {value!r}"
            )
        token, skip, n, last = value["token"], value["skip"], value["n"], value["last"]
        ok = (
            isinstance(token, str)
            and token != ""
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (skip, n))
            and (last is None or isinstance(last, list))
        )
        if not ok:
            raise PositionError(
                f"channel {channel!r}: bad tablestore position {value!r} (token: non-empty string, skip and n: "
                "integers >= 0, last: list or null)"
            )
        return cls(token, skip, n, None if last is None else tuple(_from_json_value(v) for v in last))


def _json_value(v: Any) -> Any:
    return {"hex": v.hex()} if isinstance(v, bytes) else v


def _from_json_value(v: Any) -> Any:
    return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v


def order_key(row: Row, base: bool) -> tuple[Any, ...]:
    """The ordering key of a decoded record of a base-data (``base``) or stream channel."""
    if base:
        return tuple(v for _, v in row.primary_key)
    seq = row.sequence_info
    if seq is None:
        raise MalformedRecordError("a stream record has no sequence info (PlainBuffer extension)")
    return (seq.epoch, seq.timestamp, seq.row_index)


def within(key: tuple[Any, ...], bound: tuple[Any, ...] | None) -> bool:
    """Whether a record with ordering ``key`` lies at or before the bound's ``last``."""
    if bound is None:
        return False
    if bound[0] == TIME_BOUND or bound[0] == HEAD_BOUND:
        return bool(key[1] <= bound[1])  # stream keys are (epoch, timestamp, row_index)
    return bool(key <= bound)


def count_within(records: Sequence[Any], skip: int, base: bool, bound: tuple[Any, ...] | None) -> int:
    """How many of ``records`` (``pb.Record``) from ``skip`` on lie within ``bound`` (keys increase)."""
    lo, hi = skip, len(records)
    if within(order_key(decode_row(records[hi - 1].record), base), bound):
        return hi - skip
    while lo < hi:
        mid = (lo + hi) // 2
        if within(order_key(decode_row(records[mid].record), base), bound):
            lo = mid + 1
        else:
            hi = mid
    return lo - skip
