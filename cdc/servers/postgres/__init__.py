"""A real PostgreSQL server for tests, demos and development: :class:`PostgresServer` (see :mod:`.process`)."""

from cdc.servers.postgres.process import PostgresServer, PostgresServerError, postgres_bindir

__all__ = ["PostgresServer", "PostgresServerError", "postgres_bindir"]
