"""Tables for the chunked-snapshot tests: every key kind the chunker must order as PostgreSQL does, rows with a
large out-of-line (TOASTed) value, and a writer that inserts, updates, re-keys and deletes them."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

# Text keys whose order differs between PostgreSQL's ICU collation and Python's: case, quotes, backslashes.
_PREFIXES = ["a", "B", "b", "'q", "\\z", '"d', "é", "Z z"]


@dataclass(frozen=True)
class KeyKind:
    """A primary key: its columns' SQL, and the key of row number ``i`` as the values of those columns."""

    columns: str
    names: tuple[str, ...]
    make: Callable[[int], tuple[Any, ...]]


KINDS = {
    "bigint": KeyKind("k bigint", ("k",), lambda i: (i,)),
    "text": KeyKind('k text COLLATE "en-US-x-icu"', ("k",), lambda i: (f"{_PREFIXES[i % len(_PREFIXES)]}{i // 3}",)),
    "uuid": KeyKind("k uuid", ("k",), lambda i: (uuid.UUID(int=(i * 2654435761) % (1 << 128)),)),
    "composite": KeyKind('k text COLLATE "en-US-x-icu", j int', ("k", "j"),
                         lambda i: (_PREFIXES[i % 4], i)),
}


def big_value(rng: random.Random) -> str:
    """~5 KB of random text: PostgreSQL stores it out of line (TOAST), so an update that does not touch it
    logs it as unchanged."""
    return rng.randbytes(2500).hex()


class Table:
    """A table ``name(<key>, n int, big text)`` and the numbers of its rows' keys (``live``)."""

    def __init__(self, conn: psycopg.Connection[Any], name: str, kind: KeyKind, rekey_toasted: bool = True) -> None:
        self.conn, self.name, self.kind = conn, name, kind
        self.rekey_toasted = rekey_toasted
        self.toasted: set[int] = set()
        keys = ", ".join(kind.names)
        conn.execute(f"CREATE TABLE {name} ({kind.columns}, n int, big text, PRIMARY KEY ({keys}))".encode())
        self.live: set[int] = set()
        self.next = 0

    def _where(self) -> str:
        return " AND ".join(f"{c} = %s" for c in self.kind.names)

    def insert(self, i: int, rng: random.Random, big: bool = False) -> None:
        marks = ", ".join(["%s"] * (len(self.kind.names) + 2))
        self.conn.execute(f"INSERT INTO {self.name} VALUES ({marks})".encode(),
                          (*self.kind.make(i), rng.randrange(1000), big_value(rng) if big else f"small {i}"))
        self.live.add(i)
        if big:
            self.toasted.add(i)
        self.next = max(self.next, i + 1)

    def load(self, rows: int, rng: random.Random) -> None:
        for i in range(rows):
            self.insert(i, rng, big=rng.random() < 0.3)

    def step(self, rng: random.Random) -> None:
        """One random change: insert (also above every key so far), update the small or the big column,
        re-key a row (to a key above or below, or into a freed one), delete."""
        op = rng.random()
        if not self.live or op < 0.25:
            i = self.next + rng.randrange(3) if rng.random() < 0.5 else rng.randrange(self.next + 1)
            if i not in self.live:
                self.insert(i, rng, big=rng.random() < 0.3)
            return
        i = rng.choice(sorted(self.live))
        if op < 0.55:
            self.conn.execute(f"UPDATE {self.name} SET n = n + 1 WHERE {self._where()}".encode(), self.kind.make(i))
        elif op < 0.65:
            self.conn.execute(f"UPDATE {self.name} SET big = %s WHERE {self._where()}".encode(),
                              (big_value(rng), *self.kind.make(i)))
            self.toasted.add(i)
        elif op < 0.85:
            j = rng.randrange(self.next + 3)
            if j in self.live or (i in self.toasted and not self.rekey_toasted):
                return
            sets = ", ".join(f"{c} = %s" for c in self.kind.names)
            self.conn.execute(f"UPDATE {self.name} SET {sets} WHERE {self._where()}".encode(),
                              (*self.kind.make(j), *self.kind.make(i)))
            self.live.discard(i)
            self.live.add(j)
            if i in self.toasted:
                self.toasted.discard(i)
                self.toasted.add(j)
            self.next = max(self.next, j + 1)
        else:
            self.conn.execute(f"DELETE FROM {self.name} WHERE {self._where()}".encode(), self.kind.make(i))
            self.live.discard(i)
            self.toasted.discard(i)

    def rows(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        names = [*self.kind.names, "n", "big"]
        got = self.conn.execute(f"SELECT {', '.join(names)} FROM {self.name}".encode()).fetchall()
        return {tuple(_plain(v) for v in r[: len(self.kind.names)]): dict(zip(names, map(_plain, r), strict=True))
                for r in got}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value
