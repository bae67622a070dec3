"""The Spark face of cdc-tunnel: the ``cdc`` Python data source (streaming and batch reads).

The driver-side reader plans batches with :class:`~cdc.planner.Planner` and keeps every channel's
position in the offsets Spark writes to its own offset log; executors read one channel range per input
partition (or, under ``minPartitions``, one piece of a range: :mod:`cdc.partitions`) through the backend's
picklable :class:`~cdc.backend.RangeReader`, yielding Arrow batches.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructField, StructType

from cdc.backend import Backend, RangeReader, backend_class
from cdc.channels import ChannelRange, Position
from cdc.errors import CdcError, OptionError
from cdc.lag import measure, to_report
from cdc.model import KEY_ORDER_MARK, SEQ
from cdc.offsets import ChannelOffset, Offset, OffsetJson
from cdc.options import BackendOptions, SourceOptions, split_and_parse
from cdc.partitions import check_splittable, split_ranges
from cdc.planner import Planner, describe

log = logging.getLogger(__name__)


@dataclass
class ChannelPartition(InputPartition):
    """One channel range of one batch and the reader that reads it; pickled to an executor.

    A plain dataclass, as :class:`pyspark.sql.datasource.InputPartition` documents its subclasses."""

    range: ChannelRange
    reader: RangeReader


def _conform(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Yield batches with exactly ``schema`` (Spark rejects any difference, nullability aside)."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if batch.schema.equals(schema):
            yield batch
        else:
            yield pa.RecordBatch.from_arrays(
                [batch.column(i).cast(f.type) for i, f in enumerate(schema)], schema=schema
            )


class _Config:
    """Parsed options shared by the stream and batch readers. Picklable; holds no connections."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.backend_cls: type[Backend] = named_backend(raw, "read")
        self.source: SourceOptions
        self.backend_options: BackendOptions
        self.source, self.backend_options = split_and_parse(raw, self.backend_cls.options_model, self.backend_cls.name)
        check_splittable(self.backend_cls, self.backend_options, self.source.min_partitions)

    def open(self) -> Backend:
        return self.backend_cls(self.backend_options)


class _ReaderBase:
    def __init__(self, config: _Config, schema: StructType) -> None:
        self._config = config
        self._arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._backend: Backend | None = None
        self._planner: Planner | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_backend"] = None  # driver-side connections never travel to executors
        state["_planner"] = None
        return state

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self._config.open()
        return self._backend

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(
                self.backend,
                fail_on_data_loss=self._config.source.fail_on_data_loss,
                max_records_per_channel=self._config.source.max_records_per_channel,
            )
        return self._planner

    def _partitions(self, start: OffsetJson, end: OffsetJson) -> list[ChannelPartition]:
        self.planner.prepare_read(end)
        ranges = Planner.ranges(start, end)
        log.debug("batch ranges: %s", describe(ranges))
        if any(r.window is not None for r in ranges):
            chunked = self.backend.chunked_snapshot()
            if chunked is not None:
                chunked.prepare(ranges)  # a replayed batch whose cut is gone gets one to read at
        return self._pieces(ranges)

    def _pieces(self, ranges: list[ChannelRange]) -> list[ChannelPartition]:
        pieces = split_ranges(ranges, self._config.source.min_partitions, self.backend)
        reader = self.backend.reader()
        return [ChannelPartition(r, reader) for r in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ChannelPartition):
            # PySpark hands a batch read that planned no partition one InputPartition(None) all the same.
            return iter(())
        r = partition.range
        if r.window is not None:
            return _conform(partition.reader.read_window(r.channel, r.start, r.end, r.window), self._arrow_schema)
        return _conform(partition.reader.read(r.channel, r.start, r.end), self._arrow_schema)


class CdcStreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: offsets are every channel's position; see :mod:`cdc.planner`."""

    def __init__(self, config: _Config, schema: StructType) -> None:
        super().__init__(config, schema)
        self._target: dict[str, Position] | None = None
        self._planned: OffsetJson | None = None
        self._initial: OffsetJson | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._last_trigger: float | None = None

    def initialOffset(self) -> OffsetJson:
        # Computed once per run: Spark asks again for the first batch (when it plans the batch's end, and
        # when it runs the batch from its start), and a snapshot start must not export a second snapshot.
        if self._initial is None:
            source = self._config.source
            self._initial = self.planner.initial(source.starting_offsets, source.starting_time)
            log.info("starting from %s", Offset.from_json(self._initial).positions())
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._config.source.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: OffsetJson, limit: ReadLimit) -> OffsetJson:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = self._config.source.max_bytes_per_trigger
        if max_bytes is not None:
            by_size = self._rows_for_bytes(max_bytes)
            if by_size is not None:
                max_rows = by_size if max_rows is None else min(max_rows, by_size)
        end = self.planner.next(start, max_rows, self._target)
        if end != start and self._delayed(self.planner.last_records):
            return start
        self._planned = end
        return end

    def _delayed(self, available: int) -> bool:
        """``minRecordsPerTrigger`` with ``maxTriggerDelay``, as Kafka's source does it: skip this trigger while
        fewer records than the minimum are there and the last batch ran less than the delay ago. The first
        batch of a run and every batch under Trigger.AvailableNow run at once."""
        source = self._config.source
        now = self._clock()
        minimum = source.min_records_per_trigger
        if minimum is not None and self._target is None and self._last_trigger is not None:
            waited = now - self._last_trigger
            if available < minimum and waited < source.max_trigger_delay_s:
                log.debug("%d records < minRecordsPerTrigger=%d after %.1f s: waiting", available, minimum, waited)
                return True
        self._last_trigger = now
        return False

    def _rows_for_bytes(self, max_bytes: int) -> int | None:
        """``maxBytesPerTrigger`` as a record count, from the backend's average record size (at least one
        record, so a batch always makes progress); ``None`` while no record has been seen."""
        backend = self.backend
        size = backend.average_record_bytes()
        if size is None:
            raise OptionError(
                f"option 'maxBytesPerTrigger': backend {backend.name!r} cannot estimate record sizes; "
                "use maxRecordsPerTrigger",
                "maxBytesPerTrigger",
            )
        if size <= 0:
            return None
        rows = max(1, int(max_bytes // size))
        log.debug("maxBytesPerTrigger=%d at ~%.0f bytes per record: %d records", max_bytes, size, rows)
        return rows

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.until("latest")
        log.info("Trigger.AvailableNow target: %s", self._target)

    def reportLatestOffset(self) -> OffsetJson | None:
        """Each channel's head and the lag of the batch just planned (see :mod:`cdc.lag`): the only figures a
        Python source can put into query progress, where Spark shows them as the source's ``latestOffset``."""
        backend = self.backend
        if self._planned is None:  # nothing planned yet in this run: the heads alone
            return Offset({c.id: ChannelOffset(backend.latest(c.id)) for c in backend.list_channels()}).to_json()
        planned = Offset.from_json(self._planned)
        positions = {cid: e.pos for cid, e in planned.channels.items() if not e.snapshot}
        now = datetime.now(UTC)
        try:
            lags = measure(backend, positions, now)
        except CdcError as exc:  # a report is no reason to fail the query
            log.warning("measuring the lag per channel failed: %s", exc)
            return None
        return to_report(lags, now)

    def partitions(self, start: OffsetJson, end: OffsetJson) -> Sequence[InputPartition]:
        return self._partitions(start, end)

    def commit(self, end: OffsetJson) -> None:
        try:
            self.backend.acknowledge(Offset.from_json(end).positions())
        except Exception as exc:  # acknowledgement is best effort; correctness never depends on it
            log.warning("acknowledging committed positions failed (will retry on the next commit): %s", exc)

    def stop(self) -> None:
        if self._backend is not None:
            self._backend.close()


class CdcBatchReader(_ReaderBase, DataSourceReader):
    """Batch reader: a bounded stream from ``startingOffsets`` to ``endingOffsets``, all channels at once."""

    def partitions(self) -> Sequence[InputPartition]:
        source = self._config.source
        if source.ending_offsets.strip().lower() == "earliest":
            raise OptionError("option 'endingOffsets': accepted values are latest or a JSON object", "endingOffsets")
        if source.starting_offsets.strip().lower() == "latest":
            raise OptionError(
                "option 'startingOffsets': 'latest' is not allowed for batch reads; accepted values: earliest, JSON",
                "startingOffsets",
            )
        if source.starting_time is None and source.starting_offsets.strip().lower() == "snapshot":
            chunked = self.backend.chunked_batch_snapshot()
            if chunked is not None:  # the driver reads the chunks here, at their cuts; the tasks read its files
                ranges = self.planner.chunked_batch(chunked, source.ending_offsets, source.ending_time)
                return self._pieces(ranges)
        start = self.planner.initial(source.starting_offsets, source.starting_time, batch=True)
        return self._partitions(start, self.planner.batch_end(start, source.ending_offsets, source.ending_time))


class CdcDataSource(DataSource):
    """``spark.readStream.format("cdc")`` / ``spark.read.format("cdc")``."""

    @classmethod
    def name(cls) -> str:
        return "cdc"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed: _Config | None = None
        self._schema: StructType | None = None

    @property
    def _config(self) -> _Config:
        # Parsed on first use: a write (``df.write.format("cdc")``) takes the sink's options instead.
        if self._parsed is None:
            self._parsed = _Config(self.options)
        return self._parsed

    def schema(self) -> StructType:
        if self._schema is None:
            backend = self._config.open()
            try:
                self._schema = _marked(from_arrow_schema(backend.schema()), type(backend).orders_keys)
            finally:
                backend.close()
        return self._schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return CdcStreamReader(self._config, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return CdcBatchReader(self._config, schema)

    # Writes go to the change-log system named by ``backend``, if it accepts them (see Backend.writer).
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return named_backend(self.options, "write").writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return named_backend(self.options, "write").stream_writer(self.options, schema, overwrite)


def _marked(schema: StructType, orders_keys: bool) -> StructType:
    """``schema`` with ``_seq`` carrying :data:`cdc.model.KEY_ORDER_MARK` when the backend orders every key's
    changes: the value is this source instance's own id, so that a union of two sources (two ids, or one id
    over two scans) is told apart from one source's output."""
    if not orders_keys or SEQ not in schema.names:
        return schema
    fields = [
        StructField(f.name, f.dataType, f.nullable, {**(f.metadata or {}), KEY_ORDER_MARK: uuid.uuid4().hex})
        if f.name == SEQ else f
        for f in schema.fields
    ]
    return StructType(fields)


_FORMER_DEFAULTS = {"read": "local", "write": "pulsar"}


def named_backend(options: Mapping[str, Any], use: Literal["read", "write"]) -> type[Backend]:
    """The backend that option ``backend`` names: reads and writes both need it.

    Without it, this release still takes the former defaults, a read the local log and a write Pulsar, with
    a warning; the next one raises :class:`~cdc.errors.OptionError`."""
    name = next((str(v) for k, v in options.items() if k.lower() == "backend"), None)
    if name is None:
        name = _FORMER_DEFAULTS[use]
        message = (
            f"a {use} of format('cdc') without option 'backend' uses backend {name!r}; this default is deprecated "
            f"and will be removed (reads and writes will both require the option): add .option('backend', {name!r})"
        )
        log.warning(message)
        warnings.warn(message, FutureWarning, stacklevel=3)
    return backend_class(name)
