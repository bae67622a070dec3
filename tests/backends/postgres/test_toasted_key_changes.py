"""Unchanged TOASTed values through key changes, end to end: random transactions on a real PostgreSQL table
with a ~5 KB text column (stored out of line) insert, update (touching the text or not), change keys (once,
twice in one transaction, swapping two keys), delete and re-insert, under ``REPLICA IDENTITY DEFAULT`` (the
update's new row marks the text unchanged) and ``FULL`` (the logged old row holds it); a streaming query
(``format("cdc")``, ``startingOffsets=snapshot``, small micro-batches) applies them with ``DeltaUpsertSink``
on both engines and both SCD types, and the Delta table must equal ``SELECT *`` after the stream drains.

The same histories through real Debezium events are in tests/debezium/test_toasted_key_changes.py; both
share the history model here (:class:`History`)."""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinks.delta import DeltaUpsertSink, read

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


@dataclass
class History:
    """Runs drawn transactions on a table ``(id int primary key, n int, big text)``, choosing live and free
    keys from what it wrote (every choice a function of the drawn numbers, so examples shrink)."""

    conn: psycopg.Connection[Any]
    table: str
    live: set[int] = field(default_factory=set)

    def create(self, identity: str, rows: int) -> None:
        self.conn.execute(f"CREATE TABLE {self.table} (id int PRIMARY KEY, n int, big text)".encode())
        self.conn.execute(f"ALTER TABLE {self.table} REPLICA IDENTITY {identity}".encode())
        self.run([[Op("insert", 0, k) for k in range(1, rows + 1)]])

    def _existing(self, a: int) -> int | None:
        keys = sorted(self.live)
        return keys[a % len(keys)] if keys else None

    def _free(self, b: int) -> int | None:
        for k in itertools.chain(range(b % KEYS + 1, KEYS + 1), range(1, b % KEYS + 1)):
            if k not in self.live:
                return k
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
        return {r[0]: (r[1], r[2]) for r in self.conn.execute(f"SELECT id, n, big FROM {self.table}".encode())}


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


_examples = itertools.count()


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(history=HISTORIES, identity=st.sampled_from(["DEFAULT", "FULL"]), scd_type=st.sampled_from([1, 2]),
       per_trigger=st.integers(1, 6))
def test_key_changes_keep_unchanged_toasted_values_in_delta(
    spark: Any, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory, engine: str,
    history: tuple[int, list[list[list[Op]]]], identity: str, scd_type: int, per_trigger: int,
) -> None:
    n = next(_examples)
    work = tmp_path_factory.mktemp(f"toast{n}")
    rows, phases = history
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        h = History(conn, f"toast_{n}")
        h.create(identity, rows)
        sink = DeltaUpsertSink(str(work / "t"), keys=["id"], engine=engine, scd_type=scd_type)
        query = (spark.readStream.format("cdc").option("backend", "postgres").option("dsn", postgres_dsn)
                 .option("tables", f"public.toast_{n}").option("slot.name", f"toast_{n}")
                 .option("startingOffsets", "snapshot").option("snapshot.path", str(work / "snapshots"))
                 .option("maxRecordsPerTrigger", str(per_trigger)).load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "ck")).start())
        try:
            query.processAllAvailable()  # the snapshot; the slot holds every later change
            for transactions in phases:
                h.run(transactions)
                query.processAllAvailable()
        finally:
            query.stop()
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (f"toast_{n}",))
        got, expected = delta_rows(spark, work / "t"), h.rows()
        assert got == expected, first_difference(got, expected)

