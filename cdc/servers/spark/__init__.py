"""Spark's own servers, started from the installed ``pyspark`` package (it ships every Spark jar and the
``spark-class``/``spark-submit`` launchers), on loopback: a standalone cluster (:mod:`.cluster`) and the
Spark Connect server (:mod:`.connect`). Both run this interpreter as Spark's Python and put the project on
its Python path, so the ``cdc`` source's ``read()`` and ``foreachBatch`` sinks import on every worker."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["project_root", "python_env", "spark_home"]


def spark_home() -> Path:
    """The ``pyspark`` package directory, which is a complete ``SPARK_HOME`` (``bin/``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def project_root() -> Path:
    """The directory holding the ``cdc``, ``sinks`` and ``udfs`` packages (a checkout or site-packages)."""
    return Path(__file__).resolve().parents[3]


def python_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Spark process we start: our interpreter for Python workers, the project first
    on their ``PYTHONPATH``, every address on loopback."""
    env = dict(os.environ)
    root = str(project_root())
    path = env.get("PYTHONPATH", "")
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=root if not path else f"{root}{os.pathsep}{path}",
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="127.0.0.1",
    )
    env.update(extra or {})
    return env
