"""The ``cdc`` command: inspect options and local logs; backends add their own sub-commands."""

from __future__ import annotations

import json
import logging

import click
from pydantic import BaseModel

from cdc.backend import available_backends, backend_class
from cdc.options import SourceOptions


class _LazyGroup(click.Group):
    """Sub-commands of backends are imported only when used (pulsar-client's C++ core loads slowly)."""

    lazy = {
        "pulsar": ("cdc.backends.pulsar.__main__", "cli", "Pulsar: run an embedded broker, drop a query's subscription."),
        "tablestore": ("cdc.local.tablestore.__main__", "main", "Run the local Tablestore server; split/merge partitions."),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, attr, _ = self.lazy[name]
            cmd: click.Command = getattr(importlib.import_module(module), attr)
            return cmd
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """cdc-tunnel: change-data-capture ingestion for Apache Spark."""
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)])


@main.command("options")
@click.argument("backend", type=click.Choice(available_backends()), required=False)
def options_cmd(backend: str | None) -> None:
    """Print the options of the source and of BACKEND as a Markdown table."""
    models: list[tuple[str, type[BaseModel]]] = [("source", SourceOptions)]
    if backend:
        models.append((f"backend={backend}", backend_class(backend).options_model))
    click.echo("| option | default | meaning |\n| --- | --- | --- |")
    for _, model in models:
        for name, info in model.model_fields.items():
            default = "required" if info.is_required() else f"`{info.default}`"
            click.echo(f"| `{info.alias or name}` | {default} | {info.description or ''} |")


@main.command("offsets")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.option("--batch", "batch_id", type=int, default=None, help="A batch id (default: the last committed batch).")
@click.option("--source", "source_index", type=int, default=0, show_default=True, help="Which source of the query.")
@click.option("--starting-offsets", "as_start", is_flag=True, help="Print only the startingOffsets JSON for a new query.")
def offsets_cmd(checkpoint: str, batch_id: int | None, source_index: int, as_start: bool) -> None:
    """Show where the streaming query of CHECKPOINT is: each channel's position after a batch.

    With --starting-offsets, print the `startingOffsets` value that starts a new query (a new checkpoint)
    right after that batch.
    """
    from cdc.checkpoint import CheckpointError, last_committed, read_batch, starting_offsets

    try:
        batch = last_committed(checkpoint) if batch_id is None else read_batch(checkpoint, batch_id)
        offset = batch.source(source_index)
        if as_start:
            click.echo(json.dumps(starting_offsets(offset), sort_keys=True))
            return
    except CheckpointError as e:
        raise click.ClickException(str(e)) from e
    latest = read_batch(checkpoint)
    click.echo(f"batch {batch.batch_id} ({'committed' if batch.committed else 'not committed'}); "
               f"last batch in the offset log: {latest.batch_id} "
               f"({'committed' if latest.committed else 'planned, replayed on restart'})")
    for cid, entry in sorted(offset["channels"].items()):
        flags = [name for name in ("done", "snapshot") if entry.get(name)]
        click.echo(json.dumps({"channel": cid, "pos": entry["pos"], **({"flags": flags} if flags else {})}))


@main.group("log")
def log_group() -> None:
    """Local change logs."""


@log_group.command("show")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def log_show(path: str) -> None:
    """Show a local log's schema and channels."""
    from cdc.backends.local import LocalLog

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


@log_group.command("split")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.argument("channel")
@click.option("--parts", default=2, show_default=True)
def log_split(path: str, channel: str, parts: int) -> None:
    """Split CHANNEL of the log at PATH into children."""
    from cdc.backends.local import LocalLog

    click.echo(" ".join(LocalLog(path).split(channel, parts)))


@log_group.command("merge")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.argument("channels", nargs=-1, required=True)
def log_merge(path: str, channels: tuple[str, ...]) -> None:
    """Merge adjacent CHANNELS of the log at PATH into one child."""
    from cdc.backends.local import LocalLog

    click.echo(LocalLog(path).merge(list(channels)))


if __name__ == "__main__":
    main()
