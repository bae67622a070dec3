"""Positions of ``backend=postgres``: (commit LSN, index of the change in its transaction) in one long.

The changes of interleaved transactions have no increasing LSNs of their own (a change's WAL record comes
before those of transactions that commit earlier), but commits are totally ordered: the slot hands out
transactions in commit-LSN order. So a change's position is ``commit_lsn << 20 | index``; a batch boundary
always lies between transactions, at ``(commit_lsn + 1) << 20``, the gap before every transaction that
commits at or after ``commit_lsn + 1``. The packing holds commit LSNs below 2**43 (8 TiB of WAL written
by the cluster in its life) and 2**20 changes per transaction; past those :func:`pack` raises rather than
hand out an ambiguous position.
"""

from __future__ import annotations

from cdc.errors import PositionError

CHANGES = "changes"
"""The change channel: a replication slot is one ordered stream."""

INDEX_BITS = 20
MAX_INDEX = (1 << INDEX_BITS) - 1
MAX_LSN = (1 << (63 - INDEX_BITS)) - 1


def pack(lsn: int, index: int = 0) -> int:
    if lsn > MAX_LSN or index > MAX_INDEX:
        raise PositionError(
            f"position (LSN {format_lsn(lsn)}, change {index}) does not fit a long: backend postgres packs LSNs "
            f"below {format_lsn(MAX_LSN)} and at most {MAX_INDEX + 1} changes per transaction"
        )
    return lsn << INDEX_BITS | index


def lsn_of(position: int) -> int:
    """The LSN bound of a position: transactions committing at or after it lie at or after the position."""
    return position >> INDEX_BITS


def boundary_after(commit_lsn: int) -> int:
    """The position right after the transaction that committed at ``commit_lsn``."""
    return pack(commit_lsn + 1)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return int(high, 16) << 32 | int(low, 16)
