"""The replication slot and publication of a query, and reading its changes by peeking.

Reads never consume the slot: :func:`peek` (``pg_logical_slot_peek_binary_changes``) returns every
transaction that commits before an LSN bound, from the slot's confirmed position on, so the same range
reads the same changes until the slot is advanced, which only :func:`advance` does (from ``acknowledge``,
i.e. Spark's commit of a batch that ended there).
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc.backends.postgres.errors import ReplicationCapacityError
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


def published_tables(conn: psycopg.Connection[Any], publication: str) -> set[str]:
    """The tables ``publication`` carries, as ``schema.table``."""
    rows = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
    return {f"{schema}.{table}" for schema, table in rows.fetchall()}


def add_to_publication(conn: psycopg.Connection[Any], publication: str, tables: Sequence[str]) -> None:
    """``ALTER PUBLICATION ... ADD TABLE``, committed when this returns (the connection autocommits): every change
    of these tables decoded past this point in the WAL is published."""
    names = sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in tables)
    conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(publication), names))
    log.info("added %s to publication %s", ", ".join(tables), publication)


def ensure_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """Create the slot if it does not exist: Spark asks a restarted source again, so creation is idempotent."""
    if state(conn, slot) is not None:
        return
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        log.info("created replication slot %s", slot)
    except psycopg.errors.DuplicateObject:
        pass


@dataclass
class ExportedSlot:
    """A replication slot created with an exported snapshot: ``snapshot`` holds exactly the transactions that
    committed before ``lsn`` (the slot's consistent point). The export lives while ``conn`` stays open and idle;
    a temporary slot goes with the connection too."""

    conn: psycopg.Connection[Any]
    lsn: int
    snapshot: str

    def close(self) -> None:
        self.conn.close()


def create_exported_slot(dsn: str, slot: str, *, temporary: bool, timeout: float | None) -> ExportedSlot | None:
    """``CREATE_REPLICATION_SLOT <slot> [TEMPORARY] LOGICAL pgoutput (SNAPSHOT 'export')`` on a replication
    connection. PostgreSQL first waits for the write transactions running then to end; past ``timeout`` seconds
    the command is cancelled (nothing is created) and None returned."""
    repl = connect(dsn, replication="database")
    command = sql.SQL("CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput (SNAPSHOT 'export')").format(
        sql.Identifier(slot), sql.SQL("TEMPORARY " if temporary else ""))
    pgconn = repl.pgconn
    try:
        pgconn.send_query(command.as_string(repl).encode())
        deadline = None if timeout is None else time.monotonic() + timeout
        pgconn.consume_input()
        while pgconn.is_busy():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                pgconn.get_cancel().cancel()
                while pgconn.get_result() is not None:  # the cancelled command's error, then the end
                    pass
                log.info("creating slot %s waited %.1f s for write transactions in flight: cancelled", slot, timeout)
                repl.close()
                return None
            select.select([pgconn.socket], [], [], remaining)
            pgconn.consume_input()
        res = pgconn.get_result()
        while pgconn.get_result() is not None:
            pass
        if res is None or res.status != 2:  # TUPLES_OK
            message = "" if res is None else (res.error_message or b"").decode().strip()
            raise _slot_error(slot, message)
        lsn = parse_lsn((res.get_value(0, 1) or b"").decode())
        exported = (res.get_value(0, 2) or b"").decode()
    except BaseException:
        repl.close()
        raise
    log.info("slot %s created at %s with exported snapshot %s", slot, format_lsn(lsn), exported)
    return ExportedSlot(repl, lsn, exported)


def _slot_error(slot: str, message: str) -> Exception:
    if "all replication slots are in use" in message or "number of requested standby connections" in message:
        return ReplicationCapacityError(
            f"cannot create replication slot {slot!r}: {message}. Raise max_replication_slots / max_wal_senders "
            "(then restart PostgreSQL) or drop unused slots (cdc postgres slots lists them)"
        )
    return RuntimeError(f"CREATE_REPLICATION_SLOT {slot} failed: {message}")


def check_capacity(conn: psycopg.Connection[Any], slots: int, senders: int) -> None:
    """Refuse, naming the setting and the fix, when fewer than ``slots`` replication slots or ``senders`` WAL
    senders are free."""
    row = conn.execute(
        "SELECT current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots), "
        "current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)"
    ).fetchone()
    assert row is not None
    max_slots, used_slots, max_senders, used_senders = (int(v) for v in row)
    short = []
    if max_slots - used_slots < slots:
        short.append(f"max_replication_slots = {max_slots} with {used_slots} in use (needs {slots} more)")
    if max_senders - used_senders < senders:
        short.append(f"max_wal_senders = {max_senders} with {used_senders} in use (needs {senders} more)")
    if short:
        raise ReplicationCapacityError(
            "a chunked snapshot needs one more replication slot and WAL sender while it runs (the temporary slot "
            f"of each cut) besides the query's own: {'; '.join(short)}. Raise the setting in postgresql.conf and "
            "restart PostgreSQL, drop unused slots (cdc postgres slots lists them), or use snapshot.mode=exported"
        )


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
SELECT commit_lsn, records, rekeys, signals FROM (
    SELECT max(CASE WHEN get_byte(data, 0) = 66
                    THEN ('x' || encode(substring(data FROM 2 FOR 8), 'hex'))::bit(64)::bigint END) AS commit_lsn,
           sum(CASE get_byte(data, 0) WHEN 73 THEN 1 WHEN 68 THEN 1
                    WHEN 85 THEN CASE WHEN get_byte(data, 5) = 75 THEN 2 ELSE 1 END ELSE 0 END) AS records,
           coalesce(bool_or(get_byte(data, 0) = 85 AND get_byte(data, 5) = 75
                            AND substring(data FROM 2 FOR 4) = ANY(%s::bytea[])), false) AS rekeys,
           array_agg(substring(data FROM 11 + length(%s::bytea))) FILTER (
               WHERE get_byte(data, 0) = 77 AND substring(data FROM 11 FOR length(%s::bytea)) = %s::bytea) AS signals
    FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s,
                                             'messages', 'true')
    GROUP BY xid
) t
WHERE (records > 0 OR signals IS NOT NULL) AND commit_lsn >= %s AND commit_lsn < %s
ORDER BY commit_lsn
"""
SIGNAL_PREFIX = "cdc-tunnel"
"""The prefix of the logical decoding messages that signal a query (:mod:`.signals`); pgoutput sends a message
(``'M'``: flags, its LSN, the prefix as a C string, the content's length, the content) only when asked with
``'messages', 'true'``, which only planning asks: reads never see them."""
_PREFIX = SIGNAL_PREFIX.encode() + b"\x00"


def transaction_sizes(
    conn: psycopg.Connection[Any], slot: str, publication: str, start: int, end_lsn: int,
    rekeys_of: Sequence[int] = (),
) -> Iterator[tuple[int, int, bool, tuple[bytes, ...]]]:
    """(commit LSN, records, re-keys, signals) of the transactions a read decodes (:mod:`.changes`), counted by
    PostgreSQL from each message's first bytes (:func:`.pgoutput.records_of`), so planning sends one row per
    transaction to Python and decodes no row. An update under ``REPLICA IDENTITY FULL`` that changes the key
    counts as one record here and reads as two (a delete and an insert): the count only sizes batches, whose
    budget is soft. ``re-keys``: the transaction changes the key of a row of a relation among ``rekeys_of``
    (their OIDs; an update that carries the old key, ``K``). ``signals``: the transactional logical decoding
    messages with the prefix :data:`SIGNAL_PREFIX` the transaction carries, each as its content's length (4
    bytes) and content (:func:`.signals.parse`); a transaction of signals only counts 0 records."""
    first = lsn_of(start)
    if end_lsn <= first:
        return
    skip = start - pack(first)  # a start inside a transaction: its earlier changes are not in the range
    relids = [oid.to_bytes(4, "big") for oid in rekeys_of]
    rows = conn.execute(_SIZES, (relids, _PREFIX, _PREFIX, _PREFIX, slot, format_lsn(end_lsn), publication, first,
                                 end_lsn))
    for commit_lsn, records, rekeys, signals in rows:
        n = int(records) - (skip if commit_lsn == first else 0)
        if n > 0 or (signals and (commit_lsn != first or skip == 0)):  # a signal before start: seen already
            yield int(commit_lsn), max(n, 0), bool(rekeys), tuple(bytes(s) for s in signals or ())
