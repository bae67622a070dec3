"""The delta-spark engine's set-up: where the pinned io.delta jars are, and a Spark session configured for them;
and what the sink reads from a batch's session (its streaming query's id, the batch collected to Arrow).

``make delta-spark`` (run by ``make test`` and ``make demo``) resolves the jars that ``delta-spark/pom.xml``
beside this module pins into ``~/.cache/cdc-tunnel/delta-<version>/lib`` (``$CDC_DELTA_HOME`` overrides the
directory) and names a stamp file after the pom's content, so jars of an older pin are never picked up.

    from sinks.delta.session import configure_delta
    spark = configure_delta(SparkSession.builder.master("local[2]")).getOrCreate()
"""

from __future__ import annotations

import hashlib
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.errors import OptionError, TerminalError

if TYPE_CHECKING:
    import pyarrow as pa

POM = Path(__file__).parent / "delta-spark" / "pom.xml"
HOME_ENV = "CDC_DELTA_HOME"
"""Environment variable naming the directory ``make delta-spark`` resolves the jars into (its ``lib/``)."""

EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: Delta reads a table's log with this many partitions; its default (50) made a local first MERGE take 57 s
#: instead of 17 s (measured by the scout on 2 cores). A cluster sets its own.
LOCAL_SNAPSHOT_PARTITIONS = "2"


def delta_version() -> str:
    """The Delta Lake version pinned by ``delta-spark/pom.xml``."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ET.parse(POM).getroot().findtext("m:properties/m:delta.version", namespaces=ns)
    if not version:  # pragma: no cover - the pom is ours
        raise TerminalError(f"{POM} sets no delta.version")
    return version.strip()


def delta_home() -> Path:
    """``$CDC_DELTA_HOME``, else ``~/.cache/cdc-tunnel/delta-<version>`` (the Makefile's default, too)."""
    given = os.environ.get(HOME_ENV)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "cdc-tunnel" / f"delta-{delta_version()}"


def delta_jars() -> list[Path]:
    """The resolved io.delta jars for the current pom; raises, naming the command, when they are missing."""
    home = delta_home()
    key = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    jars = sorted((home / "lib").glob("*.jar"))
    if not (home / f"resolved-{key}").exists() or not any(j.name.startswith("delta-spark_") for j in jars):
        raise TerminalError(
            f"the io.delta jars of Delta Lake {delta_version()} are not resolved in {home} for the current "
            f"{POM.name}: run `make delta-spark` (`make test` and `make demo` run it; it needs Maven), or point "
            f"${HOME_ENV} at a directory it filled"
        )
    return jars


def delta_available() -> bool:
    """True when the jars are resolved and the ``delta-spark`` Python package imports."""
    try:
        delta_jars()
        import delta  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401
    except (TerminalError, ImportError):
        return False
    return True


def configure_delta(builder: Any, *, local: bool = True) -> Any:
    """``builder`` (a ``SparkSession.Builder``) with the io.delta jars, Delta's SQL extension and catalog.

    ``local``: also keep Delta's log reads to a few partitions (right for ``local[...]``; a cluster keeps
    Delta's default). Must run before the session starts: jars cannot join a running JVM.
    """
    builder = (
        builder.config("spark.jars", ",".join(str(j) for j in delta_jars()))
        .config("spark.sql.extensions", EXTENSION)
        .config("spark.sql.catalog.spark_catalog", CATALOG)
    )
    if local:
        builder = builder.config("spark.databricks.delta.snapshotPartitions", LOCAL_SNAPSHOT_PARTITIONS)
    return builder


def default_engine(spark: Any, *, pipelined: bool = False) -> str:
    """The engine ``engine="auto"`` runs: delta-rs under ``local[...]`` (or with no session, or pipelined),
    delta-spark on a cluster when the session has the io.delta jars.

    Measured with ``benchmarks/cdc_to_delta.py --engine delta-spark`` (see the README): locally delta-rs is the
    faster engine; on a cluster delta-rs would collect every micro-batch to the driver and rewrite files from
    one process, while delta-spark reads, prepares and rewrites on the executors.
    """
    if spark is None or pipelined:
        return "delta-rs"
    try:
        master = str(spark.conf.get("spark.master", "local"))
    except Exception:  # a session that does not expose it (Spark Connect): no cluster evidence either way
        return "delta-rs"
    if master.startswith("local"):
        return "delta-rs"
    try:
        return "delta-spark" if delta_jars_available(spark) else "delta-rs"
    except Exception:
        return "delta-rs"


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (no ``sparkContext``, no ``_jvm``); checked by class, so that a
    classic session never imports the Connect client (grpc)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def ordered_source(batch_df: Any, sequence_by: str) -> bool:
    """True when ``batch_df`` is the output of one ``format("cdc")`` source whose backend orders every key's
    changes: its ``sequence_by`` column carries the source's mark (:data:`cdc.model.KEY_ORDER_MARK`) and the
    streaming query's plan (outside a query: the batch's) reads exactly one relation. A union or a join reads two (even of one source with itself),
    and two ordered streams together are not ordered. Under Spark Connect the plan cannot be inspected:
    False (safe mode)."""
    from cdc.model import KEY_ORDER_MARK

    if sequence_by not in batch_df.columns or is_connect(batch_df.sparkSession):
        return False
    field = batch_df.schema[sequence_by]
    if not (field.metadata or {}).get(KEY_ORDER_MARK):
        return False
    spark = batch_df.sparkSession
    # foreachBatch hands over the batch as one already-planned relation (a LogicalRDD), whatever the query
    # read: the query's own plan, with its sources as leaves, tells what it reads.
    query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
    if query_id:
        # The batch's session is the query's clone of the session that started it, whose query manager
        # knows the query: look in the batch's, then in the sessions this process created.
        from pyspark.sql import SparkSession

        query = None
        for session in (spark, SparkSession.getActiveSession(), SparkSession._instantiatedSession):
            if session is not None and not is_connect(session):
                query = session._jsparkSession.streams().get(query_id)
                if query is not None:
                    break
        if query is None:
            return False
        plan = query.streamingQuery().logicalPlan()
    else:
        plan = batch_df._jdf.queryExecution().analyzed()
    return bool(plan.collectLeaves().size() == 1)


def connect_query_id(spark: Any) -> str | None:
    """The streaming query id under Spark Connect, where the batch's local properties are not visible.

    ``foreachBatch`` runs in a worker attached to the client's session, so the session's active queries are
    the user's: with exactly one, it is this batch's query (its id is kept in the checkpoint, so it stays the
    same across restarts). With several, the batch cannot tell which is its own.
    """
    active = spark.streams.active
    if len(active) > 1:
        raise OptionError(
            f"option 'app_id' is required under Spark Connect when the session runs several streaming queries "
            f"({len(active)} active): give each query's sink its own app_id",
            "app_id",
        )
    return str(active[0].id) if active else None


ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
COLLECT_BATCH_ROWS = 1 << 18


def collect_arrow(batch_df: Any) -> pa.Table:
    """``batch_df.toArrow()`` with large Arrow batches (fewer, bigger transfers; measured ~0.1-0.2 s less per
    100k changes). The setting is raised only for this collect and restored after it."""
    conf = batch_df.sparkSession.conf
    before = conf.get(ARROW_BATCH_CONF)
    raise_it = before is not None and 0 < int(before) < COLLECT_BATCH_ROWS
    if raise_it:
        conf.set(ARROW_BATCH_CONF, str(COLLECT_BATCH_ROWS))
    try:
        return batch_df.toArrow()
    finally:
        if raise_it:
            conf.set(ARROW_BATCH_CONF, before)


DELTA_CLASS = "io.delta.tables.DeltaTable"
UNAVAILABLE = (
    "the delta-spark engine needs the io.delta Spark jars on the classpath (class io.delta.tables.DeltaTable); "
    "they are not on this JVM. Run `make delta-spark` and build the session with "
    "sinks.delta.session.configure_delta(SparkSession.builder...) (or spark-submit --packages "
    "io.delta:delta-spark_4.2_2.13:4.4.0), or use engine='delta-rs'"
)


def class_loadable(spark: Any, name: str) -> bool:
    """True when the JVM behind ``spark`` can load class ``name`` (with Spark's class loader)."""
    try:
        return bool(spark._jvm.org.apache.spark.util.Utils.classIsLoadable(name))
    except Exception:  # an unusual JVM gateway: ask the context class loader directly
        jvm = spark._jvm
        try:
            jvm.java.lang.Class.forName(name, False, jvm.java.lang.Thread.currentThread().getContextClassLoader())
            return True
        except Exception:
            return False


def delta_jars_available(spark: Any) -> bool:
    """True when the io.delta Spark classes are on the classpath."""
    return class_loadable(spark, DELTA_CLASS)


def query_app_id(spark: Any) -> str:
    """The Delta application-transaction id of the streaming query running in ``spark``:
    ``cdc-tunnel-<query id>``, the same across restarts of the query from its checkpoint."""
    qid = connect_query_id(spark) if is_connect(spark) else spark.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not qid:
        raise OptionError(
            "option 'app_id' is required outside a streaming query (no streaming query id to derive it from)",
            "app_id",
        )
    return f"cdc-tunnel-{qid}"
