"""The ``cdc`` command. This module only wires groups together; each group lives beside what it serves.

    cdc options [BACKEND]          the source's and a backend's options (Markdown table)
    cdc offsets CHECKPOINT         where a streaming query is, per channel
    cdc status CHECKPOINT          ... against the change log's heads: records and time behind (--watch)
    cdc verify TABLE DELTA_PATH    a source table against its Delta table, chunk by chunk (cdc.verify.cli)
    cdc local show|split|merge     the local change log            (cdc.backends.local.cli)
    cdc pulsar drop-subscription   Pulsar backend tools             (cdc.backends.pulsar.cli)
    cdc server tablestore|pulsar|kafka  stand-in servers for development (cdc.servers)
    cdc server spark-cluster|spark-connect  Spark's own servers on loopback (cdc.servers.spark)
"""

from __future__ import annotations

import json
import logging

import click

from cdc.backend import available_backends
from cdc.cli_secrets import options_from


class _LazyGroup(click.Group):
    """Sub-commands imported only when used (pulsar-client's C++ core loads slowly).

    ``lazy`` maps a command name to ``(module, attribute, short help, hidden)``; hidden ones are the old
    command names, kept as aliases for one release.
    """

    lazy: dict[str, tuple[str, str, str, bool]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        visible = [name for name, (*_, hidden) in self.lazy.items() if not hidden]
        return sorted([*super().list_commands(ctx), *visible])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help`` from the table above: no sub-command is imported to build it."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy:
                rows.append((name, self.lazy[name][2]))
            elif (cmd := super().get_command(ctx, name)) is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str()))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            from cdc.errors import MissingExtraError

            module, attr, _, hidden = self.lazy[name]
            try:
                cmd: click.Command = getattr(importlib.import_module(module), attr)
            except MissingExtraError as exc:  # a command module that needs an extra to load at all
                raise click.ClickException(str(exc)) from None
            if hidden:
                click.echo(f"warning: 'cdc {name}' is deprecated and will be removed in the next release; "
                           f"use {_ALIASES[name]}", err=True)
            return cmd
        return super().get_command(ctx, name)


_ALIASES = {"log": "'cdc local'", "tablestore": "'cdc server tablestore'"}


class _Main(_LazyGroup):
    lazy = {
        "server": ("cdc.cli", "server_group", "Stand-in servers for development: tablestore, pulsar, kafka, spark-cluster, spark-connect.", False),
        "local": ("cdc.backends.local.cli", "cli", "The local change log: show, split, merge.", False),
        "pulsar": ("cdc.backends.pulsar.cli", "cli", "Pulsar backend tools: drop a query's subscription.", False),
        "postgres": ("cdc.backends.postgres.cli", "cli",
                     "PostgreSQL backend tools: list and drop replication slots, re-snapshot a table.", False),
        "verify": ("cdc.verify.cli", "main", "Compare a source table with its Delta table, chunk by chunk.", False),
        "log": ("cdc.backends.local.cli", "cli", "Deprecated: 'cdc local'.", True),
        "tablestore": ("cdc.servers.tablestore.cli", "main", "Deprecated: 'cdc server tablestore'.", True),
    }


    def invoke(self, ctx: click.Context) -> object:
        from cdc.errors import MissingExtraError

        try:
            return super().invoke(ctx)
        except MissingExtraError as exc:  # a command whose system's client is not installed: say which extra
            raise click.ClickException(str(exc)) from None


class _Servers(_LazyGroup):
    lazy = {
        "tablestore": ("cdc.servers.tablestore.cli", "main", "The local Tablestore server; split/merge partitions.",
                       False),
        "pulsar": ("cdc.servers.pulsar.cli", "main",
                   "Apache Pulsar standalone on loopback (--lite: pulsar-lite, which is not Apache Pulsar).", False),
        "kafka": ("cdc.servers.kafka.cli", "main", "Apache Kafka (KRaft) on loopback; --connect: Kafka Connect with Debezium.",
                  False),
        "spark-cluster": ("cdc.servers.spark.cli", "cluster_main", "A Spark standalone master and workers on loopback.",
                          False),
        "spark-connect": ("cdc.servers.spark.cli", "connect_main", "A Spark Connect server on loopback.", False),
    }


@click.group(cls=_Servers, name="server")
def server_group() -> None:
    """Stand-in servers for development and tests, on loopback."""


@click.group(cls=_Main)
@click.version_option(package_name="cdc-tunnel", message="cdc-tunnel %(version)s")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """cdc-tunnel: change-data-capture ingestion for Apache Spark."""
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)])
    if not verbose:
        # The tablestore SDK warns at import that its optional C++ codec is missing; the Python codec it falls
        # back to works, and the tunnel records go through our own PlainBuffer code: nothing to act on.
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


_QUIET_LOGGERS = ("tablestore.encoder", "tablestore.decoder")


@main.command("options")
@click.argument("backend", type=click.Choice(available_backends()), required=False)
def options_cmd(backend: str | None) -> None:
    """Print the options of the source and of BACKEND as Markdown tables (the documentation's tables)."""
    from cdc.backend import option_tables
    from cdc.options import options_markdown

    for i, (title, rows) in enumerate(option_tables(backend)):
        click.echo(("\n" if i else "") + f"### {title}\n\n" + options_markdown(rows))


@main.command("offsets")
@click.argument("checkpoint")
@click.option("--batch", "batch_id", type=int, default=None, help="A batch id (default: the last committed batch).")
@click.option("--source", "source_index", type=int, default=0, show_default=True, help="Which source of the query.")
@click.option("--starting-offsets", "as_start", is_flag=True, help="Print only the startingOffsets JSON for a new query.")
def offsets_cmd(checkpoint: str, batch_id: int | None, source_index: int, as_start: bool) -> None:
    """Show where the streaming query of CHECKPOINT is: each channel's position after a batch.

    CHECKPOINT is a path or a URI pyarrow opens (s3://bucket/ck?endpoint_override=host:port&scheme=http), as
    for `cdc status`; the store's credentials come from the environment (AWS_ACCESS_KEY_ID...).

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
        latest = read_batch(checkpoint)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"batch {batch.batch_id} ({'committed' if batch.committed else 'not committed'}); "
               f"last batch in the offset log: {latest.batch_id} "
               f"({'committed' if latest.committed else 'planned, replayed on restart'})")
    for cid, entry in sorted(offset.channels.items()):
        flags = [name for name, on in (("done", entry.done), ("snapshot", entry.snapshot)) if on]
        click.echo(json.dumps({"channel": cid, "pos": entry.pos, **({"flags": flags} if flags else {})}))


@main.command("status")
@click.argument("checkpoint")
@click.option("-o", "--option", "pairs", multiple=True, metavar="KEY=VALUE",
              help="A source option, as given to the query (backend=..., path=..., tunnel.name=...). Repeatable.")
@click.option("--option-from-env", "from_env", multiple=True, metavar="KEY=VARIABLE",
              help="An option whose value is in an environment variable (secrets). Repeatable.")
@click.option("--option-from-file", "from_file", multiple=True, metavar="KEY=FILE",
              help="An option whose value is the content of a file (secrets). Repeatable.")
@click.option("--source", "source_index", type=int, default=0, show_default=True, help="Which source of the query.")
@click.option("--watch", is_flag=True, help="Refresh the table until interrupted (Ctrl-C).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
def status_cmd(checkpoint: str, pairs: tuple[str, ...], from_env: tuple[str, ...], from_file: tuple[str, ...],
               source_index: int, watch: bool, interval: float) -> None:
    """Show, per channel, where the query of CHECKPOINT is against the change log's head now: position,
    head, records behind, time behind, state (reading, finished, waiting-for-parents, new, snapshot).

    CHECKPOINT is a path or a URI pyarrow opens (s3://bucket/ck?endpoint_override=host:port&scheme=http);
    the store's credentials and the backend's secrets come from the environment (ALIBABA_CLOUD_ACCESS_KEY_ID,
    ALIBABA_CLOUD_ACCESS_KEY_SECRET, PULSAR_AUTH_TOKEN, PGPASSWORD, AWS_ACCESS_KEY_ID...), --option-from-env or
    --option-from-file, never from the command line.
    """
    import time

    from rich.console import Console
    from rich.live import Live

    from cdc.checkpoint import CheckpointError
    from cdc.errors import CdcError
    from cdc.status import open_source_backend, query_status, render

    console = Console()
    try:
        # Opening a backend and walking to its heads can take seconds (a Tablestore tunnel): a spinner on
        # stderr while it does, shown only on a terminal.
        with Console(stderr=True).status("reading the checkpoint and the change log's heads..."):
            backend = open_source_backend(options_from(pairs, from_env, from_file))
    except CdcError as e:
        raise click.ClickException(str(e)) from e
    try:
        with Console(stderr=True).status("reading the checkpoint and the change log's heads..."):
            first = query_status(checkpoint, backend, source_index)
        table = render(first)
        if not watch:
            console.print(table)
            return
        with Live(table, console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(query_status(checkpoint, backend, source_index)))
    except KeyboardInterrupt:
        pass
    except (CheckpointError, CdcError) as e:
        raise click.ClickException(str(e)) from e
    finally:
        backend.close()


if __name__ == "__main__":
    main()
