"""Histories of transactions on a PostgreSQL table with a large (TOASTed) text column, shared by the
end-to-end tests of key changes (tests/backends/postgres/test_toasted_key_changes.py through the PostgreSQL
backend, tests/debezium/test_toasted_key_changes.py through real Debezium events)."""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from hypothesis import strategies as st

from sinks.delta import read

KEYS = 8  # keys 1..KEYS: small, so that re-keys, swaps and re-inserts meet the same keys
ALPHABET = string.ascii_letters + string.digits + " '\\\""


def big_text(seed: int) -> str:
    """~5 KB that pglz cannot shrink below the TOAST threshold (stored out of line); every fifth a short
    text stored inline."""
    rng = random.Random(seed)
    if seed % 5 == 0:
        return f"short {seed} '\\"
    return "".join(rng.choices(ALPHABET, k=5000))


@dataclass(frozen=True)
class Op:
    """One statement kind of a transaction; ``a`` picks a live key, ``b`` a free key and the values."""

    kind: str
    a: int
    b: int


OPS = st.builds(
    Op,
    st.sampled_from(["insert", "touch", "big", "rekey", "rekey_touch", "rekey_twice", "swap", "delete",
                     "delete_reinsert"]),
    st.integers(0, 63), st.integers(0, 2**16),
)
TRANSACTIONS = st.lists(st.lists(OPS, min_size=1, max_size=4), min_size=1, max_size=5)
#: A history: the rows before the stream starts (the snapshot), then phases of transactions, the stream
#: draining after each phase.
HISTORIES = st.tuples(st.integers(1, KEYS - 2), st.lists(TRANSACTIONS, min_size=1, max_size=2))

# One history, written out: every kind of statement in one transaction phase, so that one batch holds an
# unchanged TOASTed value, a key change, a chain of two, a swap, a delete and a re-insert.
EVERY_KIND: tuple[int, list[list[list[Op]]]] = (4, [[
    [Op("touch", 0, 11), Op("rekey", 1, 5)],
    [Op("rekey_twice", 2, 1), Op("big", 3, 12)],
    [Op("swap", 0, 2)],
    [Op("delete", 1, 0), Op("delete_reinsert", 2, 13), Op("insert", 0, 7)],
    [Op("rekey_touch", 3, 6), Op("touch", 1, 14)],
]])


@dataclass
class History:
    """Runs drawn transactions on a table ``(id int primary key, n int, big text)``, on keys ``base + 1`` to
    ``base + KEYS``, choosing live and free keys from what it wrote (every choice a function of the drawn
    numbers, so examples shrink)."""

    conn: psycopg.Connection[Any]
    table: str
    base: int = 0
    live: set[int] = field(default_factory=set)

    def create(self) -> None:
        self.conn.execute(f"CREATE TABLE {self.table} (id int PRIMARY KEY, n int, big text)".encode())

    def start(self, identity: str, rows: int) -> None:
        """Set the replica identity, then insert ``rows`` rows (one transaction)."""
        self.conn.execute(f"ALTER TABLE {self.table} REPLICA IDENTITY {identity}".encode())
        self.run([[Op("insert", 0, k) for k in range(rows)]])

    def _existing(self, a: int) -> int | None:
        keys = sorted(self.live)
        return keys[a % len(keys)] if keys else None

    def _free(self, b: int) -> int | None:
        for k in itertools.chain(range(b % KEYS + 1, KEYS + 1), range(1, b % KEYS + 1)):
            if self.base + k not in self.live:
                return self.base + k
        return None

    def _sql(self, sql: str, *params: Any) -> None:
        self.conn.execute(sql.format(t=self.table).encode(), params)

    def run(self, transactions: list[list[Op]]) -> None:
        for ops in transactions:
            with self.conn.transaction():
                for op in ops:
                    self._apply(op)

    def _apply(self, op: Op) -> None:
        old, new = self._existing(op.a), self._free(op.b)
        if op.kind == "insert" and new is not None:
            self._sql("INSERT INTO {t} VALUES (%s, %s, %s)", new, op.b, big_text(op.b))
            self.live.add(new)
        elif old is None:
            return
        elif op.kind == "touch":  # the TOASTed column is not touched: DEFAULT marks it unchanged
            self._sql("UPDATE {t} SET n = %s WHERE id = %s", op.b, old)
        elif op.kind == "big":
            self._sql("UPDATE {t} SET big = %s WHERE id = %s", big_text(op.b), old)
        elif op.kind in ("rekey", "rekey_touch") and new is not None:
            if op.kind == "rekey":
                self._sql("UPDATE {t} SET id = %s WHERE id = %s", new, old)
            else:
                self._sql("UPDATE {t} SET id = %s, n = n + 1 WHERE id = %s", new, old)
            self.live.discard(old)
            self.live.add(new)
        elif op.kind == "rekey_twice" and new is not None:
            self._sql("UPDATE {t} SET id = %s WHERE id = %s", new, old)
            self.live.discard(old)
            self.live.add(new)
            last = self._free(op.b + 3)
            if last is not None:
                self._sql("UPDATE {t} SET id = %s WHERE id = %s", last, new)
                self.live.discard(new)
                self.live.add(last)
        elif op.kind == "swap":
            other = self._existing(op.b)
            spare = self._free(op.b)
            if other is None or other == old or spare is None:
                return
            self._sql("UPDATE {t} SET id = %s WHERE id = %s", spare, old)
            self._sql("UPDATE {t} SET id = %s WHERE id = %s", old, other)
            self._sql("UPDATE {t} SET id = %s WHERE id = %s", other, spare)
        elif op.kind == "delete":
            self._sql("DELETE FROM {t} WHERE id = %s", old)
            self.live.discard(old)
        elif op.kind == "delete_reinsert":
            self._sql("DELETE FROM {t} WHERE id = %s", old)
            self._sql("INSERT INTO {t} VALUES (%s, %s, %s)", old, op.b, big_text(op.b))

    def rows(self) -> dict[int, tuple[Any, Any]]:
        query = f"SELECT id, n, big FROM {self.table} WHERE id > %s AND id <= %s".encode()
        return {r[0]: (r[1], r[2]) for r in self.conn.execute(query, (self.base, self.base + KEYS))}


def delta_rows(spark: Any, path: Path) -> dict[int, tuple[Any, Any]]:
    return {r["id"]: (r["n"], r["big"]) for r in read(spark, str(path), current_only=True).collect()}


def first_difference(got: dict[int, tuple[Any, Any]], expected: dict[int, tuple[Any, Any]]) -> str:
    """The first key whose Delta row differs from the source's, briefly (values are 5 KB)."""
    def brief(row: tuple[Any, Any] | None) -> Any:
        return None if row is None else (row[0], None if row[1] is None else row[1][:24] + f"...({len(row[1])})")

    for k in sorted(set(got) | set(expected)):
        if got.get(k) != expected.get(k):
            return f"key {k}: Delta {brief(got.get(k))} != PostgreSQL {brief(expected.get(k))}"
    return ""
