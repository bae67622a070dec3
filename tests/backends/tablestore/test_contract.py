"""The shared backend contract against the Tablestore backend: a real local Tablestore server (child
process), rows written by the real ``tablestore.OTSClient``, splits and merges through the server's admin
call, records read through a Stream tunnel."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from cdc.backend import Backend
from cdc.servers.tablestore import TablestoreProcess
from cdc.testing import BackendContract, Harness
from tests.backends.tablestore.world import World


class TablestoreHarness(Harness):
    def __init__(self, server: TablestoreProcess) -> None:
        self.world = World(server, tunnel_type="Stream")
        self.world.create_tunnel()
        self.next_id = 0
        self.backends: list[Backend] = []

    def backend(self) -> Backend:
        b = self.world.backend()
        self.backends.append(b)
        return b

    def append(self, n: int, channel: str | None = None) -> None:
        # Keys spread over the whole int range so every shard of a split gets some.
        rows = [((self.next_id + i) * 7919 % 1000, f"v{self.next_id + i}") for i in range(n)]
        self.next_id += n
        self.world.put_many(rows)

    def split(self, channel: str) -> Sequence[str]:
        return self.world.split(channel)

    def merge(self, channels: Sequence[str]) -> str:
        return self.world.merge(channels)

    def close(self) -> None:
        for b in self.backends:
            b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TablestoreProcess]:
    # One server for the module (each harness gets its own table and tunnel); small reads so that
    # ranges span several ReadRecords responses.
    proc = TablestoreProcess(
        tmp_path_factory.mktemp("ots") / "data",
        instance="contract",
        access_key_id="contract-id",
        access_key_secret="contract-secret",
        max_records_per_read=6,
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def harness(server: TablestoreProcess) -> Iterator[Harness]:
    h = TablestoreHarness(server)
    yield h
    h.close()


class TestTablestoreContract(BackendContract):
    pass
