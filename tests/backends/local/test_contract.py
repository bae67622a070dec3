from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from cdc.backend import Backend
from cdc.backends.local import LocalBackend, LocalLog, LocalOptions
from cdc.testing import BackendContract, Harness


class LocalHarness(Harness):
    def __init__(self, path: Path) -> None:
        self.log = LocalLog.create(path, [("id", pa.int64()), ("v", pa.string())], ["id"], channels=2)
        self.next_id = 0

    def backend(self) -> Backend:
        return LocalBackend(LocalOptions.model_validate({"path": str(self.log.path)}))

    def append(self, n: int, channel: str | None = None) -> None:
        rows = [{"id": self.next_id + i, "v": f"v{self.next_id + i}"} for i in range(n)]
        self.next_id += n
        self.log.append(rows, channel=channel)

    def split(self, channel: str) -> Sequence[str]:
        return self.log.split(channel)

    def merge(self, channels: Sequence[str]) -> str:
        return self.log.merge(channels)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = LocalHarness(tmp_path / "log")
    yield h
    h.close()


class TestLocalContract(BackendContract):
    pass
