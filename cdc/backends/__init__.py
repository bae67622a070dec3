"""Backends: one sub-package per change-log system, every one with the same file set.

Required in every backend (``REQUIRED_FILES``; ``tests/core/test_layout.py`` checks it):

``__init__.py``
    Thin and lazy: names the package's public classes, imports them on first use.
``options.py``
    The pydantic options model (a :class:`cdc.options.BackendOptions`), every field documented in place.
``backend.py``
    The driver side: the :class:`cdc.backend.Backend` (channels, lineage, planning, acknowledgement).
``reader.py``
    The executor side: the picklable :class:`cdc.backend.RangeReader` that reads planned ranges.

Where the backend has them: ``positions.py`` (its own position type), ``errors.py`` (its errors, all under
:class:`cdc.errors.CdcError`), ``writer.py`` (writes through ``format("cdc")``), ``cli.py`` (``cdc <name> ...``
tools). Plus what is particular to the system: ``log.py`` (the local log's files), ``client.py`` (a client of
a remote service), ``codec.py``, ``index.py``, ``plainbuffer.py``...

The stand-in servers that backends are developed against live apart, in :mod:`cdc.servers`.
"""

REQUIRED_FILES = ("__init__.py", "options.py", "backend.py", "reader.py")
