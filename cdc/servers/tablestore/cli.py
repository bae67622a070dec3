"""``cdc server tablestore``: run the local Tablestore server, or split/merge its partitions."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from cdc.cli_secrets import secret_option

from .admin import AdminClient
from .limits import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS

_SECRET_ENV = "CDC_TABLESTORE_ACCESS_KEY_SECRET"


@click.group("tablestore", invoke_without_command=True)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (keep it loopback)."
)
@click.option(
    "--port", default=8500, show_default=True, type=int, help="Port to listen on (0: any free port)."
)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help="Where the data lives.")
@click.option("--instance", default="local", show_default=True, help="Instance name clients must use.")
@click.option("--access-key-id", default="local-access-key-id", show_default=True,
              help="Access key id clients must sign with.")
@secret_option("access_key_secret", _SECRET_ENV,
               "Access key secret clients must sign with (default: the well-known local one)",
               default="local-access-key-secret")
@click.option(
    "--max-records-per-read",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 100000),
    help="Most records one ReadRecords call returns.",
)
@click.option(
    "--idle-timeout",
    default=DEFAULT_IDLE_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a connection may send nothing (between requests or mid-request) before it is closed.",
)
@click.option(
    "--max-connections",
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Connections served at once; more are answered 503 OTSServerBusy.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    help="The server's logging level.",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.pass_context
def main(
    ctx: click.Context,
    host: str,
    port: int,
    data_dir: Path | None,
    instance: str,
    access_key_id: str,
    access_key_secret: str,
    max_records_per_read: int,
    idle_timeout: float,
    max_connections: int,
    log_level: str,
) -> None:
    """Serve the Tablestore table API and Tunnel service on HOST:PORT, data kept in DATA_DIR."""
    ctx.ensure_object(dict)
    ctx.obj["secret"] = access_key_secret
    if ctx.invoked_subcommand is not None:
        return
    if data_dir is None:
        raise click.UsageError("--data-dir is required to serve")
    # force: the top-level ``cdc`` group has configured logging already, and basicConfig without it
    # would leave that configuration (and its level) in place.
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    from cdc.servers.tablestore import LocalTablestore

    server = LocalTablestore(
        data_dir,
        host=host,
        port=port,
        instance=instance,
        access_key_id=access_key_id,
        access_key_secret=access_key_secret,
        max_records_per_read=max_records_per_read,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
    )
    server.serve_forever()


class _CliAdmin(AdminClient):
    def call(self, path: str, **args: object) -> object:
        try:
            return super().call(path, **args)
        except (RuntimeError, OSError) as exc:
            raise click.ClickException(str(exc)) from None


def _admin(ctx: click.Context, endpoint: str) -> AdminClient:
    return _CliAdmin(endpoint, ctx.obj["secret"])


@main.command()
@click.option("--endpoint", required=True, help="The server, e.g. http://127.0.0.1:8500")
@click.option("--table", required=True, help="The table whose partition to change (or list).")
@click.option("--shard-id", default=None, help="Open shard to split (default: the one with most rows).")
@click.option("--split-key", default=None, help='JSON list of leading primary-key values, e.g. "[500]".')
@click.pass_context
def split(ctx: click.Context, endpoint: str, table: str, shard_id: str | None, split_key: str | None) -> None:
    """Split a partition of TABLE into two child partitions."""
    key = json.loads(split_key) if split_key else None
    click.echo(json.dumps(_admin(ctx, endpoint).split(table, shard_id, key)))


@main.command()
@click.option("--endpoint", required=True, help="The server, e.g. http://127.0.0.1:8500")
@click.option("--table", required=True, help="The table whose partition to change (or list).")
@click.option(
    "--shard-id", "shard_ids", multiple=True, help="Two adjacent open shards (default: the first two)."
)
@click.pass_context
def merge(ctx: click.Context, endpoint: str, table: str, shard_ids: tuple[str, ...]) -> None:
    """Merge two adjacent partitions of TABLE into one child partition."""
    click.echo(json.dumps(_admin(ctx, endpoint).merge(table, list(shard_ids) or None)))


@main.command()
@click.option("--endpoint", required=True, help="The server, e.g. http://127.0.0.1:8500")
@click.option("--table", required=True, help="The table whose partition to change (or list).")
@click.pass_context
def shards(ctx: click.Context, endpoint: str, table: str) -> None:
    """List TABLE's partitions (open and sealed) with their lineage."""
    click.echo(json.dumps(_admin(ctx, endpoint).shards(table), indent=2))
