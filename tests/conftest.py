"""Shared fixtures: one Spark session for the whole run (a session costs ~10 s to start on 2 cores), and the
local Tablestore server and the Apache Pulsar standalone broker that backend and server tests both use
(pulsar-lite's fixtures live in ``tests/backends/pulsar/conftest.py``: only those tests use it)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from cdc.servers.pulsar.standalone import ApachePulsar
from cdc.servers.tablestore import TablestoreProcess

# Spark's Python workers must run this interpreter (the virtualenv's), not the system one.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ``make test`` runs the suite on pytest-xdist workers with ``--dist loadgroup``. A session fixture starts its
# server once per worker, so the tests of each heavy server (a JVM of a few GB that takes tens of seconds to
# start) are kept on one worker: one broker, one cluster, one Connect server per run. A module goes whole to
# the group of the first server in this order that one of its tests uses; a module whose fixtures are
# module-scoped (set up once for the module) stays whole too. Every worker starts its own Spark session.
SERVER_GROUPS = {
    "apache_pulsar": "apache-pulsar",
    "spark_cluster": "spark-cluster",
    "connect_server": "spark-connect",
    "apache_kafka": "apache-kafka",  # Kafka Connect (kafka_connect) runs on the broker's fixture: same group
    "postgres_server": "postgres",
    "mariadb_server": "mariadb",
}


def _module_scoped(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("module", "package") and d.baseid for ds in defs for d in ds)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups to schedule the run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[str, str] = {}  # module path -> group
    rank = {g: i for i, g in enumerate(SERVER_GROUPS.values())}
    for item in items:
        module = item.nodeid.split("::")[0]
        used = getattr(item, "fixturenames", ())
        for fixture, group in SERVER_GROUPS.items():
            if fixture in used and rank[group] < rank.get(groups.get(module, ""), len(rank)):
                groups[module] = group
        if module not in groups and _module_scoped(item):
            groups[module] = module
    for item in items:
        group = groups.get(item.nodeid.split("::")[0])
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its collection is the run's order
        longest_first(items)


DURATIONS = Path(__file__).with_name("durations.json")
"""Each test's seconds in a whole run (``tests/folder_times.py --save-durations``); a test not listed counts
as :data:`UNLISTED` seconds."""
UNLISTED = 0.5


def longest_first(items: list[pytest.Item]) -> None:
    """Order the run's units of work (an xdist group, or a test outside any group) longest first, by their
    recorded seconds. pytest-xdist's ``loadgroup`` hands the units out in this order (``pytest_configure``
    turns off its reordering by test count), so neither worker starts a long unit when the other is nearly
    done: the run ends when the work does, not one long test later."""
    try:
        seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    cost: dict[str, float] = {}
    for item in items:
        unit = _unit(item)
        cost[unit] = cost.get(unit, 0.0) + seconds.get(item.nodeid, UNLISTED)
    first = {}
    for i, item in enumerate(items):
        first.setdefault(_unit(item), i)
    items.sort(key=lambda item: (-cost[_unit(item)], first[_unit(item)]))


def _unit(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return f"@{marker.kwargs.get('name', marker.args[0] if marker.args else '')}" if marker else item.nodeid


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin, which enables it for every thread
def pytest_configure(config: pytest.Config) -> None:
    from tests import xdist_support

    if not config.pluginmanager.is_registered(xdist_support):
        config.pluginmanager.register(xdist_support, "cdc-xdist-support")
    # Keep the order longest_first gave (xdist would otherwise put the groups with the most tests first).
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False
    if hasattr(config, "workerinput"):
        # A worker that crashes in native code dumps the crashing thread's Python stack only: with every thread
        # (pytest's default) Spark's and xdist's idle threads come first and a shortened log loses the one that
        # matters.
        import faulthandler

        assert sys.__stderr__ is not None
        # A duplicate of the worker's stderr: pytest's capturing redirects descriptor 2 itself during the tests.
        faulthandler.enable(file=os.dup(sys.__stderr__.fileno()), all_threads=False)


def spark_builder(app: str = "cdc-tunnel-tests") -> Any:
    """The tests' local session, with Delta Lake configured (the io.delta jars of ``make delta-spark``) so the
    delta-spark engine and ``format("delta")`` run in the suite; without the jars it fails, naming the command."""
    from pyspark.sql import SparkSession

    from sinks.delta.session import configure_delta

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    builder = configure_delta(builder)
    # Spark's own Kafka source (format("kafka")) beside the io.delta jars, when `make kafka` resolved it.
    from cdc.servers.kafka.standalone import KafkaServerError, spark_kafka_jars
    from sinks.delta.session import delta_jars

    try:
        kafka_jars = spark_kafka_jars()
    except KafkaServerError:
        return builder  # the Spark Kafka source tests then fail naming `make kafka`
    return builder.config("spark.jars", ",".join([*map(str, delta_jars()), *kafka_jars]))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import cdc

    session = spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    cdc.register(session)
    yield session
    session.stop()


@pytest.fixture
def tablestore_server(tmp_path: Path) -> Iterator[TablestoreProcess]:
    """A real local Tablestore server in a child process, per test.

    Yields a :class:`cdc.servers.tablestore.TablestoreProcess`: ``endpoint``,
    ``instance``, ``access_key_id``, ``access_key_secret``, ``data_dir``; ``ots_client()`` (a real
    ``tablestore.OTSClient``); ``split(table, shard_id=None, split_key=None)``, ``merge(table,
    shard_ids=None)``, ``shards(table)``; ``fault(kind, count=-1, seconds=0, path_prefix="")`` with kinds
    ``unavailable``/``drop``/``delay``, ``clear_faults()``, ``expire_client(client_id)``,
    ``trim(table, before_ms=None)`` (expire the change log: reads before it get ``OTSTrimmedDataAccess``); ``kill()`` (SIGKILL),
    ``stop()``, ``start()``, ``restart(crash=True)``. The server listens on 127.0.0.1 on a free port (the
    same port across restarts) and is stopped at the end of the test.
    """
    server = TablestoreProcess(
        tmp_path / "ots-data",
        instance="testinst",
        access_key_id="test-ak-id",
        access_key_secret="test-ak-secret",
        max_records_per_read=100,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def apache_pulsar() -> Iterator[ApachePulsar]:
    """Apache Pulsar standalone, shared by the session: auto-created topics are not partitioned; make
    partitioned ones with ``create_partitioned_topic``. A test may kill and restart it (same ports, data)."""
    with ApachePulsar() as p:
        yield p


KAFKA_USERS = {"cdc-reader": "reader-secret-7f3a"}
"""The SCRAM users of the session's Kafka broker (its SASL_SSL listener)."""


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Apache Kafka (KRaft, one broker) shared by the session: a PLAINTEXT listener (``bootstrap``) and a
    SASL_SSL one (``secure_bootstrap``: SCRAM-SHA-512 over TLS, users :data:`KAFKA_USERS`, its CA in
    ``apache_kafka.tls.ca``). Auto-created topics have one partition; make others with ``create_topic``. A test
    may kill and restart it (same ports, data)."""
    from cdc.servers.kafka import ApacheKafka, Tls
    from tests.tls import make_certificates

    certs = make_certificates(tmp_path_factory.mktemp("kafka-tls"))
    with ApacheKafka(tls=Tls(certs.cert, certs.key, KAFKA_USERS, certs.ca)) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def kafka_connect(apache_kafka: Any) -> Iterator[Any]:
    """Kafka Connect standalone with Debezium's PostgreSQL connector, writing to the session's Kafka; connectors
    are added through its REST API (one worker for the session)."""
    from cdc.servers.kafka import KafkaConnect

    with KafkaConnect(apache_kafka) as connect:
        yield connect


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One real PostgreSQL (:class:`cdc.servers.postgres.PostgresServer`) for the session, on loopback with
    ``wal_level=logical``; tests take a database of their own through ``postgres_dsn``. A test may kill and
    restart it (same port and data)."""
    from cdc.servers.postgres import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: Any, request: pytest.FixtureRequest) -> str:
    """The DSN of a fresh database for this test on the session's PostgreSQL."""
    import hashlib

    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    return str(postgres_server.create_database(f"t_{digest}"))


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[Any]:
    """One real MariaDB (:class:`cdc.servers.mysql.MariaDBServer`, Debian's ``mariadb-server`` binaries) for the
    session, on loopback with a row-based binary log; tests take a database of their own through ``mysql_dsn``.
    A test may kill and restart it (same port and data). Missing binaries fail the test, naming the install."""
    from cdc.servers.mysql import MariaDBServer

    with MariaDBServer() as server:
        yield server


@pytest.fixture
def mysql_dsn(mariadb_server: Any, request: pytest.FixtureRequest) -> str:
    """The DSN of a fresh database for this test on the session's MariaDB."""
    import hashlib

    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    return str(mariadb_server.create_database(f"t_{digest}"))


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The Spark Connect server of pyspark 4.2 on a free loopback port, shared by the module that uses it (~15-40
    s to start; stopped after that module, so its JVM does not weigh on the rest of the run); clients run in child processes (``tests/drivers/connect_client.py``): a Connect session in this
    process would switch pyspark's functions to Connect mode for every later test."""
    from cdc.servers.spark.connect import ConnectServer

    with ConnectServer(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone master and two workers (1 core, 1 GB each) on loopback, shared by the module that uses
    it and stopped after it (three JVMs that would otherwise idle through the rest of the run).
    Drivers run in child processes (``tests/drivers/cluster_orders.py``) so that a test can ``kill -9`` them."""
    from cdc.servers.spark.cluster import SparkCluster

    with SparkCluster(2, cores=1, memory="1g", data_dir=tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster
