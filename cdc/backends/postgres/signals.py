"""Signals to a running query, written into the WAL: ``cdc postgres resnapshot`` asks for a table's re-snapshot.

A signal is a transactional logical decoding message (``pg_logical_emit_message(true, 'cdc-tunnel', <json>)``):
it sits in the WAL at its transaction's commit, so every peek of a range sees it at the same place, and the
planner's decision is the same on every replay. Planning peeks with ``'messages', 'true'``
(:func:`.connection.transaction_sizes`); reads never ask for messages. A message with another prefix is not
returned; one of ours that cannot be understood, or that names a table the query does not read, is logged and
ignored: a signal never fails a running query.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterable
from typing import Any

import psycopg

from cdc.backends.postgres.connection import SIGNAL_PREFIX
from cdc.backends.postgres.positions import format_lsn, parse_lsn

log = logging.getLogger(__name__)

RESNAPSHOT = "resnapshot"

PRIVILEGE = (
    "the role needs EXECUTE on pg_logical_emit_message, which PUBLIC has unless it was revoked: run GRANT EXECUTE "
    "ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <role> as its owner (a superuser)"
)


def emit_resnapshot(conn: psycopg.Connection[Any], table: str, slot: str | None = None) -> int:
    """Write the signal that asks the queries reading ``table`` (``schema.table``) for its re-snapshot (only the
    query of replication slot ``slot``, when given); return the LSN of the message (committed when this returns:
    the connection autocommits)."""
    signal = {RESNAPSHOT: table} if slot is None else {RESNAPSHOT: table, "slot": slot}
    content = json.dumps(signal, separators=(",", ":"))
    row = conn.execute("SELECT pg_logical_emit_message(true, %s, %s::text)::text", (SIGNAL_PREFIX, content)).fetchone()
    assert row is not None
    return parse_lsn(row[0])


def tables_of(signals: Iterable[bytes], at: int, tables: Iterable[str], slot: str) -> list[str]:
    """The tables among ``tables`` that ``signals`` (as :func:`.connection.transaction_sizes` gives them, of the
    transaction committing at ``at``) ask the query of ``slot`` to re-snapshot, in order, each once; every other
    signal is logged."""
    known = set(tables)
    out: list[str] = []
    for raw in signals:
        try:
            (length,) = struct.unpack_from("!i", raw, 0)
            value = json.loads(raw[4 : 4 + length].decode())
            table = value[RESNAPSHOT]
            wanted = value.get("slot", slot)
        except (struct.error, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            log.warning("ignoring a %r message in the transaction committed at %s that is not a signal of this "
                        "release: %r", SIGNAL_PREFIX, format_lsn(at), raw[4:200])
            continue
        if wanted != slot:
            log.debug("the re-snapshot signal committed at %s is for the query of slot %r", format_lsn(at), wanted)
            continue
        if not isinstance(table, str) or table not in known:
            log.warning("ignoring the re-snapshot signal committed at %s for %r: not a table of this query (%s)",
                        format_lsn(at), table, sorted(known))
            continue
        if table not in out:
            out.append(table)
    return out
