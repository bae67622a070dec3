"""Macros of the documentation site (mkdocs-macros): what a page shows of the code is generated here.

``{{ options_table("postgres") }}``  a backend's options (``"source"``: the source's own; ``"module:Model"``:
                                     any options model, or a class whose docstring describes its parameters,
                                     as ``"sinks.delta:DeltaUpsertSink"``), the rows ``cdc options`` prints
``{{ cli_reference() }}``            every ``cdc`` command: usage, help, options with their help
``{{ error_reference() }}``          every public error class with its cause and fix (``errors.yml``)
``{{ performance_tables() }}``       the benchmarks' records (``benchmarks/results/*.jsonl``)

The functions are plain so tests call them without mkdocs (tests/docs/).
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import click
import yaml

ROOT = Path(__file__).resolve().parents[1]
ERRORS_FILE = Path(__file__).resolve().parent / "operations" / "errors.yml"
RESULTS = ROOT / "benchmarks" / "results"


# ------------------------------------------------------------------------------------------------ options
def options_table(name: str) -> str:
    """The Markdown option table of a backend, of ``"source"``, or of an options model ``"module:Class"``."""
    from pydantic import BaseModel

    from cdc.backend import option_tables, options_model
    from cdc.options import describe_options, describe_parameters, options_markdown

    if name == "source":
        return options_markdown(option_tables(None)[0][1])
    if ":" in name:
        module, _, attr = name.partition(":")
        found = getattr(importlib.import_module(module), attr)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return options_markdown(describe_options(found))
        return options_markdown(describe_parameters(found))  # a class taking its options as parameters
    return options_markdown(describe_options(options_model(name)))


# ---------------------------------------------------------------------------------------------------- CLI
def _commands(group: click.Group, ctx: click.Context) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        yield name, cmd


def _param_row(param: click.Parameter) -> str:
    if isinstance(param, click.Argument) or param.name == "help":
        return ""
    assert isinstance(param, click.Option)
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if not param.is_flag and param.metavar:
        names += f" `{param.metavar}`"
    default = ""
    if param.show_default and param.default is not None and not param.is_flag:
        default = f" (default: `{param.default}`)"
    env = f" Environment: `{param.envvar}`." if isinstance(param.envvar, str) else ""
    helptext = " ".join((param.help or "").split()).replace("|", "\\|")
    return f"| {names} | {helptext}{default}{env} |"


def _render(cmd: click.Command, path: list[str], ctx: click.Context, level: int, out: list[str]) -> None:
    sub = click.Context(cmd, info_name=path[-1], parent=ctx)
    out.append(f"{'#' * level} `{' '.join(path)}`\n")
    out.append(f"```text\nUsage: {' '.join(path)} {' '.join(cmd.collect_usage_pieces(sub))}\n```\n")
    if cmd.help:
        out.append(click.unstyle(cmd.help).replace("\b\n", "") + "\n")
    rows = [r for r in (_param_row(p) for p in cmd.get_params(sub)) if r]
    if rows:
        out.append("| option | meaning |\n| --- | --- |\n" + "\n".join(rows) + "\n")
    if isinstance(cmd, click.Group):
        for name, child in _commands(cmd, sub):
            _render(child, [*path, name], sub, min(level + 1, 6), out)


def cli_reference() -> str:
    """Every visible ``cdc`` command, depth first, as Markdown (from the click commands themselves)."""
    from cdc.cli import main

    ctx = click.Context(main, info_name="cdc")
    out: list[str] = []
    _render(main, ["cdc"], ctx, 2, out)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------- errors
class ErrorClass(NamedTuple):
    """A public error class found in the source tree."""

    area: str
    """``core``, a backend's name, ``delta``, ``server <name>``: where the class lives."""
    name: str
    module: str
    bases: tuple[str, ...]
    doc: str


def _area(module: str) -> str:
    parts = module.split(".")
    if parts[:2] == ["cdc", "backends"] and len(parts) > 2:
        return parts[2]
    if parts[:2] == ["cdc", "servers"] and len(parts) > 2:
        return f"server {parts[2]}"
    if parts[0] == "sinks" and len(parts) > 1:
        return parts[1]
    if parts[0] == "udfs":
        return "udfs"
    return "core"


@functools.cache
def _classes() -> dict[str, list[tuple[str, tuple[str, ...], str]]]:
    """Module -> its top-level classes as (name, simple base names, docstring), parsed, never imported."""
    found: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
    for package in ("cdc", "sinks", "udfs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    bases = tuple(
                        b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                        for b in node.bases
                    )
                    found.setdefault(module, []).append((node.name, bases, ast.get_docstring(node) or ""))
    return found


def public_errors() -> list[ErrorClass]:
    """Every class under ``cdc.errors.CdcError`` defined in ``cdc``, ``sinks`` or ``udfs``, except private ones
    (a ``_`` name) and the test tooling (``cdc.testing``). Found by parsing the source (bases by name), so a
    module that needs an absent extra is still seen."""
    classes = _classes()
    errors = {"CdcError"}
    changed = True
    while changed:  # a class whose base is an error is one; bases are matched by name across modules
        changed = False
        for members in classes.values():
            for name, bases, _ in members:
                if name not in errors and any(b in errors for b in bases):
                    errors.add(name)
                    changed = True
    out = []
    for module, members in classes.items():
        if module.startswith("cdc.testing"):
            continue
        for name, bases, doc in members:
            if name in errors and not name.startswith("_"):
                out.append(ErrorClass(_area(module), name, module, bases, doc))
    return sorted(out, key=lambda e: (e.area != "core", e.area, e.name))


def load_error_entries(path: Path = ERRORS_FILE) -> dict[str, dict[str, dict[str, str]]]:
    """``errors.yml``: area -> class name -> ``{cause, fix}``."""
    data: dict[str, dict[str, dict[str, str]]] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return data


def missing_error_entries() -> tuple[list[str], list[str]]:
    """(classes without an entry, entries naming no class), as ``area/Name``."""
    entries = load_error_entries()
    found = {f"{e.area}/{e.name}" for e in public_errors()}
    written = {f"{area}/{name}" for area, names in entries.items() for name in (names or {})}
    return sorted(found - written), sorted(written - found)


def _kind(err: ErrorClass, by_name: dict[str, ErrorClass]) -> str:
    if err.name == "CdcError":
        return "the root of every error"
    seen, todo = set(), [err.name, *err.bases]
    while todo:
        b = todo.pop()
        if b in ("TransientError",):
            return "transient: retried, and a restarted query may succeed"
        if b in seen or b not in by_name:
            continue
        seen.add(b)
        todo.extend(by_name[b].bases)
    return "terminal: retrying does not help; fix the cause and restart the query"


def error_reference() -> str:
    """The troubleshooting entries, one per public error class, grouped by area."""
    missing, stale = missing_error_entries()
    if missing or stale:
        raise ValueError(
            f"docs/operations/errors.yml is out of date: no entry for {missing or 'none'}; "
            f"entries naming no error class: {stale or 'none'}"
        )
    entries = load_error_entries()
    errors = public_errors()
    by_name = {e.name: e for e in errors}
    out, area = [], None
    for err in errors:
        if err.area != area:
            area = err.area
            out.append(f"## {'The core' if area == 'core' else area.capitalize() if ' ' not in area else area}\n")
        entry = entries[err.area][err.name]
        summary = err.doc.split("\n\n")[0].replace("\n", " ")
        out.append(
            f"### {err.name} {{#{err.area.replace(' ', '-')}-{err.name}}}\n\n"
            f"`{err.module}.{err.name}` ({_kind(err, by_name)}). {summary}\n\n"
            f"**Cause.** {entry['cause'].strip()}\n\n**Fix.** {entry['fix'].strip()}\n"
        )
    return "\n".join(out)


# -------------------------------------------------------------------------------------------- performance
def load_records(folder: Path = RESULTS) -> dict[str, list[dict[str, Any]]]:
    """benchmark -> its records, oldest first (see benchmarks/record.py for the format)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                out.setdefault(rec["benchmark"], []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r["date"])
    return out


def _benchmark_summary(name: str) -> str:
    path = ROOT / "benchmarks" / f"{name}.py"
    if not path.exists():
        return ""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)  # Sphinx roles -> code
    return text.replace("``", "`")


def _ratio_svg(recs: list[dict[str, Any]], width: int = 480, height: int = 120) -> str:
    """A small line chart of the ratio over the runs (oldest left), drawn as inline SVG."""
    points = [(r["date"], float(r["ratio"])) for r in recs if r.get("ratio") is not None]
    if len(points) < 2:
        return ""
    top = max(v for _, v in points) * 1.15 or 1.0
    step = (width - 40) / (len(points) - 1)
    xy = [(30 + i * step, height - 20 - v / top * (height - 35)) for i, (_, v) in enumerate(points)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3"><title>{d}: {v:.3f}</title></circle>'
        for (x, y), (d, v) in zip(xy, points, strict=True)
    )
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="ratio per run">'
        f'<polyline points="{line}" fill="none" stroke="currentColor" stroke-width="2"/>{dots}'
        f'<text x="2" y="12" font-size="11" fill="currentColor">ratio (max {top / 1.15:.3f})</text></svg>\n'
    )


def _number(value: float, unit: str) -> str:
    if unit.endswith("/s") and value >= 1000:
        return f"{value / 1000:,.1f}k {unit}"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}".strip()
    return f"{value:.3g} {unit}".strip()


def performance_tables(last: int = 5, folder: Path = RESULTS) -> str:
    """Per benchmark: what it measures, then its last ``last`` runs (figures, ratio, load, machine, date)."""
    records = load_records(folder)
    if not records:
        return "*No benchmark has recorded a run in this checkout yet (`benchmarks/results/` is empty).*\n"
    out = []
    for name, recs in sorted(records.items()):
        out.append(f"### `{name}`\n")
        summary = _benchmark_summary(name)
        if summary:
            out.append(summary + "\n")
        shown = recs[-last:]
        labels: list[str] = []
        for rec in shown:
            labels.extend(k for k in rec["figures"] if k not in labels)
        head = ["date (UTC)", *labels, "ratio", "target", "load (1 min)", "cores"]
        out.append("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
        for rec in reversed(shown):
            figs = [
                _number(rec["figures"][k]["value"], rec["figures"][k]["unit"]) if k in rec["figures"] else ""
                for k in labels
            ]
            ratio = "" if rec.get("ratio") is None else f"**{rec['ratio']:.3f}**"
            row = [rec["date"].replace("T", " ").rstrip("Z"), *figs, ratio, rec.get("target") or "",
                   f"{rec['load'][0]:.2f}", str(rec.get("cores", ""))]
            out.append("| " + " | ".join(row) + " |")
        chart = _ratio_svg(recs)
        if chart:
            out.append("\n" + chart)
        params = shown[-1].get("params") or {}
        if params:
            out.append("\nLast run's parameters: " + ", ".join(f"`{k}={v}`" for k, v in params.items()) + ".")
        out.append("")
    return "\n".join(out)


def define_env(env: Any) -> None:
    """mkdocs-macros' entry point."""
    for fn in (options_table, cli_reference, error_reference, performance_tables):
        env.macro(fn)
