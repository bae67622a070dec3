"""Hypothesis histories against a real MariaDB: random transactions across two tables (inserts, updates, key
changes, deletes, text with quotes and backslashes), micro-batches under random budgets, driver restarts,
crashes between logging a batch's end offset and committing it (the batch replays), binary log rotations
(``FLUSH BINARY LOGS``) between and inside planned batches, and at most one ``kill -9`` of the server (then a
restart, and the driver restarts too, replaying the batch it had not committed). At the end the folded changes
equal ``SELECT *`` of both tables; nothing is delivered twice and ``_seq`` only grows."""

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

from cdc.planner import Planner
from cdc.testing import batches, read_range
from tests.backends.mysql.harness import MySQLHarness, connect
from tests.backends.postgres.fold import fold_json


@dataclass(frozen=True)
class Txn:
    size: int


@dataclass(frozen=True)
class Batch:
    limit: int | None
    crash: bool = False
    rotate: bool = False
    """A rotation and a new transaction between planning the batch and reading it."""


@dataclass(frozen=True)
class Restart:
    pass


@dataclass(frozen=True)
class Rotate:
    pass


STEPS = st.lists(
    st.one_of(
        st.builds(Txn, st.integers(1, 6)),
        st.builds(Batch, st.one_of(st.none(), st.integers(1, 8)), st.booleans(), st.booleans()),
        st.just(Restart()),
        st.just(Rotate()),
    ),
    min_size=3,
    max_size=25,
)
_examples = itertools.count()


def _read(backend: Any, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    parts = [read_range(backend, r.channel, r.start, r.end) for r in Planner.ranges(start, end)]
    return pa.concat_tables(parts) if parts else backend.schema().empty_table()


@pytest.mark.slow
# Each example makes its own tables, so sharing the test's database across examples is safe.
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS, kill=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)), seed=st.integers(0, 2**32))
def test_random_histories_deliver_each_change_once_in_order(
    mysql_dsn: str, mariadb_server: Any, steps: list[Any], kill: float | None, seed: int
) -> None:
    rng = random.Random(seed)
    kill_at = None if kill is None else int(kill * len(steps))
    n = next(_examples)
    h = MySQLHarness(mysql_dsn, tables=(f"a{n}", f"b{n}"))
    try:
        for t in h.tables:  # rows for the updates, key changes and deletes to hit
            h.execute(f"INSERT INTO `{t}` VALUES " + ", ".join(f"({k}, 'seed', {k})" for k in range(0, 30, 2)))
        backend = h.backend()
        start = Planner(backend).initial("earliest")
        delivered: list[pa.Table] = []
        planned: dict[str, Any] | None = None  # an end offset logged, its batch not committed yet
        for i, step in enumerate(steps):
            if i == kill_at:  # the server dies under the query; the query fails and restarts from its checkpoint
                mariadb_server.kill()
                mariadb_server.start()  # a new binary log file, after one that ends without a rotate event
                h.conn = connect(h.dsn)
                h.random_transaction(rng, 2)
                backend = h.backend()
                if planned is not None:
                    assert _read(backend, start, planned).equals(delivered[-1])  # the replay reads the same
                    start, planned = planned, None
            if isinstance(step, Txn):
                h.random_transaction(rng, step.size)
            elif isinstance(step, Rotate):
                h.execute("FLUSH BINARY LOGS")
            elif isinstance(step, Restart):
                backend = h.backend()
            else:
                if planned is not None:  # Spark commits a batch when it plans the next one
                    start, planned = planned, None
                end = Planner(backend).next(start, step.limit)
                if end == start:
                    continue
                if step.rotate:
                    h.execute("FLUSH BINARY LOGS")
                    h.random_transaction(rng, 2)
                first = _read(backend, start, end)
                if step.crash:  # the offset log holds ``end``, the commit never happened: replay
                    backend = h.backend()
                    assert _read(backend, start, end).equals(first)
                delivered.append(first)
                planned = end
        if planned is not None:
            start = planned
        delivered += [t for _, t in batches(h.backend(), start)]
        seen = [p for t in delivered for p in t.column("_position").to_pylist()]
        assert len(seen) == len(set(seen)) and seen == sorted(seen)
        expected = {}
        for t in h.tables:
            for row in h.rows(f"SELECT id, v, n FROM `{t}`"):
                expected[(f"{h.database}.{t}", json.dumps({"id": row[0]}, separators=(",", ":")))] = dict(
                    zip(("id", "v", "n"), row, strict=True))
        assert fold_json(delivered) == expected
    finally:
        h.close()
