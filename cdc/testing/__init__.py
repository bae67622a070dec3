"""Test kit for backends: the shared contract suite, a scripted in-memory backend, and a script player.

Every backend of this project passes :class:`BackendContract`; a third-party backend can run the same suite
by writing a :class:`Harness` (how to write into its change log) and a pytest fixture named ``harness``::

    import pytest
    from cdc.testing import BackendContract, Harness

    class MyHarness(Harness):
        ...

    @pytest.fixture
    def harness(tmp_path):
        h = MyHarness(tmp_path)
        yield h
        h.close()

    class TestMyBackend(BackendContract):
        pass

Histories are scripted as lists of steps, in the spirit of bytewax's ``testing`` module: :class:`Append`,
:class:`Split`, :class:`Merge`, :class:`Batch` (one micro-batch through the planner) and :class:`Crash` (the
driver dies after logging the next batch's end offset and before committing it; the restarted query replays
that batch). :func:`play` runs a script against any harness and checks exactly-once delivery, replays and
lineage; :class:`MemoryHarness` is the in-memory backend the core's own tests script without servers::

    result = play(MemoryHarness(channels=2), [Append(10), Batch(4), Crash(), Split(), Append(5), Merge()])
    assert result.delivered == 15

Modules: :mod:`.harness` (the harness and reading helpers), :mod:`.scripts` (steps and :func:`play`),
:mod:`.memory` (the in-memory backend), :mod:`.contract` (the suite; needs pytest).
"""

from cdc.testing.harness import Harness, batches, drain, read_batch, read_range
from cdc.testing.memory import MemoryBackend, MemoryHarness, MemoryLog
from cdc.testing.scripts import Append, Batch, Crash, Merge, PlayResult, ScriptError, Split, Step, play

__all__ = [
    "Append",
    "BackendContract",
    "ChunkedSnapshotContract",
    "Batch",
    "Crash",
    "Harness",
    "Merge",
    "MemoryBackend",
    "MemoryHarness",
    "MemoryLog",
    "PlayResult",
    "ScriptError",
    "Split",
    "Step",
    "batches",
    "drain",
    "play",
    "read_batch",
    "read_range",
]


def __getattr__(name: str) -> object:
    if name in ("BackendContract", "ChunkedSnapshotContract"):  # import pytest: only when a suite asks
        from cdc.testing import contract

        return getattr(contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
