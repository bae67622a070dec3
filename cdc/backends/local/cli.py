"""``cdc local``: tools of the local change log (show, split, merge)."""

from __future__ import annotations

import json

import click


@click.group("local")
def cli() -> None:
    """The local on-disk change log."""


@cli.command("show")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def show(path: str) -> None:
    """Show a local log's schema and channels."""
    from cdc.backends.local.log import LocalLog

    log = LocalLog(path)
    click.echo(f"keys: {', '.join(log.change_schema.keys)}")
    click.echo(f"schema: {log.change_schema.table}")
    for c in log.channels():
        click.echo(
            json.dumps(
                {
                    "channel": c.id,
                    "parents": list(c.parents),
                    "finished": c.closed_at is not None,
                    "earliest": c.earliest,
                    "head": c.head,
                    "segments": len(c.segments),
                }
            )
        )


@cli.command("split")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.argument("channel")
@click.option("--parts", default=2, show_default=True, help="Children to split the channel into.")
def split(path: str, channel: str, parts: int) -> None:
    """Split CHANNEL of the log at PATH into children."""
    from cdc.backends.local.log import LocalLog

    click.echo(" ".join(LocalLog(path).split(channel, parts)))


@cli.command("merge")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.argument("channels", nargs=-1, required=True)
def merge(path: str, channels: tuple[str, ...]) -> None:
    """Merge adjacent CHANNELS of the log at PATH into one child."""
    from cdc.backends.local.log import LocalLog

    click.echo(LocalLog(path).merge(list(channels)))
