"""Positions of ``backend=pulsar``: message ids as JSON lists, and the order between them.

A position is the JSON list ``[ledger, entry, batch]`` of the **last message already delivered** on a
partition (so it names the gap after that message). Message ids order lexicographically by
``(ledger, entry, batch_index)``; a message outside a batch has ``batch_index = -1``. Two extra values
keep that order total:

* ``[-1, -1, -1]`` (:data:`START`) is before every message: a partition nothing has been seen of yet.
* ``[l, e, b - 1]`` (``[l, e, -2]`` for ``b <= 0``) is the gap *before* message ``(l, e, b)``; it is how
  ``earliest`` names the start of a partition whose first message is known.

A range ``[start, end)`` of the contract holds the messages with ``start < id <= end``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

from cdc.errors import PositionError

Key = tuple[int, int, int]
"""A message id as ``(ledger, entry, batch_index)``: the tuple order is the partition's order."""

START: list[int] = [-1, -1, -1]
NONE: Key = (-1, -1, -1)


def key_of(mid: Any) -> Key:
    """The key of a pulsar-client ``MessageId``."""
    return (mid.ledger_id(), mid.entry_id(), mid.batch_index())


def before(key: Key) -> list[int]:
    """The position just before message ``key``."""
    ledger, entry, batch = key
    return [ledger, entry, batch - 1 if batch > 0 else -2]


def to_key(position: Any, channel: str = "?") -> Key:
    """Validate a position (``[l, e, b]`` or ``{"ledgerId", "entryId", "batchIndex"}``) into a key."""
    value = position
    if isinstance(value, Mapping):
        try:
            value = [value["ledgerId"], value["entryId"], value.get("batchIndex", -1)]
        except KeyError:
            value = None
    if (
        isinstance(value, (list, tuple))
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and value[0] >= -1
        and value[1] >= -1
        and value[2] >= -2
    ):
        return (int(value[0]), int(value[1]), int(value[2]))
    raise PositionError(
        f"channel {channel!r}: a Pulsar position is [ledgerId, entryId, batchIndex] (the last message already "
        f'processed) or {{"ledgerId": l, "entryId": e, "batchIndex": b}}; got {position!r}'
    )


def is_start(key: Key) -> bool:
    return key == NONE


def count_between(keys: list[Key], start: Key, until: Key | None, max_records: int | None) -> tuple[int, int]:
    """Indices ``[i, j)`` of the keys in ``(start, until]``, at most ``max_records`` of them."""
    i = bisect.bisect_right(keys, start)
    j = len(keys) if until is None else bisect.bisect_right(keys, until)
    j = max(i, j)
    if max_records is not None:
        j = min(j, i + max_records)
    return i, j
