"""``python -m cdc.servers.tablestore``: the same as ``cdc server tablestore``."""

from cdc.servers.tablestore.cli import main

if __name__ == "__main__":
    main()
