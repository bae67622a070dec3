"""Backends: one sub-package per change-log system, each with the same files.

``options.py`` (the pydantic options model), ``backend.py`` (the :class:`~cdc.backend.Backend` and its
:class:`~cdc.backend.RangeReader`), plus what the system needs (``log.py`` for the local log, a client for
remote systems).
"""
