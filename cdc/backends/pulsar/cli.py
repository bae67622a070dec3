"""``cdc pulsar``: tools of the Pulsar backend.

    cdc pulsar drop-subscription --service-url pulsar://localhost:6650 \\
        --topics orders,payments --subscription cdc-orders-to-delta

The development broker is ``cdc server pulsar`` (``cdc pulsar broker`` is its hidden alias for
one release).
"""

from __future__ import annotations

import click

from cdc.backends.pulsar.options import PulsarOptions
from cdc.cli_secrets import secret_option
from cdc.errors import requires_extra
from cdc.options import parse
from cdc.servers.pulsar.cli import main as broker_main


@click.group(help="Pulsar tools of cdc-tunnel.")
def cli() -> None:
    pass


_broker_alias = click.Command(
    "broker", params=broker_main.params, callback=broker_main.callback, hidden=True,
    help="Deprecated alias of `cdc server pulsar`.", deprecated=True,
)
cli.add_command(_broker_alias)


@cli.command("drop-subscription", help="Remove the durable subscription a cdc query advanced on commit.")
@click.option("--service-url", required=True, help="Broker URL, as the query's 'service.url'.")
@click.option("--topics", help="Comma-separated topics (as the query's 'topic'/'topics').")
@click.option("--topics-pattern", help="As the query's 'topicsPattern' (needs --admin-url).")
@click.option("--admin-url", help="Admin REST URL, as the query's 'admin.url'.")
@click.option(
    "--subscription",
    help="The query's 'subscription.name'; when omitted, the default derived from the URL and topics.",
)
@secret_option("auth_token", "PULSAR_AUTH_TOKEN", "JWT of the query's role")
def drop(
    service_url: str,
    topics: str | None,
    topics_pattern: str | None,
    admin_url: str | None,
    subscription: str | None,
    auth_token: str | None,
) -> None:
    raw = {"service.url": service_url, "topics": topics, "topicsPattern": topics_pattern, "admin.url": admin_url,
           "subscription.name": subscription, "auth.token": auth_token}
    options = parse(PulsarOptions, {k: v for k, v in raw.items() if v is not None}, what="drop-subscription")
    with requires_extra("pulsar", "cdc pulsar drop-subscription"):
        from cdc.backends.pulsar.backend import drop_subscription
    for topic in drop_subscription(options):
        click.echo(f"removed subscription {options.subscription()} from {topic}")
