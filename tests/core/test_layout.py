"""The folder tree tells the truth about the architecture: these are checked, not just documented."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cdc.backends import REQUIRED_FILES, ROLE_FILES

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


# Names a role file must not go by (a backend's role has one name everywhere): each maps to the role's file.
# A file of such a name is allowed only as a deprecated alias of a moved module (it calls ``moved_module``).
SYNONYMS = {
    "client.py": "connection.py", "session.py": "connection.py", "slot.py": "connection.py",
    "position.py": "positions.py", "codec.py": "records.py", "decoder.py": "records.py", "record.py": "records.py",
    "snapshots.py": "snapshot.py", "sink.py": "writer.py", "commands.py": "cli.py", "exceptions.py": "errors.py",
    "config.py": "options.py", "settings.py": "options.py", "driver.py": "backend.py", "executor.py": "reader.py",
}


def _is_alias(path: Path) -> bool:
    return "moved_module(" in path.read_text()


def _modules(backend: Path) -> dict[str, ModuleType]:
    """Every module of the backend package (deprecated aliases aside), imported."""
    return {
        p.name: importlib.import_module(f"cdc.backends.{backend.name}.{p.stem}")
        for p in sorted(backend.glob("*.py"))
        if p.name not in ("__init__.py", "__main__.py") and not _is_alias(p)
    }


def _defined(module: ModuleType, base: type) -> list[type]:
    return [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, base) and c.__module__ == module.__name__]


def _imported_by_others(backend: Path, role: str) -> bool:
    target = f"cdc.backends.{backend.name}.{role.removesuffix('.py')}"
    package = f"cdc.backends.{backend.name}"
    return any(
        target in _imports(p) or (package in _imports(p) and role.removesuffix(".py") in p.read_text())
        for p in backend.glob("*.py")
        if p.name != role
    )


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda p: p.name)
def test_every_backend_names_its_roles_the_same_way(backend: Path) -> None:
    """A role file present plays its role; a backend that plays a role keeps it in that role's file; no
    file goes by another name of a role (see cdc/backends/__init__.py)."""
    from cdc.backend import Backend, RangeReader, backend_class
    from cdc.cli import _Main
    from cdc.errors import CdcError
    from cdc.options import BackendOptions

    synonyms = {p.name: SYNONYMS[p.name] for p in backend.glob("*.py") if p.name in SYNONYMS and not _is_alias(p)}
    assert not synonyms, f"{backend.name}: name these files for their roles: {synonyms}"
    modules = _modules(backend)
    present = set(modules)
    cls = backend_class(backend.name)
    assert cls.__module__ == f"cdc.backends.{backend.name}.backend" and _defined(modules["backend.py"], Backend)
    assert _defined(modules["options.py"], BackendOptions), "options.py holds the pydantic options model"
    assert issubclass(cls.options_model, BackendOptions) and cls.options_model.__module__.endswith(".options")
    assert _defined(modules["reader.py"], RangeReader), "reader.py holds the picklable RangeReader"
    # The optional roles, both ways.
    writes = cls.accepts_writes()
    assert ("writer.py" in present) == writes, "writer.py exists exactly when the backend accepts writes"
    # a full-then-incremental start of either kind: an exported snapshot or a chunked one (cdc.snapshots)
    snapshots = cls.snapshot is not Backend.snapshot or cls.chunked_snapshot is not Backend.chunked_snapshot
    assert ("snapshot.py" in present) == snapshots, "snapshot.py exists exactly when the backend offers snapshots"
    if snapshots:
        assert _imported_by_others(backend, "snapshot.py")
    command = _Main.lazy.get(backend.name)
    has_cli = command is not None and command[0].startswith(f"cdc.backends.{backend.name}.")
    assert ("cli.py" in present) == has_cli, "cli.py exists exactly when 'cdc <backend>' has tools"
    if has_cli:
        assert command is not None and command[0] == f"cdc.backends.{backend.name}.cli"
    outside = [c.__qualname__ for name, m in modules.items() if name != "errors.py" for c in _defined(m, CdcError)]
    assert not outside, f"{backend.name}: errors outside errors.py: {outside}"
    if "errors.py" in present:
        defined = _defined(modules["errors.py"], BaseException)
        assert defined and all(issubclass(c, CdcError) for c in defined), "errors.py: the backend's CdcErrors"
    if "records.py" in present:
        imports = _imports(backend / "records.py")
        # change-model records, made here or by the shared decoders of cdc.formats (Debezium's events)
        assert "cdc.model" in imports or any(i.startswith("cdc.formats.") for i in imports), (
            "records.py makes change-model records"
        )
        assert _imported_by_others(backend, "records.py")
    for role in ("connection.py", "positions.py"):
        if role in present:
            assert _imported_by_others(backend, role), f"{role} is the backend's {role.removesuffix('.py')}"
    assert set(ROLE_FILES).isdisjoint(REQUIRED_FILES)


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
