"""Pulsar fixtures: real brokers on 127.0.0.1 (free ports, temporary data): pulsar-lite, and one Apache Pulsar
standalone per test session (its JVM takes tens of seconds to start; ``make pulsar-standalone`` fetches it)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from cdc.servers.pulsar.broker import EmbeddedBroker

_names = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A broker whose auto-created topics have 2 partitions."""
    with EmbeddedBroker(partitions=2) as b:
        yield b


@pytest.fixture(scope="session")
def plain_broker() -> Iterator[EmbeddedBroker]:
    """A broker whose auto-created topics are not partitioned."""
    with EmbeddedBroker(partitions=0) as b:
        yield b


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A fresh topic name per test (topics are auto-created on first use)."""
    return f"persistent://public/default/t{next(_names)}-{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture(autouse=True)
def _close_backends() -> Iterator[None]:
    from tests.backends.pulsar.helpers import close_all

    yield
    close_all()
