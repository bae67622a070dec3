"""``python -m cdc.backends.pulsar``: run an embedded broker, or remove a query's subscription.

    python -m cdc.backends.pulsar broker --port 6650 --partitions 2
    python -m cdc.backends.pulsar drop-subscription --service-url pulsar://localhost:6650 \\
        --topics orders,payments --subscription cdc-orders-to-delta
"""

from __future__ import annotations

import click

from cdc.backends.pulsar.backend import drop_subscription
from cdc.backends.pulsar.broker import main as broker_main
from cdc.backends.pulsar.options import PulsarOptions
from cdc.options import parse


@click.group(help="Pulsar tools of cdc-tunnel.")
def cli() -> None:
    pass


cli.add_command(broker_main, name="broker")


@cli.command("drop-subscription", help="Remove the durable subscription a cdc query advanced on commit.")
@click.option("--service-url", required=True)
@click.option("--topics", help="Comma-separated topics (as the query's 'topic'/'topics').")
@click.option("--topics-pattern", help="As the query's 'topicsPattern' (needs --admin-url).")
@click.option("--admin-url")
@click.option(
    "--subscription",
    help="The query's 'subscription.name'; when omitted, the default derived from the URL and topics.",
)
@click.option("--auth-token", envvar="PULSAR_AUTH_TOKEN", help="Or set PULSAR_AUTH_TOKEN.")
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
    for topic in drop_subscription(options):
        click.echo(f"removed subscription {options.subscription()} from {topic}")


if __name__ == "__main__":
    cli()
