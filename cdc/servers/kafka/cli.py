"""``cdc server kafka``: Apache Kafka (one KRaft broker) on loopback until interrupted, for development; with
``--connect``, Kafka Connect standalone beside it with Debezium's PostgreSQL connector. ::

    cdc server kafka                          # bootstrap 127.0.0.1:9092
    cdc server kafka --port 0 --partitions 2
    cdc server kafka --connect                # and Kafka Connect's REST API on http://127.0.0.1:8083
"""

from __future__ import annotations

import click

from cdc.servers.kafka.connect import KafkaConnect
from cdc.servers.kafka.standalone import (
    ApacheKafka,
    KafkaServerError,
    debezium_version,
    kafka_lib,
    kafka_version,
)
from cdc.servers.process import refuse_taken, serve

DEFAULT_HEAP = "512m"


class _WithConnect(ApacheKafka):
    """The broker, and a Kafka Connect worker started after it and stopped before it."""

    def __init__(self, data_dir: str | None, *, port: int | None, partitions: int, heap: str,
                 connect_port: int | None) -> None:
        super().__init__(data_dir, port=port, partitions=partitions, heap=heap)
        self.connect = KafkaConnect(self, self.data_dir / "connect", rest_port=connect_port or None)

    def start(self, timeout: float = 180.0) -> _WithConnect:
        super().start(timeout)
        self.connect.start()
        return self

    def stop(self, cleanup: bool | None = None) -> None:
        self.connect.stop(cleanup=False)
        super().stop(cleanup)


@click.command(
    "kafka",
    short_help="Apache Kafka (KRaft) on loopback; --connect: Kafka Connect with Debezium.",
    help="Run Apache Kafka (one broker in KRaft mode, no ZooKeeper) on 127.0.0.1 until interrupted, and print its "
    "bootstrap servers. It needs the pinned jars: `make kafka` resolves them once from Maven Central. --connect "
    "also runs Kafka Connect standalone with Debezium's PostgreSQL connector; add connectors through its REST API.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=9092, show_default=True,
              help="The PLAINTEXT listener's port (0 = a free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Data directory (kept); a temporary one (removed on exit) when omitted.")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partitions of auto-created topics.")
@click.option("--heap", default=DEFAULT_HEAP, show_default=True, help="The broker's JVM heap.")
@click.option("--connect", "with_connect", is_flag=True, help="Also run Kafka Connect with Debezium's PostgreSQL connector.")
@click.option("--connect-port", type=click.IntRange(0, 65535), default=8083, show_default=True,
              help="Kafka Connect's REST port (0 = a free port).")
def main(port: int, data_dir: str | None, partitions: int, heap: str, with_connect: bool, connect_port: int) -> None:
    refuse_taken(port, "--port")
    if with_connect:
        refuse_taken(connect_port, "--connect-port")
    try:
        kafka_lib()
    except KafkaServerError as exc:
        raise click.ClickException(str(exc)) from None
    kept = "kept" if data_dir is not None else "removed on exit"
    if with_connect:
        broker: ApacheKafka = _WithConnect(data_dir, port=port or None, partitions=partitions, heap=heap,
                                           connect_port=connect_port)
    else:
        broker = ApacheKafka(data_dir, port=port or None, partitions=partitions, heap=heap)

    def ready() -> str:
        lines = [f"Apache Kafka {kafka_version()} (KRaft) ready in {broker.last_start_s:.1f} s (pid {broker.pid})",
                 f"  bootstrap    {broker.bootstrap}"]
        if isinstance(broker, _WithConnect):
            lines.append(f"  Connect      {broker.connect.url} (Debezium {debezium_version()} PostgreSQL connector)")
        lines += [f"  data         {broker.data_dir} ({kept})", "Ctrl-C to stop"]
        return "\n".join(lines)

    serve(broker, "Apache Kafka", ready)


if __name__ == "__main__":
    main()
