"""Maintenance of the sink's tables: expired tombstones purged from the state table, small files compacted,
every ``compact_every`` batches (:func:`due`); each step one commit, readers never blocked."""

from __future__ import annotations

from datetime import datetime

from sinks.delta.engine import Engine
from sinks.delta.scd1 import purge_predicate
from sinks.delta.spec import SinkSpec


def due(compact_every: int | None, first: int, last: int) -> bool:
    """True when one of the batches ``first`` to ``last`` (merged in one commit) is a multiple of
    ``compact_every`` (counting from 1: batch ids ``compact_every - 1``, ``2 * compact_every - 1``, ...);
    None disables maintenance."""
    if not compact_every:
        return False
    return (last + 1) // compact_every > first // compact_every


def maintain(spec: SinkSpec, main: Engine, state: Engine, now: datetime) -> None:
    """Purge the state table's tombstones older than the retention (SCD type 1), then compact both tables."""
    if state.schema() is not None:
        purge = purge_predicate(spec, now)
        if purge is not None:
            state.delete(purge)
        state.compact()
    if main.schema() is not None:
        main.compact()
