"""Hypothesis histories against a real PostgreSQL: random transactions across two tables, micro-batches
under random budgets, driver restarts, crashes between logging a batch's end offset and committing it (the
batch replays), and commits that advance the slot (as Spark's, one batch late). At the end the folded
changes equal ``SELECT *`` of both tables; nothing is delivered twice and ``_seq`` only grows."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.planner import Planner, positions
from cdc.testing import batches, read_range
from tests.backends.postgres.fold import fold_json
from tests.backends.postgres.harness import PostgresHarness


@dataclass(frozen=True)
class Txn:
    size: int


@dataclass(frozen=True)
class Batch:
    limit: int | None
    crash: bool = False


@dataclass(frozen=True)
class Restart:
    pass


STEPS = st.lists(
    st.one_of(
        st.builds(Txn, st.integers(1, 6)),
        st.builds(Batch, st.one_of(st.none(), st.integers(1, 8)), st.booleans()),
        st.just(Restart()),
    ),
    min_size=1,
    max_size=25,
)
_examples = itertools.count()


def _read(backend: Any, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    parts = [read_range(backend, r.channel, r.start, r.end) for r in Planner.ranges(start, end)]
    return pa.concat_tables(parts) if parts else backend.schema().empty_table()


@pytest.mark.slow
# Each example makes its own tables and slot, so sharing the test's database across examples is safe.
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS, seed=st.integers(0, 2**32))
def test_random_histories_deliver_each_change_once_in_order(postgres_dsn: str, steps: list[Any], seed: int) -> None:
    rng = random.Random(seed)
    n = next(_examples)
    h = PostgresHarness(postgres_dsn, tables=(f"a{n}", f"b{n}"), **{"slot.name": f"hist_{n}"})
    try:
        backend = h.backend()
        start = Planner(backend).initial("earliest")
        delivered: list[pa.Table] = []
        uncommitted: dict[str, Any] | None = None
        for step in steps:
            if isinstance(step, Txn):
                h.random_transaction(rng, step.size)
            elif isinstance(step, Restart):
                backend = h.backend()
            else:
                if uncommitted is not None:  # Spark commits a batch when it plans the next one
                    backend.acknowledge(positions(uncommitted))
                    uncommitted = None
                end = Planner(backend).next(start, step.limit)
                if end == start:
                    continue
                first = _read(backend, start, end)
                if step.crash:  # the offset log holds ``end``, the commit never happened: replay
                    backend = h.backend()
                    assert _read(backend, start, end).equals(first)
                delivered.append(first)
                start, uncommitted = end, end
        delivered += [t for _, t in batches(h.backend(), start)]
        seen = [p for t in delivered for p in t.column("_position").to_pylist()]
        assert len(seen) == len(set(seen)) and seen == sorted(seen)
        expected = {}
        for t in h.tables:
            for row in h.conn.execute(f"SELECT id, v, n FROM {t}".encode()).fetchall():
                expected[(f"public.{t}", json.dumps({"id": row[0]}, separators=(",", ":")))] = dict(
                    zip(("id", "v", "n"), row, strict=True))
        assert fold_json(delivered) == expected
    finally:
        h.close()
