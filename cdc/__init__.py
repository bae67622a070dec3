"""cdc-tunnel: change-data-capture ingestion for Apache Spark.

    import cdc
    cdc.register(spark)
    changes = spark.readStream.format("cdc").option("backend", "local").option("path", p).load()
"""

from __future__ import annotations

import logging
from typing import Any

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


def register(spark: Any) -> None:
    """Register the ``cdc`` data source (and the change-record UDFs, where installed) with ``spark``."""
    _warn_if_py4j_logs_option_values()
    from cdc.source import CdcDataSource

    spark.dataSource.register(CdcDataSource)
    from udfs import register as register_udfs

    register_udfs(spark)
    try:  # also "cdc-pulsar", the sink-only format name
        from sinks.pulsar import register as register_pulsar_sink
    except ImportError:  # pulsar-client not installed: reads and Delta still work
        return
    register_pulsar_sink(spark)
