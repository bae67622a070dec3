"""Put on ``PYTHONPATH`` by the chunked-snapshot crash test: every Python process it starts imports this first,
Spark's Python workers included. While the file named by ``CDC_TEST_KILL_TASK`` exists, the first worker that
reads a chunk of a chunked snapshot removes it and dies in the middle of the read (after PostgreSQL sent the
chunk's rows, before anything is kept or handed to Spark): a task killed inside its chunk, which Spark retries."""

import os

_FLAG = os.environ.get("CDC_TEST_KILL_TASK")

if _FLAG:
    import importlib.abc
    import importlib.machinery
    import sys

    def _patch(module):  # type: ignore[no-untyped-def]
        read_arrow = module.read_arrow

        def dying_read(*args, **kwargs):  # type: ignore[no-untyped-def]
            rows = read_arrow(*args, **kwargs)
            try:
                os.remove(_FLAG)
            except FileNotFoundError:
                return rows
            os._exit(1)

        module.read_arrow = dying_read

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != "cdc.backends.postgres.snapshot":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Hook())
