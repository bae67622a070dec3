"""The replication slot and publication of a query, and reading its changes by peeking.

Reads never consume the slot: :func:`peek` (``pg_logical_slot_peek_binary_changes``) returns every
transaction that commits before an LSN bound, from the slot's confirmed position on, so the same range
reads the same changes until the slot is advanced, which only :func:`advance` does (from ``acknowledge``,
i.e. Spark's commit of a batch that ended there).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc.backends.postgres.positions import format_lsn, lsn_of, pack, parse_lsn
from cdc.errors import DataLossError

log = logging.getLogger(__name__)


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name="cdc-tunnel", **kwargs)


@dataclass(frozen=True)
class SlotState:
    confirmed_lsn: int
    lost: bool


def state(conn: psycopg.Connection[Any], slot: str) -> SlotState | None:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    return SlotState(parse_lsn(row[0]) if row[0] else 0, row[1] == "lost")


def flush_lsn(conn: psycopg.Connection[Any]) -> int:
    """Every commit record below this LSN is on disk, so decodable: planning never goes past it."""
    row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(row[0])


def ensure_publication(conn: psycopg.Connection[Any], publication: str, tables: tuple[str, ...]) -> None:
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone():
        return
    names = sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in tables)
    try:
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(publication), names))
        log.info("created publication %s for %s", publication, ", ".join(tables))
    except psycopg.errors.DuplicateObject:
        pass  # another process created it meanwhile


def ensure_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """Create the slot if it does not exist: Spark asks a restarted source again, so creation is idempotent."""
    if state(conn, slot) is not None:
        return
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        log.info("created replication slot %s", slot)
    except psycopg.errors.DuplicateObject:
        pass


def drop_slot(conn: psycopg.Connection[Any], slot: str) -> bool:
    if state(conn, slot) is None:
        return False
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return True


def check_held(conn: psycopg.Connection[Any], slot: str, position: int) -> SlotState:
    """The slot's state, or :class:`DataLossError` when it can no longer deliver from ``position``."""
    st = state(conn, slot)
    if st is None:
        raise DataLossError(f"replication slot {slot!r} does not exist (dropped?): its changes are gone", "changes")
    if st.lost:
        raise DataLossError(f"replication slot {slot!r} was invalidated (max_slot_wal_keep_size): its WAL is gone",
                            "changes")
    if lsn_of(position) < st.confirmed_lsn:
        raise DataLossError(
            f"replication slot {slot!r} is at {format_lsn(st.confirmed_lsn)}, past the needed position "
            f"{format_lsn(lsn_of(position))}: the changes between were consumed", "changes",
        )
    return st


def advance(conn: psycopg.Connection[Any], slot: str, position: int) -> None:
    """Move the slot to ``position`` (never backwards): PostgreSQL may then recycle the WAL before it."""
    target = lsn_of(position)
    st = state(conn, slot)
    if st is None or target <= st.confirmed_lsn:
        return
    target = min(target, flush_lsn(conn))
    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, format_lsn(target)))


def peek(conn: psycopg.Connection[Any], slot: str, publication: str, end_lsn: int) -> Iterable[tuple[bytes]]:
    """The slot's messages (one per row) of every transaction committed before ``end_lsn``, from its
    confirmed position on, without consuming them (:mod:`.changes` decodes them)."""
    # Binary results: the messages arrive as bytes, not as hex text to parse.
    cur = conn.cursor(binary=True)
    return cur.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', "
        "'publication_names', %s)",
        (slot, format_lsn(end_lsn), publication),
    )


_SIZES = """
SELECT commit_lsn, records FROM (
    SELECT max(CASE WHEN get_byte(data, 0) = 66
                    THEN ('x' || encode(substring(data FROM 2 FOR 8), 'hex'))::bit(64)::bigint END) AS commit_lsn,
           sum(CASE get_byte(data, 0) WHEN 73 THEN 1 WHEN 68 THEN 1
                    WHEN 85 THEN CASE WHEN get_byte(data, 5) = 75 THEN 2 ELSE 1 END ELSE 0 END) AS records
    FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s)
    GROUP BY xid
) t
WHERE records > 0 AND commit_lsn >= %s AND commit_lsn < %s
ORDER BY commit_lsn
"""


def transaction_sizes(
    conn: psycopg.Connection[Any], slot: str, publication: str, start: int, end_lsn: int
) -> Iterator[tuple[int, int]]:
    """(commit LSN, records) of the transactions a read decodes (:mod:`.changes`), counted by PostgreSQL from each
    message's first bytes (:func:`.pgoutput.records_of`), so planning sends one row per transaction to Python
    and decodes no row. An update under ``REPLICA IDENTITY FULL`` that changes the key counts as one record
    here and reads as two (a delete and an insert): the count only sizes batches, whose budget is soft."""
    first = lsn_of(start)
    if end_lsn <= first:
        return
    skip = start - pack(first)  # a start inside a transaction: its earlier changes are not in the range
    for commit_lsn, records in conn.execute(_SIZES, (slot, format_lsn(end_lsn), publication, first, end_lsn)):
        n = int(records) - (skip if commit_lsn == first else 0)
        if n > 0:
            yield int(commit_lsn), n
