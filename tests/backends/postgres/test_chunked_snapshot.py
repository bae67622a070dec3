"""Chunked snapshots against a real PostgreSQL (``snapshot.mode=chunked``, the default of ``startingOffsets=snapshot``).

Hypothesis histories interleave the tables' writes with micro-batches under random budgets, chunk sizes and
crashes, for every key kind the chunker must order as PostgreSQL does (bigint, text under an ICU collation with
quotes and backslashes, uuid, a composite key): inserts, updates of a small and of a TOASTed column,
primary-key updates moving rows across chunks and above the snapshot's last key, deletes, transactions spanning
several chunks. A batch is read twice (a retried task: the same rows), or its driver dies before it is read (its
cut is gone: the replay reads at a new cut, which the next batch learns), or after (the replay yields what the
first read kept). At the end the folded records equal ``SELECT *`` and every key's records come in increasing
``_seq`` (no record is older than one delivered before it)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.backend import Backend, open_backend
from cdc.backends.postgres import connection
from cdc.model import OLD_KEY
from cdc.offsets import Offset
from cdc.planner import Planner, positions
from cdc.testing.harness import read_batch
from tests.backends.postgres.chunked import KINDS, Table


@dataclass(frozen=True)
class Write:
    changes: int


@dataclass(frozen=True)
class Batch:
    limit: int | None
    crash: str | None = None
    """``before``: the driver dies after logging the batch, before reading it; ``after``: after reading it."""


STEPS = st.lists(
    st.one_of(
        st.builds(Write, st.integers(1, 8)),
        st.builds(Batch, st.one_of(st.none(), st.integers(1, 40)), st.sampled_from([None, None, "before", "after"])),
    ),
    min_size=1,
    max_size=18,
)
_examples = itertools.count()


def fold(tables: list[pa.Table], keys: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Apply records in delivery order: partial updates keep the columns they leave unchanged, the insert half of
    a key change takes them from the old key's row."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    deleted: dict[tuple[Any, ...], dict[str, Any]] = {}
    for t in tables:
        for row in t.to_pylist():
            key = tuple(row[k] for k in keys)
            if row["_op"] == "delete":
                if key in state:
                    deleted[key] = state.pop(key)
                continue
            values = {k: v for k, v in row.items() if not k.startswith("_")}
            old = row.get(OLD_KEY)
            for col in row.get("_unchanged") or []:
                values[col] = (state[key] if old is None else deleted[tuple(old[k] for k in keys)])[col]
            state[key] = values
    return state


def assert_increasing_per_key(tables: list[pa.Table], keys: tuple[str, ...]) -> None:
    last: dict[tuple[Any, ...], int] = {}
    for t in tables:
        seen: dict[tuple[Any, ...], list[int]] = {}
        for row in t.select([*keys, "_seq"]).to_pylist():
            seen.setdefault(tuple(row[k] for k in keys), []).append(row["_seq"])
        for key, seqs in seen.items():
            ordered = sorted(seqs)
            assert len(set(ordered)) == len(ordered), f"key {key}: a record delivered twice in one batch {seqs}"
            assert ordered[0] > last.get(key, -1), f"key {key}: _seq {ordered[0]} after {last[key]}"
            last[key] = ordered[-1]


class Query:
    """A query's driver: its backend and planner, replaced when the driver dies."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.backend: Backend = open_backend("postgres", options)
        self.planner = Planner(self.backend)

    def restart(self) -> None:
        self.backend.close()
        self.backend = open_backend("postgres", self.options)
        self.planner = Planner(self.backend)

    def drain(self, start: dict[str, Any]) -> Iterator[tuple[dict[str, Any], pa.Table]]:
        for _ in range(500):
            end = self.planner.next(start)
            if end == start:
                state = Offset.from_json(end).snapshot
                if state is None or not state.pending:  # late entries expire with the next changes
                    return
                continue
            yield end, read_batch(self.backend, start, end)
            self.backend.acknowledge(positions(end))
            start = end
        raise AssertionError("the snapshot never finished")


@pytest.mark.slow
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(KINDS)), rows=st.integers(0, 60), chunk_rows=st.integers(2, 15),
       per_batch=st.integers(1, 3), steps=STEPS, seed=st.integers(0, 2**32))
def test_chunked_snapshot_histories_equal_select_star(
    postgres_dsn: str, tmp_path: Path, kind: str, rows: int, chunk_rows: int, per_batch: int, steps: list[Any],
    seed: int,
) -> None:
    rng = random.Random(seed)
    n = next(_examples)
    conn = psycopg.connect(postgres_dsn, autocommit=True)
    name = f"chunked_{n}"
    table = Table(conn, name, KINDS[kind])
    table.load(rows, rng)
    options = {"dsn": postgres_dsn, "tables": name, "slot.name": f"chunked_{n}",
               "snapshot.path": str(tmp_path / f"snap{n}"), "snapshot.chunkRows": str(chunk_rows),
               "snapshot.chunksPerBatch": str(per_batch)}
    query = Query(options)
    # Re-keying a row whose TOASTed value stays needs the key-change link (_old_key) to be applied at all.
    table.rekey_toasted = OLD_KEY in query.backend.schema().names
    keys = KINDS[kind].names
    try:
        start = query.planner.initial("snapshot")
        delivered: list[pa.Table] = []
        committed: dict[str, Any] | None = None
        for step in steps:
            if isinstance(step, Write):
                with conn.transaction():
                    for _ in range(step.changes):
                        table.step(rng)
                continue
            if committed is not None:  # Spark commits a batch when it plans the next one
                query.backend.acknowledge(positions(committed))
            end = query.planner.next(start, step.limit)
            if end == start:
                continue
            if step.crash == "before":  # logged, never read: the restarted driver reads it without its cut
                query.restart()
            out = read_batch(query.backend, start, end)
            if step.crash == "after":
                query.restart()
            again = read_batch(query.backend, start, end)  # a retried task, or the replay after the crash
            assert again.equals(out)
            delivered.append(out)
            start = committed = end
        delivered += [t for _, t in query.drain(start)]
        assert fold(delivered, keys) == table.rows()
        assert_increasing_per_key(delivered, keys)
    finally:
        query.backend.close()
        connection.drop_slot(conn, f"chunked_{n}")
        conn.close()
