"""Start and end by publish time on Pulsar (``startingTimestamp``, ``endingTimestamp``) through the source's
generic path (:meth:`PulsarBackend.position_at`), and ``startingTime``, the deprecated name of
``startingTimestamp``. On the session's Apache Pulsar broker."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from cdc.backends.pulsar import PulsarBackend
from cdc.errors import OptionError
from cdc.planner import Planner
from cdc.servers.pulsar import ApachePulsar, EmbeddedBroker
from cdc.source import _Config
from cdc.testing.harness import read_range
from tests.backends.pulsar.helpers import OPEN, drain, produce

KEYS = ["a", "b", "c", "d"]  # spread over both partitions


def open_backend(url: str, topic: str, **extra: str) -> tuple[_Config, PulsarBackend]:
    config = _Config({"backend": "pulsar", "service.url": url, "topic": topic, "catchUpMs": "150", **extra})
    b = config.open()
    assert isinstance(b, PulsarBackend)
    OPEN.append(b)
    return config, b


def old_cut_new(url: str, topic: str) -> int:
    """Four messages, a cut (epoch ms), then four more (batched: a batch shares one entry)."""
    produce(url, topic, [b"old%d" % i for i in range(4)], KEYS)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(url, topic, [b"new%d" % i for i in range(4)], KEYS, batching=True)
    return cut


def values(table: pa.Table) -> list[bytes]:
    return sorted(table.column("value").to_pylist())


def batch_read(config: _Config, b: PulsarBackend) -> list[bytes]:
    """What a batch read (``spark.read``) plans and reads, without Spark."""
    planner = Planner(b)
    start = planner.initial(config.source.starting_offsets, config.source.starting_time)
    end = planner.batch_end(start, config.source.ending_offsets, config.source.ending_time)
    tables = [read_range(b, r.channel, r.start, r.end) for r in planner.ranges(start, end)]
    return values(pa.concat_tables(tables)) if tables else []


def test_starting_timestamp_starts_each_partition_at_its_first_message_published_at_or_after_it(
    broker: ApachePulsar, topic: str
) -> None:
    cut = old_cut_new(broker.url, topic)
    iso = datetime.fromtimestamp(cut / 1000, UTC).isoformat()
    for given in (str(cut), iso):
        config, b = open_backend(broker.url, topic, startingTimestamp=given)
        start = Planner(b).initial(config.source.starting_offsets, config.source.starting_time)
        table, _ = drain(b, start)
        assert values(table) == [b"new%d" % i for i in range(4)], given
        assert batch_read(config, b) == [b"new%d" % i for i in range(4)], given


def test_a_start_after_every_message_is_the_head_and_later_messages_are_read(
    broker: ApachePulsar, topic: str
) -> None:
    produce(broker.url, topic, [b"old"], ["a"])
    time.sleep(0.05)
    config, b = open_backend(broker.url, topic, startingTimestamp=str(int(time.time() * 1000)))
    start = Planner(b).initial(config.source.starting_offsets, config.source.starting_time)
    produce(broker.url, topic, [b"later"], ["b"])
    table, _ = drain(b, start)
    assert values(table) == [b"later"]


def test_ending_timestamp_ends_each_partition_before_its_first_message_published_at_or_after_it(
    broker: ApachePulsar, topic: str
) -> None:
    cut = old_cut_new(broker.url, topic)
    config, b = open_backend(broker.url, topic, endingTimestamp=str(cut))
    assert batch_read(config, b) == [b"old%d" % i for i in range(4)]
    # both bounds: an empty window between them reads nothing
    config, b = open_backend(broker.url, topic, startingTimestamp=str(cut - 1), endingTimestamp=str(cut))
    assert batch_read(config, b) == []


def test_on_a_broker_that_does_not_serve_partitions_the_parent_topic_is_read_for_the_time(lite_topic: str) -> None:
    """pulsar-lite's partitioned topics: a Reader cannot seek on a partition there (it is not served as a topic)."""
    with EmbeddedBroker(partitions=2) as lite:
        cut = old_cut_new(lite.url, lite_topic)
        config, b = open_backend(lite.url, lite_topic, startingTimestamp=str(cut), receiverQueueSize="20000")
        start = Planner(b).initial(config.source.starting_offsets, config.source.starting_time)
        assert not b.partition_mode
        table, _ = drain(b, start)
        assert values(table) == [b"new%d" % i for i in range(4)]


def test_starting_time_is_a_deprecated_name_of_starting_timestamp(
    broker: ApachePulsar, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    cut = old_cut_new(broker.url, topic)
    with caplog.at_level(logging.WARNING, logger="cdc.options"):
        config, b = open_backend(broker.url, topic, startingTime=str(cut))
    assert "option 'startingTime' of backend 'pulsar' is deprecated; use 'startingTimestamp'" in caplog.text
    assert config.source.starting_timestamp == str(cut)
    assert batch_read(config, b) == [b"new%d" % i for i in range(4)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingTime": "0", "startingTimestamp": "0"}, "options 'startingTime' and 'startingTimestamp' cannot"),
        ({"STARTINGTIME": "0", "startingtimestamp": "0"}, "options 'STARTINGTIME' and 'startingTimestamp' cannot"),
        ({"startingTimestamp": "0", "startingOffsets": "earliest"}, "'startingTimestamp' and 'startingOffsets'"),
        ({"startingTime": "0", "startingOffsets": "earliest"}, "'startingTime' and 'startingOffsets'"),
        ({"endingTimestamp": "0", "endingOffsets": "latest"}, "'endingTimestamp' and 'endingOffsets'"),
        ({"startingTime": "2026-01-01T00:00:00"}, "option 'startingTimestamp'.*no zone"),
    ],
)
def test_time_options_given_twice_or_with_offsets_are_refused_naming_both(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        _Config({"backend": "pulsar", "service.url": "pulsar://127.0.0.1:1", "topic": "t", **options})
