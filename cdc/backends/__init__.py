"""Backends: one sub-package per change-log system, each shaped by the same **roles**, one file per role.

A role has one file name in every backend that plays it (``tests/core/test_layout.py`` checks both ways: a
role file present plays its role, and a backend that plays a role keeps it in that file). Required in every
backend (:data:`REQUIRED_FILES`):

``__init__.py``
    Thin and lazy: names the package's public classes, imports them on first use (:func:`cdc.lazy.lazy_exports`).
``options.py``
    The pydantic options model (a :class:`cdc.options.BackendOptions`), every field documented in place.
``backend.py``
    The driver side: the :class:`cdc.backend.Backend` (channels, lineage, planning, acknowledgement).
``reader.py``
    The executor side: the picklable :class:`cdc.backend.RangeReader` that reads planned ranges.

Where the backend plays them (:data:`ROLE_FILES`):

``connection.py``
    Connecting to the system: clients, sessions, replication slots.
``positions.py``
    Its position type: how a JSON-safe position addresses a gap between records, and how positions compare.
``records.py``
    Decoding the system's messages into change-model Arrow records (:mod:`cdc.model`).
``snapshot.py``
    The full-plus-incremental hand-off: :meth:`cdc.backend.Backend.snapshot`.
``writer.py``
    Writes through ``df.write.format("cdc")``: :meth:`cdc.backend.Backend.writer`.
``cli.py``
    ``cdc <name> ...``, the backend's command-line tools.
``errors.py``
    Its errors, every one under :class:`cdc.errors.CdcError`.

Anything else is named for what it is (``log.py``, the local log's files; ``pgoutput.py``, PostgreSQL's
message format; ``index.py``, Pulsar's message-id index; ``plainbuffer.py``, Tablestore's row codec...).
Formats that more than one backend reads (Debezium envelopes) live in :mod:`cdc.formats`, and the stand-in
servers that backends are developed against in :mod:`cdc.servers`.
"""

REQUIRED_FILES = ("__init__.py", "options.py", "backend.py", "reader.py")

ROLE_FILES = ("connection.py", "positions.py", "records.py", "snapshot.py", "writer.py", "cli.py", "errors.py")
"""The optional roles, each in the file of that name wherever a backend plays it."""
