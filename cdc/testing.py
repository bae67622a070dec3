"""Helpers that script change logs for tests: the harness every backend implements for the shared
contract suite (``tests/contract/``), so one suite proves every backend keeps the contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from cdc.backend import Backend


class Harness(ABC):
    """Writes into one backend's change log on behalf of the contract suite.

    ``append`` writes ``n`` new records; the suite only counts and compares what it reads back, so the
    harness chooses keys and values. Backends whose channels cannot split or merge set the flags false
    (the lineage tests then skip, saying so).
    """

    supports_split: bool = True
    supports_merge: bool = True
    exact_counts_without_budget: bool = True
    """False for a backend that reports a lower bound as ``records`` when planning has no record budget."""

    @abstractmethod
    def backend(self) -> Backend:
        """A fresh driver-side backend over the harness's log."""

    @abstractmethod
    def append(self, n: int, channel: str | None = None) -> None:
        """Append ``n`` records, to ``channel`` or spread by key. Returns once they are readable."""

    def split(self, channel: str) -> Sequence[str]:
        raise NotImplementedError("this backend's channels do not split")

    def merge(self, channels: Sequence[str]) -> str:
        raise NotImplementedError("this backend's channels do not merge")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop whatever the harness started."""
