"""Pulsar fixtures. The tests run on Apache Pulsar standalone, one broker per test session (the
``apache_pulsar`` fixture of tests/conftest.py: its JVM takes seconds to tens of seconds to start), with a
fresh topic per test. pulsar-lite stays only where its own faults are the subject (a reader the broker
stops serving; topics whose partitions are not served as topics)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from cdc.servers.pulsar import ApachePulsar

_names = itertools.count()


@pytest.fixture
def broker(apache_pulsar: ApachePulsar) -> ApachePulsar:
    """The session's Apache Pulsar broker (``topic`` makes each test's topic with 2 partitions)."""
    return apache_pulsar


@pytest.fixture
def plain_broker(apache_pulsar: ApachePulsar) -> ApachePulsar:
    """The same broker: its auto-created topics are not partitioned (see ``plain_topic``)."""
    return apache_pulsar


@pytest.fixture
def topic(request: pytest.FixtureRequest, apache_pulsar: ApachePulsar) -> str:
    """A fresh topic with 2 partitions per test (made through the admin API: auto-created topics are not
    partitioned)."""
    name = f"persistent://public/default/t{next(_names)}-{abs(hash(request.node.nodeid)) % 10**8}"
    apache_pulsar.create_partitioned_topic(name, 2)
    return name


@pytest.fixture
def plain_topic(request: pytest.FixtureRequest) -> str:
    """A fresh non-partitioned topic name (auto-created on first use)."""
    return f"persistent://public/default/p{next(_names)}-{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture
def lite_topic(request: pytest.FixtureRequest) -> str:
    """A fresh topic name for a test's own pulsar-lite broker."""
    return f"persistent://public/default/l{next(_names)}-{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture(autouse=True)
def _close_backends() -> Iterator[None]:
    from tests.backends.pulsar.helpers import close_all

    yield
    close_all()
