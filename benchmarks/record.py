"""The record every benchmark appends when it runs: ``benchmarks/results/<benchmark>.jsonl``, one JSON object
a line. The documentation's performance page is generated from these records (docs/macros.py), never from
figures typed into a page.

A record (format 1)::

    {"format": 1,
     "benchmark": "source_overhead",             # the script's name
     "date": "2026-11-27T10:12:03Z",             # UTC, when the run ended
     "figures": {"cdc batch": {"value": 1.52e6, "unit": "rows/s"}, ...},   # labelled, as printed
     "ratio": 0.91,                              # the last line the benchmark prints (ratio <number>), or null
     "target": ">= 0.8",                         # what the ratio is held to, or null
     "params": {"rows": 2000000, "repeat": 3},   # the run's arguments
     "load": [3.1, 2.7, 2.2],                    # os.getloadavg() at the end of the run (1, 5, 15 min)
     "cores": 2,                                 # os.cpu_count()
     "python": "3.11.2", "spark": "4.2.1",       # versions that bear on the figures
     "commit": "24a7d78"}                        # the checkout's commit, when run from a git checkout

A benchmark calls :func:`append_record` once, when its figures are known (it prints nothing, so the
benchmark's last line stays ``ratio <number>``)::

    from record import append_record
    append_record("source_overhead", {"cdc batch": (rate, "rows/s")}, ratio=r, target=">= 0.8",
                  params=vars(args))

``CDC_BENCH_RESULTS`` names another directory (a benchmark run as a smoke test writes there, not into the
checkout); ``CDC_BENCH_RESULTS=`` (empty) appends nothing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FORMAT = 1
RESULTS = Path(__file__).resolve().parent / "results"

Figure = float | int | tuple[float | int, str]


def _spark_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pyspark")
    except Exception:  # noqa: BLE001 - pyspark not installed: the record says so with null
        return None


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(RESULTS.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def make_record(
    benchmark: str,
    figures: Mapping[str, Figure],
    *,
    ratio: float | None = None,
    target: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of one run (see the module docstring); ``figures`` maps a label to a value or ``(value, unit)``."""
    out: dict[str, dict[str, Any]] = {}
    for label, fig in figures.items():
        value, unit = fig if isinstance(fig, tuple) else (fig, "")
        out[label] = {"value": float(value), "unit": unit}
    return {
        "format": FORMAT,
        "benchmark": benchmark,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "figures": out,
        "ratio": None if ratio is None else float(ratio),
        "target": target,
        "params": {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                   for k, v in (params or {}).items()},
        "load": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "spark": _spark_version(),
        "commit": _commit(),
    }


def append_record(
    benchmark: str,
    figures: Mapping[str, Figure],
    *,
    ratio: float | None = None,
    target: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> Path | None:
    """Append the run's record to ``<results>/<benchmark>.jsonl``; returns the file (None when disabled)."""
    where = os.environ.get("CDC_BENCH_RESULTS")
    if where == "":
        return None
    folder = Path(where) if where else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{benchmark}.jsonl"
    record = make_record(benchmark, figures, ratio=ratio, target=target, params=params)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path
