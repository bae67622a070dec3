"""The harness a backend's tests implement, and the helpers that read through the planner."""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from cdc.backend import Backend, Position
from cdc.planner import Planner


class Harness(ABC):
    """Writes into one backend's change log on behalf of the contract suite and :func:`cdc.testing.play`.

    ``append`` writes ``n`` new records; the suite only counts and compares what it reads back, so the
    harness chooses keys and values. Backends whose channels cannot split or merge set the flags false
    (the lineage tests then skip, saying so).
    """

    supports_split: bool = True
    supports_merge: bool = True
    exact_counts_without_budget: bool = True
    """False for a backend that reports a lower bound as ``records`` when planning has no record budget."""
    identity_columns: tuple[str, ...] = ("_channel", "_position")
    """Columns that identify a record (what :func:`cdc.testing.play` checks is never delivered twice)."""
    order_columns: tuple[str, str] | None = ("_channel", "_seq")
    """(channel, order) columns: per channel, order increases in delivery order; ``None``: not checked
    (records outside the change model, such as raw Pulsar messages)."""

    @abstractmethod
    def backend(self) -> Backend:
        """A fresh driver-side backend over the harness's log."""

    @abstractmethod
    def append(self, n: int, channel: str | None = None) -> None:
        """Append ``n`` records, to ``channel`` or spread by key. Returns once they are readable."""

    # A backend that offers chunked snapshots (:mod:`cdc.snapshots`) runs :class:`~cdc.testing.contract.
    # ChunkedSnapshotContract` too: its harness keeps one keyed table and implements these.
    def start_chunked(self, rows: int, chunk_rows: int) -> Backend:
        """Fill the table with ``rows`` rows and return a backend whose ``startingOffsets=snapshot`` is chunked,
        ``chunk_rows`` rows a chunk."""
        raise NotImplementedError("this backend offers no chunked snapshots")

    def update(self, n: int) -> None:
        """Change ``n`` existing rows (values only), in one transaction."""
        raise NotImplementedError("this backend offers no chunked snapshots")

    def table(self) -> dict[Any, dict[str, Any]]:
        """The table now, by key: what a consumer applying every record must end with."""
        raise NotImplementedError("this backend offers no chunked snapshots")

    def split(self, channel: str) -> Sequence[str]:
        raise NotImplementedError("this backend's channels do not split")

    def merge(self, channels: Sequence[str]) -> str:
        raise NotImplementedError("this backend's channels do not merge")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop whatever the harness started."""


def read_range(backend: Backend, channel: str, start: Position, end: Position) -> pa.Table:
    """The records of ``[start, end)`` as an executor reads them: through a pickled copy of the reader."""
    reader = pickle.loads(pickle.dumps(backend.reader()))
    return pa.Table.from_batches(list(reader.read(channel, start, end)), schema=backend.schema())


def read_batch(backend: Backend, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    """The records of the batch ``(start, end]`` as Spark's tasks read them (:mod:`cdc.source`): every range
    through a pickled reader, a chunked snapshot's chunks and held-back change ranges included."""
    Planner(backend).prepare_read(end)
    ranges = Planner.ranges(start, end)
    if any(r.window is not None for r in ranges):
        chunked = backend.chunked_snapshot()
        if chunked is not None:
            chunked.prepare(ranges)
    reader = pickle.loads(pickle.dumps(backend.reader()))
    tables = []
    for r in ranges:
        parts = reader.read(r.channel, r.start, r.end) if r.window is None else reader.read_window(
            r.channel, r.start, r.end, r.window)
        tables.append(pa.Table.from_batches(list(parts), schema=backend.schema()))
    return pa.concat_tables(tables) if tables else backend.schema().empty_table()


def batches(
    backend: Backend, offset: dict[str, Any] | None = None, limit: int | None = None
) -> Iterator[tuple[dict[str, Any], pa.Table]]:
    """Run the planner from ``offset`` (default: earliest) until nothing moves; yields each batch's end offset
    and its records, read through a pickled reader as executors read them."""
    planner = Planner(backend)
    start = offset if offset is not None else planner.initial("earliest")
    for _ in range(10_000):
        end = planner.next(start, limit)
        if end == start:
            return
        yield end, read_batch(backend, start, end)
        start = end
    raise AssertionError("the planner never reached the end")


def drain(backend: Backend, offset: dict[str, Any] | None = None, limit: int | None = None) -> Iterator[pa.Table]:
    """Each batch's records until nothing moves (see :func:`batches`)."""
    for _, table in batches(backend, offset, limit):
        yield table
