"""``python -m cdc.backends.pulsar``: the same as ``cdc pulsar``."""

from cdc.backends.pulsar.cli import cli

if __name__ == "__main__":
    cli()
