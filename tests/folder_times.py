"""Seconds per test folder from a pytest run's ``--durations=0`` report (set-up, call and tear-down summed).

Not a test module. Usage::

    .venv/bin/python -m pytest tests/sinks --durations=0 -p no:cacheprovider | tee run.log
    .venv/bin/python tests/folder_times.py run.log [--depth 2]

Folders are cut at ``--depth`` parts below ``tests/`` (2: ``backends/pulsar``). Under pytest-xdist the figures
are the sum over workers (the wall time is the run's own last line).

``--save-durations tests/durations.json`` also writes each test's seconds (those of a second or more) for
``tests/conftest.py``, which hands the longest work to the pytest-xdist workers first. Refresh it from a
whole run's report (``make test PYTEST_ARGS=--durations=0``) when test times change a lot.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(tests/\S+?)::")
TEST = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(tests/\S+::\S+?)(?:@[\w./-]+)?\s*$")
"""A test's line; pytest-xdist's ``--dist loadgroup`` reports a grouped test's id with ``@<group>`` appended."""


def folder_seconds(text: str, depth: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            parts = Path(m.group(3)).parts[1:]
            folder = "/".join(parts[: min(depth, len(parts) - 1)]) or parts[0]
            out[folder] += float(m.group(1))
    return dict(out)


def test_seconds(text: str, at_least: float = 1.0) -> dict[str, float]:
    """Each test's seconds (set-up, call and tear-down summed), for the tests that took ``at_least``."""
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = TEST.match(line)
        if m:
            out[m.group(2)] += float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(out.items()) if v >= at_least}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--save-durations", type=Path, help="write each test's seconds there (JSON)")
    args = parser.parse_args()
    text = args.report.read_text(errors="replace")
    if args.save_durations:
        args.save_durations.write_text(json.dumps(test_seconds(text), indent=0) + "\n")
    times = folder_seconds(text, args.depth)
    total = sum(times.values())
    for folder, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{folder:<28} {seconds:8.0f} s  {100 * seconds / total:5.1f} %")
    print(f"{'total':<28} {total:8.0f} s")


if __name__ == "__main__":
    main()
