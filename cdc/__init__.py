"""cdc-tunnel: change-data-capture ingestion for Apache Spark.

    import cdc
    cdc.register(spark)
    changes = spark.readStream.format("cdc").option("backend", "local").option("path", p).load()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from cdc.lazy import lazy_exports

if TYPE_CHECKING:
    from cdc.backend import Backend, ChannelInfo, PlannedRange, RangeReader, open_backend, register_backend
    from cdc.errors import CdcError, DataLossError, OptionError
    from cdc.model import ChangeSchema, Op

__version__ = "0.1.0"
__all__ = [
    "Backend",
    "CdcError",
    "ChangeSchema",
    "ChannelInfo",
    "DataLossError",
    "Op",
    "OptionError",
    "PlannedRange",
    "RangeReader",
    "open_backend",
    "register",
    "register_backend",
]

# ``import cdc`` alone loads nothing heavy (pydantic, pyarrow, pyspark): the public names are imported on
# first use, so a wire-format module such as ``cdc.backends.tablestore.plainbuffer`` stays light.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Backend": "cdc.backend",
        "ChannelInfo": "cdc.backend",
        "PlannedRange": "cdc.backend",
        "RangeReader": "cdc.backend",
        "open_backend": "cdc.backend",
        "register_backend": "cdc.backend",
        "CdcError": "cdc.errors",
        "DataLossError": "cdc.errors",
        "OptionError": "cdc.errors",
        "ChangeSchema": "cdc.model",
        "Op": "cdc.model",
    },
)


logging.getLogger(__name__).addHandler(logging.NullHandler())


_warned_py4j_debug = False


def _warn_if_py4j_logs_option_values() -> None:
    """Warn (once per process) when py4j logs at DEBUG: it then logs every call the driver sends to the JVM,
    ``.option("access.key.secret", ...)`` with its value included."""
    global _warned_py4j_debug
    if _warned_py4j_debug or not logging.getLogger("py4j").isEnabledFor(logging.DEBUG):
        return
    _warned_py4j_debug = True
    logging.getLogger(__name__).warning(
        "the 'py4j' logger is at DEBUG: option values, secrets included, will be logged; raise its level "
        "(logging.getLogger('py4j').setLevel(logging.INFO)) or pass credentials through the environment "
        "variables the backend reads (e.g. ALIBABA_CLOUD_ACCESS_KEY_SECRET) instead of .option(...)"
    )


def register(spark: Any, *, functions: bool = True) -> None:
    """Register the ``cdc`` data source, the backends' own data sources (:meth:`cdc.backend.Backend.register_spark`:
    Tablestore's ``tablestore`` table scan, Pulsar's ``cdc-pulsar`` sink) and, where installed, the change-record
    SQL functions with ``spark``.

    Works with a classic session, a Spark Connect session and inside a Spark Declarative Pipelines definition
    file. Pipelines block ``spark.udf.register`` there (``SESSION_MUTATION_IN_DECLARATIVE_PIPELINE``) while
    data sources may still be registered, so the SQL functions are then skipped with a log line; pass
    ``functions=False`` to skip them anywhere.
    """
    _warn_if_py4j_logs_option_values()
    from cdc.source import CdcDataSource

    spark.dataSource.register(CdcDataSource)
    from cdc.backend import installed_backends

    for backend in installed_backends():  # their own formats: Tablestore's table scan, Pulsar's sink name
        backend.register_spark(spark)
    if functions:
        _register_functions(spark)


def _register_functions(spark: Any) -> None:
    from pyspark.errors import PySparkException

    from udfs import register as register_udfs

    try:
        register_udfs(spark)
    except PySparkException as e:
        if not (e.getCondition() or "").startswith("SESSION_MUTATION_IN_DECLARATIVE_PIPELINE"):
            raise
        logging.getLogger(__name__).info(
            "inside a declarative pipeline definition: the cdc SQL functions (cdc_plainbuffer_json) are not "
            "registered there; the cdc data source is"
        )
