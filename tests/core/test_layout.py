"""The folder tree tells the truth about the architecture: these are checked, not just documented."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.backends import REQUIRED_FILES

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = [p for pkg in ("cdc", "sinks", "udfs") for p in sorted((ROOT / pkg).rglob("*.py"))]
BACKENDS = sorted(p for p in (ROOT / "cdc" / "backends").iterdir() if (p / "__init__.py").exists())
MAX_LINES = 650


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda p: p.name)
def test_every_backend_has_the_required_files(backend: Path) -> None:
    missing = [f for f in REQUIRED_FILES if not (backend / f).exists()]
    assert not missing, f"{backend.name} lacks {missing}"


def test_no_library_module_is_over_the_size_limit() -> None:
    big = {str(p.relative_to(ROOT)): n for p in LIBRARY if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_the_core_never_imports_a_sink() -> None:
    assert len([p for p in LIBRARY if p.is_relative_to(ROOT / "cdc")]) > 50  # the walk sees the core
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m == "sinks" or m.startswith("sinks."))
        for p in LIBRARY
        if p.is_relative_to(ROOT / "cdc")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_sinks_hold_no_backend_writer() -> None:
    """Writes belong to their backend (the Pulsar writer lives in cdc/backends/pulsar/writer.py)."""
    assert (ROOT / "cdc" / "backends" / "pulsar" / "writer.py").exists()
    assert not list((ROOT / "sinks").rglob("*pulsar*"))


def test_sinks_depend_only_on_the_change_model_and_errors() -> None:
    allowed = {"cdc", "cdc.model", "cdc.errors"}
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.split(".")[0] == "cdc" and m not in allowed)
        for p in sorted((ROOT / "sinks").rglob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}


WIRE_FORMAT_MODULES = [
    "cdc.backends.tablestore.plainbuffer",
    "cdc.backends.tablestore.tunnel_pb",
]


@pytest.mark.parametrize("module", WIRE_FORMAT_MODULES)
def test_wire_format_modules_import_light(module: str) -> None:
    """A wire-format module loads no backend, client, pydantic, pyspark or SDK (a fresh interpreter tells)."""
    heavy = ["pydantic", "pyspark", "pulsar", "tablestore", "cdc.backend", "cdc.backends.tablestore.backend"]
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"importing {module} loaded: {out.stdout.strip()}"


def test_import_cdc_alone_is_light() -> None:
    code = "import sys, cdc; print(' '.join(m for m in ('pydantic', 'pyspark', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
