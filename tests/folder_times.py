"""Seconds per test folder from a pytest run's ``--durations=0`` report (set-up, call and tear-down summed).

Not a test module. Usage::

    .venv/bin/python -m pytest tests/sinks --durations=0 -p no:cacheprovider | tee run.log
    .venv/bin/python tests/folder_times.py run.log [--depth 2]

Folders are cut at ``--depth`` parts below ``tests/`` (2: ``backends/pulsar``). Under pytest-xdist the figures
are the sum over workers (the wall time is the run's own last line).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(tests/\S+?)::")


def folder_seconds(text: str, depth: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            parts = Path(m.group(3)).parts[1:]
            folder = "/".join(parts[: min(depth, len(parts) - 1)]) or parts[0]
            out[folder] += float(m.group(1))
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--depth", type=int, default=2)
    args = parser.parse_args()
    times = folder_seconds(args.report.read_text(errors="replace"), args.depth)
    total = sum(times.values())
    for folder, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{folder:<28} {seconds:8.0f} s  {100 * seconds / total:5.1f} %")
    print(f"{'total':<28} {total:8.0f} s")


if __name__ == "__main__":
    main()
