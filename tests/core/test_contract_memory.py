"""The in-memory backend of :mod:`cdc.testing` keeps the contract like every real backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc.testing import BackendContract, Harness, MemoryHarness


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = MemoryHarness(channels=2)
    yield h
    h.close()


class TestMemoryContract(BackendContract):
    pass
