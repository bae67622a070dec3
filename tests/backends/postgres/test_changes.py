"""The column-wise change decoder (``cdc/backends/postgres/changes.py``) on real ``pgoutput`` messages: old
rows under ``REPLICA IDENTITY FULL``, a read that starts inside a transaction, and messages it cannot
decode (which the server never sends: the test truncates a real one)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc.backends.postgres import connection
from cdc.backends.postgres.changes import decode_changes
from cdc.backends.postgres.errors import ReplicaIdentityError
from cdc.backends.postgres.positions import lsn_of
from cdc.errors import MalformedRecordError
from cdc.testing import read_range
from tests.backends.postgres.harness import PostgresHarness


def test_full_old_rows_key_changes_and_a_start_inside_a_transaction(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        h.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # updates and deletes send the whole old row ('O')
        with h.conn.transaction():
            h.execute("INSERT INTO items VALUES (1, 'a', 10), (2, 'b', NULL)")
            h.execute("UPDATE items SET n = 11 WHERE id = 1")  # old row, same key: one update
            h.execute("UPDATE items SET id = 3 WHERE id = 2")  # old row, new key: a delete and an insert
            h.execute("DELETE FROM items WHERE id = 1")  # old row: a delete carrying the key only
        backend = h.backend()
        start, end = backend.earliest("changes"), backend.latest("changes")
        rows = read_range(backend, "changes", start, end).to_pylist()
        assert [(r["_op"], r["id"], r["v"], r["n"]) for r in rows] == [
            ("insert", 1, "a", 10), ("insert", 2, "b", None), ("update", 1, "a", 11),
            ("delete", 2, None, None), ("insert", 3, "b", None), ("delete", 1, None, None),
        ]
        positions = [r["_position"] for r in rows]
        assert positions == list(range(positions[0], positions[0] + 6)) and positions == [r["_seq"] for r in rows]
        for k in range(1, 6):  # from inside the transaction: the same records from there on, same positions
            tail = read_range(backend, "changes", positions[k], end).to_pylist()
            assert tail == rows[k:], k
    finally:
        h.close()


def _messages(h: PostgresHarness) -> tuple[Any, list[tuple[bytes]], int, int]:
    backend = h.backend()
    start, end = backend.earliest("changes"), backend.latest("changes")
    with connection.connect(h.dsn) as conn:
        rows = list(connection.peek(conn, backend.slot, backend.publication, lsn_of(end)))  # type: ignore[attr-defined]
    return backend, rows, start, end


def test_a_message_that_cannot_be_decoded_is_named(postgres_dsn: str) -> None:
    h = PostgresHarness(postgres_dsn)
    try:
        h.execute("INSERT INTO items VALUES (1, 'a', 10)")
        h.execute("UPDATE items SET v = 'bb' WHERE id = 1")
        backend, rows, start, end = _messages(h)
        layout = backend.layout  # type: ignore[attr-defined]
        assert sum(b.num_rows for b in decode_changes(rows, layout, "changes", start, end)) == 2
        update = next(i for i, (m,) in enumerate(rows) if m[:1] == b"U")
        cut = [*rows[:update], (rows[update][0][:-1],), *rows[update + 1 :]]
        with pytest.raises(MalformedRecordError, match=r"pgoutput update message of the transaction committing at "
                                                       r"[0-9A-F]+/[0-9A-F]+ cannot be decoded: the row runs past"):
            list(decode_changes(cut, layout, "changes", start, end))
        unknown = [(m,) for (m,) in rows if m[:1] != b"R"]  # a change whose relation was never described
        with pytest.raises(MalformedRecordError, match=r"pgoutput insert message .* relation \d+ was not described"):
            list(decode_changes(unknown, layout, "changes", start, end))
    finally:
        h.close()


def test_booleans_and_their_nulls(postgres_dsn: str) -> None:
    # Booleans are read by comparing the whole column with 't' at once (pgoutput sends 't' or 'f').
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE flags (id int PRIMARY KEY, ok bool)")
    h = PostgresHarness(postgres_dsn, tables=("flags",), create=False)
    try:
        h.execute("INSERT INTO flags VALUES (1, true), (2, false), (3, NULL)")
        backend = h.backend()
        rows = read_range(backend, "changes", backend.earliest("changes"), backend.latest("changes"))
        assert rows.column("ok").to_pylist() == [True, False, None]
    finally:
        h.close()


def test_a_replica_identity_index_other_than_the_primary_key_is_refused_by_name(postgres_dsn: str) -> None:
    """Its old rows would be logged by the index's columns: a key change would be missed and deletes would
    carry no key. The primary key's own index as the identity is the default's equal."""
    h = PostgresHarness(postgres_dsn)
    try:
        h.execute("ALTER TABLE items ADD COLUMN u int NOT NULL DEFAULT 0")
        h.execute("CREATE UNIQUE INDEX items_u ON items (u)")
        h.execute("ALTER TABLE items REPLICA IDENTITY USING INDEX items_pkey")
        h.execute("INSERT INTO items VALUES (1, 'a', 1, 5)")
        h.execute("UPDATE items SET id = 2 WHERE id = 1")
        backend = h.backend()
        rows = read_range(backend, "changes", backend.earliest("changes"), backend.latest("changes")).to_pylist()
        assert [(r["_op"], r["id"], r["_old_key"]) for r in rows] == [
            ("insert", 1, None), ("delete", 1, None), ("insert", 2, {"id": 1})]
        h.execute("ALTER TABLE items REPLICA IDENTITY USING INDEX items_u")
        h.execute("UPDATE items SET u = 6 WHERE id = 2")
        backend = h.backend()
        with pytest.raises(ReplicaIdentityError, match=r"'public.items' has REPLICA IDENTITY USING INDEX on "
                                                       r"columns \['u'\].*REPLICA IDENTITY DEFAULT"):
            read_range(backend, "changes", backend.earliest("changes"), backend.latest("changes"))
    finally:
        h.close()
