"""A real MariaDB server for tests, demos and development: :class:`MariaDBServer` (see :mod:`.process`)."""

from cdc.servers.mysql.process import MariaDBServer, MariaDBServerError, mariadb_binaries

__all__ = ["MariaDBServer", "MariaDBServerError", "mariadb_binaries"]
