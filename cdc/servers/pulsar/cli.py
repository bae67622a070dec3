"""``cdc server pulsar``: a Pulsar broker on loopback until interrupted, for development.

By default it is Apache Pulsar standalone, what users run in production (:class:`ApachePulsar`, from the jars
``make pulsar-standalone`` resolves); ``--lite`` runs pulsar-lite instead, a small Pulsar-protocol broker
that is not Apache Pulsar (:class:`EmbeddedBroker`). ::

    cdc server pulsar                                   # pulsar://127.0.0.1:6650, admin http://127.0.0.1:8080
    cdc server pulsar --port 0 --admin-port 0 --partitions 2
    cdc server pulsar --lite
"""

from __future__ import annotations

import click

from cdc.servers.process import refuse_taken, serve
from cdc.servers.pulsar.broker import BrokerError, EmbeddedBroker
from cdc.servers.pulsar.standalone import ApachePulsar, pulsar_lib, pulsar_version

LITE_IS = (
    "pulsar-lite is NOT Apache Pulsar: a Pulsar-protocol broker for quick development, without the admin API, "
    "the schema registry or partitions served as topics, and it redelivers and can stall readers"
)
DEFAULT_ADMIN_PORT = 8080
DEFAULT_HEAP = "256m"


@click.command(
    "pulsar",
    short_help="Apache Pulsar standalone (or --lite: pulsar-lite) on loopback.",
    help="Run Apache Pulsar standalone (what production runs: broker, bookie and metadata store in one JVM) on "
    "127.0.0.1 until interrupted, and print its service and admin URLs. It needs the pinned jars: "
    "`make pulsar-standalone` resolves them once from Maven Central. --lite runs pulsar-lite instead, which is "
    "NOT Apache Pulsar (no admin API, schema registry or partitions served as topics).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=6650, show_default=True,
              help="Binary protocol port (0 = a free port).")
@click.option("--admin-port", type=click.IntRange(0, 65535), default=None,
              help=f"Admin HTTP port of Apache Pulsar (0 = a free port).  [default: {DEFAULT_ADMIN_PORT}]")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Data directory (kept); a temporary one (removed on exit) when omitted.")
@click.option("--partitions", type=click.IntRange(min=0), default=0, show_default=True,
              help="Partitions of auto-created topics (0 = not partitioned).")
@click.option("--max-message-size", type=click.IntRange(min=1), default=5 * 1024 * 1024, show_default=True,
              help="The broker's message size limit in bytes.")
@click.option("--heap", default=None, help=f"Apache Pulsar's JVM heap.  [default: {DEFAULT_HEAP}]")
@click.option("--lite", is_flag=True, help=f"Run pulsar-lite instead of Apache Pulsar ({LITE_IS}).")
def main(port: int, admin_port: int | None, data_dir: str | None, partitions: int, max_message_size: int,
         heap: str | None, lite: bool) -> None:
    refuse_taken(port, "--port")
    if lite:
        for given, option in ((admin_port, "--admin-port"), (heap, "--heap")):
            if given is not None:
                raise click.UsageError(f"{option} is an option of Apache Pulsar; pulsar-lite (--lite) has none")
        lite_broker = EmbeddedBroker(data_dir, port=port or None, partitions=partitions,
                                     max_message_size=max_message_size)
        serve(lite_broker, "pulsar-lite", lambda: (
            f"pulsar-lite running at {lite_broker.url} (data: {lite_broker.data_dir}); Ctrl-C to stop\n"
            f"  {LITE_IS}; `cdc server pulsar` without --lite runs Apache Pulsar"
        ))
        return
    admin = DEFAULT_ADMIN_PORT if admin_port is None else admin_port
    refuse_taken(admin, "--admin-port")
    try:
        pulsar_lib()
    except BrokerError as exc:
        raise click.ClickException(
            f"{exc}. Or run pulsar-lite with `cdc server pulsar --lite` ({LITE_IS})"
        ) from None
    conf = {"maxMessageSize": str(max_message_size)}
    if partitions:
        conf |= {"allowAutoTopicCreationType": "partitioned", "defaultNumPartitions": str(partitions)}
    broker = ApachePulsar(data_dir, broker_port=port or None, web_port=admin or None,
                          heap=heap or DEFAULT_HEAP, conf=conf)
    kept = "kept" if data_dir is not None else "removed on exit"
    serve(broker, "Apache Pulsar", lambda: (
        f"Apache Pulsar {pulsar_version()} standalone ready in {broker.last_start_s:.1f} s (pid {broker.pid})\n"
        f"  service URL  {broker.url}\n"
        f"  admin URL    {broker.admin_url}\n"
        f"  data         {broker.data_dir} ({kept})\n"
        "Ctrl-C to stop"
    ))


if __name__ == "__main__":
    main()
