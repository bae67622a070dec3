"""``cdc verify``: prove that a Delta table equals its source table, chunk by chunk, while writes continue.

:mod:`.canonical` is the row encoding and hash both sides compute; :mod:`.compare` the reconciliation and the
interface a backend implements (:class:`~.compare.VerifySource`); :mod:`.cli` the command. PostgreSQL's side is
:mod:`cdc.backends.postgres.verify`, MariaDB's :mod:`cdc.backends.mysql.verify`.
"""

from __future__ import annotations
