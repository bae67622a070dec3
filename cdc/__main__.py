"""``python -m cdc``: the ``cdc`` command."""

from cdc.cli import main

if __name__ == "__main__":
    main()
