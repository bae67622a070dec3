"""The backend contract: what every change-log backend (local, Pulsar, Tablestore) provides.

A change log is a set of **channels** (partitions). Each channel is an ordered sequence of records
addressed by **positions**: JSON-safe values that the backend defines (an integer index, a message id, a
tunnel token plus a count). A position names the gap *before* a record: a range ``[start, end)`` holds
the records from ``start`` up to, not including, ``end``. Channels have a **lineage**: when a channel
splits or merges, it is *finished* (no record will ever follow its final position) and its children name
it among their ``parents``. The source never delivers a child's record before every record of its parents.

Rules every backend keeps (the shared contract suite, :mod:`cdc.testing.contract`, checks them):

1. ``read(channel, start, end)`` of the same range always yields the same records, in position order,
   however often and from whichever process it is called: a batch's content is fixed by its offsets. One
   exception, where the system itself rewrites its log: a compacted Kafka topic (``cleanup.policy=compact``)
   drops a record once a later record of the same key exists, so a replayed range may hold *fewer* records,
   never other ones, and never the last record of a key (a sink that keeps the latest change per key ends
   the same); the offsets left without a record are no data loss (rule 3 is about positions no longer held).
   Ranges of a chunked snapshot (:mod:`cdc.snapshots`, read with :meth:`RangeReader.read_window`) are read
   live, so for them the rule is: **every read of a chunk is exact with respect to its cut** (it yields the
   chunk's rows exactly as of the cut it records, with that cut's ``_seq``: the batch's planned cut, or, when
   that cut was gone before any read of the chunk completed, a later one); **once a read has completed, every
   later read yields the same records** (a retried task, a replayed batch); and the next batch's planning
   learns a later cut and holds back the changes its rows already include. A change range holds back exactly
   the keys its window names, so it too yields the same records every time.
   (:class:`cdc.testing.contract.ChunkedSnapshotContract` checks it.)
2. ``plan(channel, start, max_records, until)`` never plans past what exists now, nor past ``until``,
   nor more than ``max_records`` records; it reports how many records the range holds and whether its
   end is the channel's final end (``finished``). Without a budget (``max_records=None``) the count may
   be a lower bound, zero exactly when the range is empty: a backend that can find the head without
   reading the records need not count them (Pulsar with ``reader.topic=partition``).
3. A ``start`` the backend no longer holds raises :class:`~cdc.errors.DataLossError`.
4. ``acknowledge`` is best effort: it may lose a race or fail; correctness never depends on it.
5. Driver-side objects may hold connections; the :class:`RangeReader` from :meth:`Backend.reader`
   is pickled to executors and must open its own connections there.
6. A batch read (``spark.read``, no offset log: nothing replays it) that ends at the head plans to
   :meth:`Backend.batch_read_end`. A backend that finds its head only by reading every record may return
   a position there that its reader resolves while reading (the range then holds every record committed
   before the call, and none after), and ``plan`` without a budget may return it as the end unread.
7. ``split_points(channel, start, end, parts)`` (``minPartitions``) gives positions inside the range, found
   without reading it, that cut it into adjacent ranges the reader reads like any other; the same answer
   whenever it is asked for the same range (a replayed batch splits the same way).

Example (the local backend)::

    backend = open_backend("local", {"path": "/data/orders-log"})
    for ch in backend.list_channels():
        start = backend.earliest(ch.id)
        planned = backend.plan(ch.id, start, max_records=1000)
        for batch in backend.reader().read(ch.id, start, planned.end):
            ...  # pyarrow.RecordBatch with backend.schema()
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from cdc.channels import Position as Position
from cdc.errors import MissingExtraError, OptionError, PositionError, requires_extra
from cdc.options import BackendOptions, OptionDoc, SourceOptions, describe_options

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
    from pyspark.sql.types import StructType

    from cdc.snapshots.planning import ChunkedSnapshot



@dataclass(frozen=True)
class ChannelInfo:
    """A channel as the backend sees it now."""

    id: str
    parents: tuple[str, ...] = ()
    finished: bool = False
    """No record will ever be added past the channel's final position (closed by a split or merge)."""
    follows: tuple[str, ...] = ()
    """Channels whose records, up to their heads when a query first sees this channel, precede this channel's
    records (a Kafka partition added to a topic while a query runs: the keys it takes over had their earlier
    records in the older partitions). A channel that appears while a query runs starts only once the query's
    positions in these channels reached those heads (the planner keeps them in the channel's offset entry as
    ``after``); a channel present when the query starts has nothing to wait for. Positions of such channels
    compare with ``>=`` (integers)."""


@dataclass(frozen=True)
class PlannedRange:
    """The outcome of planning one channel's range."""

    end: Position
    records: int
    """Records in the range: exact when planned with a budget, else possibly a lower bound (see rule 2)."""
    finished: bool = False
    """``end`` is the channel's final end: the channel is exhausted for good."""


@dataclass(frozen=True)
class ChannelHead:
    """A channel's head seen from a query's position (:meth:`Backend.heads`)."""

    head: Position
    """The position after the last record that exists now."""
    behind: int | None
    """Records from the query's position to the head (``None``: the backend cannot count them)."""
    head_time: datetime | None = None
    """Commit time of the last record before the head (``None``: empty, or no commit times)."""
    position_time: datetime | None = None
    """Commit time of the last record before the query's position: the last change it delivered."""
    measures: Mapping[str, float] = field(default_factory=dict)
    """The system's own lag measures, camelCase names: Tablestore ``rpoMs``, Pulsar ``backlog``."""


@dataclass(frozen=True)
class SnapshotInfo:
    """A full snapshot of the table at a consistent cut of the change log (``startingOffsets=snapshot``).

    ``chunks`` are channel ids whose records are the snapshot's rows (``_op = snapshot``), readable with
    ``plan``/``read`` like any channel but never listed by ``list_channels``. ``positions`` holds, for every
    change channel that existed at the cut, the position right after the last change the snapshot
    includes; every change after those positions is newer than every snapshot row (larger ``_seq``).
    """

    id: str
    chunks: tuple[str, ...]
    positions: Mapping[str, Position]


@dataclass(frozen=True)
class SourceChange:
    """What changed in a backend's set-up since an offset was written (:meth:`Backend.resume`)."""

    added: tuple[str, ...] = ()
    """Tables to snapshot in chunks and then stream (see :class:`cdc.snapshots.planning.TableAdder`)."""
    removed: tuple[str, ...] = ()
    """Tables no longer read (their cursors leave a chunked snapshot in progress)."""


class RangeReader(ABC):
    """Reads planned ranges on executors. Picklable; opens its own connections lazily."""

    @abstractmethod
    def read(self, channel: str, start: Position, end: Position) -> Iterator[pa.RecordBatch]:
        """Yield the records of ``[start, end)`` of ``channel``, in order, as Arrow batches."""

    def read_window(self, channel: str, start: Position, end: Position, window: Any) -> Iterator[pa.RecordBatch]:
        """A range that carries a window (:attr:`cdc.channels.ChannelRange.window`: a chunked snapshot's chunk or
        a change range holding keys back). Backends that offer chunked snapshots override."""
        raise PositionError(f"this backend's reader cannot read a range with a window: {channel!r} {window!r}")


class Backend(ABC):
    """A change log made of channels. Lives on the driver; one instance per query run."""

    name: ClassVar[str]
    options_model: ClassVar[type[BackendOptions]]
    #: True when every key's changes reach a query in sequence order, across channels and batches (one
    #: ordered log per table, or per-key channels that never move). The source then marks its ``_seq`` field
    #: (:data:`cdc.model.KEY_ORDER_MARK`), which a sink may take as leave to skip out-of-order protection.
    orders_keys: ClassVar[bool] = False

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    @abstractmethod
    def schema(self) -> pa.Schema:
        """The Arrow schema of the records this backend yields (Spark-compatible)."""

    @abstractmethod
    def list_channels(self) -> Sequence[ChannelInfo]:
        """Every channel that exists now, finished ones included while the backend still knows them."""

    @abstractmethod
    def earliest(self, channel: str) -> Position:
        """The first position the backend still holds."""

    @abstractmethod
    def latest(self, channel: str) -> Position:
        """The position after the last record that exists now (the final end of a finished channel)."""

    @abstractmethod
    def plan(
        self, channel: str, start: Position, max_records: int | None = None, until: Position | None = None
    ) -> PlannedRange:
        """Plan ``[start, end)``: at most ``max_records`` records, never past ``until`` or the head."""

    @abstractmethod
    def reader(self) -> RangeReader:
        """A picklable reader for executors."""

    def batch_read_end(self, channel: str) -> Position:
        """The end of a batch read's range that runs to the channel's head (rule 6). Default: :meth:`latest`."""
        return self.latest(channel)

    def channel_positions(self, given: dict[str, Any]) -> dict[str, Any]:
        """``startingOffsets``/``endingOffsets`` JSON as ``{channel: position}``: backends whose ecosystem writes
        it in another form (Spark's Kafka source: ``{"topic": {"0": 42}}``) read that here. Default: as given."""
        return given

    def parse_position(self, channel: str, value: Any) -> Position:
        """Validate a user-given position (from ``startingOffsets`` JSON); backends override."""
        return value

    def split_points(self, channel: str, start: Position, end: Position, parts: int) -> Sequence[Position]:
        """At most ``parts - 1`` positions strictly inside ``[start, end)``, in position order, that cut the
        range into pieces of about equal size for ``minPartitions`` (rule 7; :mod:`cdc.partitions`).

        Found without reading the range, and a function of the arguments and of facts about the range that
        never change (the local log's segment boundaries, a Pulsar ledger's entries), so a replayed batch splits
        the same way. Fewer (or none, then one task reads the range) where the backend finds fewer. Default:
        none; such a backend refuses ``minPartitions`` (:meth:`split_refusal`)."""
        return ()

    def range_size(self, channel: str, start: Position, end: Position) -> int | None:
        """The size of ``[start, end)`` in a unit of the backend's (records, entries), found without reading it,
        by which ``minPartitions`` shares tasks among a batch's ranges; ``None``: unknown (ranges then count
        alike). Default: ``None``."""
        return None

    @classmethod
    def split_refusal(cls, options: BackendOptions) -> str | None:
        """Why this backend, with these options, cannot read a channel's range in several tasks (option
        ``minPartitions`` is then refused with this reason), or ``None`` when it can. Default: a reason unless
        the backend overrides :meth:`split_points`."""
        if cls.split_points is Backend.split_points:
            return "it finds no positions inside a channel's range without reading it"
        return None

    def position_at(self, channel: str, when: datetime) -> Position:
        """The position before the channel's first record committed at or after ``when`` (the head if none is):
        ``startingTimestamp`` and ``endingTimestamp``. Backends that keep commit times override."""
        raise OptionError(
            f"option 'startingTimestamp'/'endingTimestamp': backend {self.name!r} cannot find positions by time; "
            "use startingOffsets/endingOffsets",
            "startingTimestamp",
        )

    def prepare_start(self) -> None:  # noqa: B027 - optional hook
        """Called when a query asks for its initial offset, before any position is read, unless it starts
        with a snapshot (:meth:`snapshot` then sets up the start itself). A backend that must create state
        to hold a query's changes (PostgreSQL's replication slot) creates it here: ``list_channels`` and
        ``latest`` also serve reads that must create nothing (Trigger.AvailableNow's target, which Spark
        asks for before the initial offset; lag; status). Idempotent: a restarted driver asks again."""

    def snapshot(self) -> SnapshotInfo:
        """Take a snapshot for the full-plus-incremental hand-off; backends that can, override."""
        raise OptionError(
            f"option 'startingOffsets': backend {self.name!r} does not offer snapshots; "
            "accepted values: earliest, latest, or JSON per channel",
            "startingOffsets",
        )

    def chunked_snapshot(self) -> ChunkedSnapshot | None:
        """The chunked snapshot of ``startingOffsets=snapshot`` (:mod:`cdc.snapshots`), where the backend offers one
        and the options choose it; ``None`` (the default): :meth:`snapshot` takes an exported one."""
        return None

    def chunked_batch_snapshot(self) -> ChunkedSnapshot | None:
        """The chunked snapshot a *batch* read with ``startingOffsets=snapshot`` takes, where the backend's chunks
        are read on the driver while their cut is held (:meth:`ChunkedSnapshot.prepare`), so that no cut has to
        outlive planning (PySpark plans a batch read in a worker that exits before the tasks run). It keeps its
        files apart from any streaming query's, and :meth:`chunked_snapshot` returns it from then on. ``None``
        (the default): a batch read takes :meth:`snapshot`'s exported one."""
        return None

    def source_state(self) -> dict[str, Any] | None:
        """What the backend records of its own set-up in every offset the planner writes (JSON ``source``), so
        that the query restarted with other options can tell what changed (:meth:`resume`). ``None`` (the
        default): nothing."""
        return None

    def resume(self, recorded: Mapping[str, Any] | None, *, planning: bool) -> SourceChange:
        """Called with an offset's ``source`` (``None``: the offset holds none) before the planner plans from it
        (``planning``) or a batch that ends at it is read (a replay after a restart). The backend adopts what
        must stay as recorded (PostgreSQL: the query's slot and publication) and returns what changed since;
        the planner snapshots the added tables. The default: nothing changes."""
        return SourceChange()

    def resnapshots(self) -> tuple[str, ...]:
        """The tables whose re-snapshot a signal asked for in the change ranges the backend planned since the last
        call (PostgreSQL: ``cdc postgres resnapshot``, a message in the WAL; the same range always holds the same
        signals, so a re-planned batch decides the same). The planner snapshots them again in chunks, as tables
        added to the running query (:class:`cdc.snapshots.planning.TableAdder`). The default: none."""
        return ()

    def average_record_bytes(self) -> float | None:
        """The average size of a record, in bytes, as far as the backend can tell now (``None``: it cannot).

        ``maxBytesPerTrigger`` divides by it to turn a byte budget into a record budget: an estimate, so
        the limit is soft (as in other Spark sources). ``0.0`` means no record has been seen yet."""
        return None

    def heads(self, positions: Mapping[str, Position]) -> dict[str, ChannelHead]:
        """Every named channel's head, and how far ``positions`` (a query's) are behind it.

        Backends override to add commit times and their own measures; this default only knows the head and
        the record count that planning up to it gives (a lower bound where planning counts lazily, rule 2).
        """
        out = {}
        for cid, pos in positions.items():
            head = self.latest(cid)
            out[cid] = ChannelHead(head, self.plan(cid, pos, None, head).records)
        return out

    def acknowledge(self, positions: Mapping[str, Position]) -> None:  # noqa: B027 - optional hook
        """Best effort: tell the backend the query has durably processed up to these positions."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release driver-side resources."""

    # Writes (``df.write.format("cdc").option("backend", name)``): optional. They take the raw options
    # because a system's write options are not its read options; no backend instance is opened for them.
    @classmethod
    def writer(cls, options: Mapping[str, Any], schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The Spark batch writer of a backend that accepts writes; others raise :class:`OptionError`."""
        raise _no_writes(cls.name)

    @classmethod
    def stream_writer(cls, options: Mapping[str, Any], schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The Spark streaming writer of a backend that accepts writes; others raise :class:`OptionError`."""
        raise _no_writes(cls.name)

    @classmethod  # noqa: B027 - optional hook
    def register_spark(cls, spark: Any) -> None:
        """Register this backend's own Spark data sources, besides ``format("cdc")``, with ``spark`` (a
        table scan, a sink-only format name). :func:`cdc.register` calls it for every backend installed here,
        so a backend whose sources need an optional client package checks for it here. Default: none."""

    @classmethod
    def accepts_writes(cls) -> bool:
        """Whether the backend overrides :meth:`writer`."""
        return getattr(cls.writer, "__func__", None) is not getattr(Backend.writer, "__func__", None)


# Backends are imported lazily so that, say, the local backend works without pulsar-client's C++ core.
BACKENDS: dict[str, str] = {
    "local": "cdc.backends.local:LocalBackend",
    "pulsar": "cdc.backends.pulsar:PulsarBackend",
    "tablestore": "cdc.backends.tablestore:TablestoreBackend",
    "postgres": "cdc.backends.postgres:PostgresBackend",
    "kafka": "cdc.backends.kafka:KafkaBackend",
    "mysql": "cdc.backends.mysql:MySQLBackend",
}


# The extra (`pip install 'cdc-tunnel[<extra>]'`) that brings each backend's client library.
BACKEND_EXTRAS: dict[str, str] = {
    "pulsar": "pulsar",
    "tablestore": "tablestore",
    "postgres": "postgres",
    "kafka": "kafka",
    "mysql": "mysql",
}

# Each backend's options model, importable without the backend's client library (`cdc options`, the docs).
BACKEND_OPTIONS: dict[str, str] = {
    "local": "cdc.backends.local.options:LocalOptions",
    "pulsar": "cdc.backends.pulsar.options:PulsarOptions",
    "tablestore": "cdc.backends.tablestore.options:TablestoreOptions",
    "postgres": "cdc.backends.postgres.options:PostgresOptions",
    "kafka": "cdc.backends.kafka.options:KafkaOptions",
    "mysql": "cdc.backends.mysql.options:MySQLOptions",
}


@dataclass
class _Registry:
    extra: dict[str, type[Backend]] = field(default_factory=dict)


_registry = _Registry()


def register_backend(cls: type[Backend]) -> None:
    """Make a third-party backend available under ``cls.name``."""
    _registry.extra[cls.name] = cls


def available_backends() -> list[str]:
    return sorted(set(BACKENDS) | set(_registry.extra))


def backend_class(name: str) -> type[Backend]:
    key = name.strip().lower()
    if key in _registry.extra:
        return _registry.extra[key]
    target = BACKENDS.get(key)
    if target is None:
        raise OptionError(
            f"option 'backend': unknown backend {name!r}; accepted values: {', '.join(available_backends())}",
            "backend",
        )
    module, _, attr = target.partition(":")
    with requires_extra(BACKEND_EXTRAS.get(key, key), f"backend {key!r}"):
        cls: type[Backend] = getattr(importlib.import_module(module), attr)
    return cls


def options_model(name: str) -> type[BackendOptions]:
    """The options model of backend ``name``, without importing the backend itself where it is known."""
    key = name.strip().lower()
    target = BACKEND_OPTIONS.get(key)
    if target is None or key in _registry.extra:
        return backend_class(key).options_model
    module, _, attr = target.partition(":")
    model: type[BackendOptions] = getattr(importlib.import_module(module), attr)
    return model


def option_tables(backend: str | None = None) -> list[tuple[str, list[OptionDoc]]]:
    """The source's options, then ``backend``'s, as ``(title, rows)`` (``cdc options``, the docs' tables)."""
    source = [
        replace(row, type="one of " + ", ".join(f"`{b}`" for b in available_backends()))
        if row.name == "backend" else row
        for row in describe_options(SourceOptions)
    ]
    tables = [("source", source)]
    if backend:
        tables.append((f"backend={backend}", describe_options(options_model(backend))))
    return tables


def installed_backends() -> list[type[Backend]]:
    """The class of every backend that imports in this installation."""
    classes = []
    for name in available_backends():
        try:
            classes.append(backend_class(name))
        except (OptionError, MissingExtraError):  # its package's dependencies are not installed here
            continue
    return classes


def writing_backends() -> list[str]:
    """The backends that accept writes (imports each available backend to ask it)."""
    return [cls.name for cls in installed_backends() if cls.accepts_writes()]


def _no_writes(name: str) -> OptionError:
    return OptionError(
        f"option 'backend': backend {name!r} does not accept writes; accepted values for writes: "
        f"{', '.join(writing_backends()) or 'none in this installation'}",
        "backend",
    )


def open_backend(name: str, raw_options: Mapping[str, Any]) -> Backend:
    """Open a backend from raw (string) options, outside Spark."""
    from cdc.options import parse

    cls = backend_class(name)
    return cls(parse(cls.options_model, raw_options, what=f"backend {name!r}"))
