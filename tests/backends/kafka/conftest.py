"""Kafka fixtures. The tests run on Apache Kafka in KRaft mode, one broker per test session (the
``apache_kafka`` fixture of tests/conftest.py), with fresh topics per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from cdc.servers.kafka import ApacheKafka

_names = itertools.count()


@pytest.fixture
def kafka(apache_kafka: ApacheKafka) -> ApacheKafka:
    return apache_kafka


@pytest.fixture
def topic(request: pytest.FixtureRequest, apache_kafka: ApacheKafka) -> Iterator[str]:
    """A fresh topic with 2 partitions per test, deleted afterwards (the session's broker restarts in some tests:
    the fewer partitions it holds, the sooner it is back)."""
    name = f"t{next(_names)}-{abs(hash(request.node.nodeid)) % 10**8}"
    apache_kafka.create_topic(name, 2)
    yield name
    if apache_kafka.running:
        apache_kafka.delete_topic(name)


@pytest.fixture(autouse=True)
def _close_backends() -> Iterator[None]:
    from tests.backends.kafka.helpers import close_all

    yield
    close_all()
