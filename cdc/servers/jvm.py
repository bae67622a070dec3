"""What the JVM servers started by :mod:`cdc.servers` share: which ``java`` runs them, and its sizes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def java() -> str:
    """``$JAVA_HOME/bin/java``, else the ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    return str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")


def megabytes(size: str) -> int:
    """A JVM size (``256m``, ``1g``, ``524288k``) in MiB."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024}
    unit = size[-1].lower()
    if unit not in units:
        return int(size) // (1024 * 1024)
    return int(float(size[:-1]) * units[unit])
