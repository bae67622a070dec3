"""Every code block of the README and the documentation site is checked by a test.

- Blocks included from a file (``--8<-- "name"``, from docs/snippets/ or examples/) are run: the local log
  example here, its output compared; the PostgreSQL set-up SQL against a real server (below); the quickstart
  by tests/test_wheel.py, in a fresh install, its output compared.
- Python written inline: compiled, its imports run, and every ``.option(...)`` given to ``format("cdc")`` or
  ``format("tablestore")`` checked against the options models (an option renamed in the code fails here).
- Shell lines: ``cdc ...`` parsed by the click commands themselves (the command, its options and arguments
  must exist), ``pip install`` extras must be declared, ``make`` targets must exist; other tools' lines
  (spark-submit, pulsar-admin, ...) are listed below.
- JSON must parse; SQL must come from a snippet file (it is run).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from cdc.backend import options_model
from cdc.options import SourceOptions, accepted_options

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
INCLUDE = re.compile(r'^--8<-- "(?P<name>[^"]+)"$')

# Snippet files and the test that runs each.
RUN_BY = {
    "quickstart.py": "tests/test_wheel.py",
    "quickstart.out": "tests/test_wheel.py",
    "local_log.py": "test_the_local_log_snippet_runs_and_prints_its_documented_output",
    "local_log.out": "test_the_local_log_snippet_runs_and_prints_its_documented_output",
    "postgres_setup.sql": "test_the_postgres_set_up_sql_lets_the_role_read_changes",
    "postgres_replica_identity.sql": "test_the_replica_identity_sql_makes_updates_whole_rows",
}
# Shell lines of other tools, shown as they are run against systems the tests cannot reach as such.
OTHER_TOOLS = ("spark-submit", "bin/pulsar-admin", "cd ", "PYSPARK_PYTHON=", "  --", "  my_pipeline.py")


def blocks() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            body = "\n".join(line[len(m["indent"]):] for line in m["body"].splitlines())
            out.append((str(page.relative_to(ROOT)), m["lang"], body))
    return out


BLOCKS = blocks()


def _id(block: tuple[str, str, str]) -> str:
    return f"{block[0]}:{block[1]}:{BLOCKS.index(block)}"


def test_pages_have_code_blocks() -> None:
    assert len(BLOCKS) > 30 and {lang for _, lang, _ in BLOCKS} >= {"python", "bash", "text", "sql"}


@pytest.mark.parametrize("block", [b for b in BLOCKS if INCLUDE.match(b[2].strip())], ids=_id)
def test_included_snippets_exist_and_are_run_by_a_test(block: tuple[str, str, str]) -> None:
    m = INCLUDE.match(block[2].strip())
    assert m is not None
    name = m["name"]
    assert (ROOT / "docs" / "snippets" / name).exists() or (ROOT / "examples" / name).exists(), name
    assert name in RUN_BY, f"{name} is included in {block[0]} but no test runs it"


def _option_calls(tree: ast.AST) -> list[tuple[str, dict[str, Any]]]:
    """(format, {option: value or None}) for each statement that reads with format("cdc"/"tablestore")."""
    found = []
    for stmt in ast.walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.Expr)):
            continue
        calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        formats = [c.args[0].value for c in calls if c.func.attr == "format" and c.args  # type: ignore[attr-defined]
                   and isinstance(c.args[0], ast.Constant)]
        names = {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute)}
        if not formats or formats[0] not in ("cdc", "tablestore") or "writeStream" in names or "write" in names:
            continue
        options: dict[str, Any] = {}
        for c in calls:
            if c.func.attr == "option" and c.args and isinstance(c.args[0], ast.Constant):  # type: ignore[attr-defined]
                value = c.args[1].value if len(c.args) > 1 and isinstance(c.args[1], ast.Constant) else None
                options[str(c.args[0].value)] = value
        found.append((formats[0], options))
    return found


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "python" and not INCLUDE.match(b[2].strip())],
                         ids=_id)
def test_inline_python_compiles_imports_and_names_real_options(block: tuple[str, str, str]) -> None:
    page, _, code = block
    tree = ast.parse(code, filename=page)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            exec(compile(ast.Module(body=[node], type_ignores=[]), page, "exec"), {})  # noqa: S102
    for fmt, options in _option_calls(tree):
        if fmt == "tablestore":
            from cdc.backends.tablestore.scan import ScanOptions

            accepted = set(accepted_options(ScanOptions))
            prefixes: tuple[str, ...] = ()
        else:
            backend = options.get("backend") or "local"
            model = options_model(str(backend))
            accepted = set(accepted_options(SourceOptions)) | set(accepted_options(model))
            prefixes = tuple(getattr(model, "passthrough", {}))
        for key in options:
            k = key.lower()
            assert k in accepted or k.startswith(prefixes), f"{page}: option {key!r} of format({fmt!r}) does not exist"


def _cdc_invocation(args: list[str]) -> None:
    """Parse ``cdc <args>`` with the click commands, without running anything."""
    from cdc.cli import main

    ctx = main.make_context("cdc", list(args))
    cmd: click.Command = main
    while isinstance(cmd, click.Group) and (ctx.protected_args or ctx.args):
        name, sub, rest = cmd.resolve_command(ctx, [*ctx.protected_args, *ctx.args])
        assert sub is not None, args
        ctx = sub.make_context(name or "", rest, parent=ctx)
        cmd = sub


def _shell_lines(body: str) -> list[str]:
    lines, current = [], ""
    for raw in body.splitlines():
        line = raw.split("  #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        current += line.rstrip("\\")
        if not line.endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    return lines


def _pytest_invocation(page: str, args: list[str]) -> None:
    """A documented pytest run names test paths that exist and plugins the project installs."""
    targets = [a for a in args if a.startswith("tests")]
    assert targets, (page, args)
    for target in targets:
        assert (ROOT / target.split("::")[0]).exists(), f"{page}: no such test path {target!r}"
    if "-n" in args:
        assert importlib.util.find_spec("xdist") is not None, "pytest-xdist is not installed"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "bash"], ids=_id)
def test_shell_lines_are_real_commands(block: tuple[str, str, str]) -> None:
    page, _, body = block
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for line in _shell_lines(body):
        words = shlex.split(line.split(" | ")[0])
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
            words = words[1:]
        if words[:3] == [".venv/bin/python", "-m", "pytest"]:
            _pytest_invocation(page, words[3:])
        elif words[0] == ".venv/bin/python" and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), f"{page}: no such script {words[1]!r}"
        elif words[0] == "cdc":
            _cdc_invocation(words[1:])
        elif words[:2] == ["pip", "install"]:
            for spec in words[2:]:
                if spec.startswith("cdc-tunnel["):
                    assert set(spec[len("cdc-tunnel["):-1].split(",")) <= extras, (page, spec)
                else:
                    assert spec.startswith("--") or "==" in spec, (page, spec)
        elif words[0] == "make":
            assert words[1] in targets, (page, line)
        else:
            assert line.startswith(OTHER_TOOLS), f"{page}: a shell line no test checks: {line!r}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "json"], ids=_id)
def test_json_blocks_parse(block: tuple[str, str, str]) -> None:
    json.loads(block[2])


def test_sql_is_only_shown_from_snippet_files_that_run() -> None:
    inline = [(p, b) for p, lang, b in BLOCKS if lang == "sql" and not INCLUDE.match(b.strip())]
    assert not inline


def test_the_local_log_snippet_runs_and_prints_its_documented_output() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "snippets" / "local_log.py")],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout == (ROOT / "docs" / "snippets" / "local_log.out").read_text()


def test_the_postgres_set_up_sql_lets_the_role_read_changes(postgres_server: Any, postgres_dsn: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from cdc.backend import open_backend

    database = str(conninfo_to_dict(postgres_dsn)["dbname"])
    # The page's database is `shop` and its role `cdc` (the test server's own superuser is called cdc).
    setup = (ROOT / "docs" / "snippets" / "postgres_setup.sql").read_text().replace("DATABASE shop", f"DATABASE {database}")
    setup = re.sub(r"\bcdc\b", "cdc_docs_role", setup)
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text)")
        admin.execute("CREATE TABLE customers (id bigint PRIMARY KEY, name text)")
        admin.execute("DROP ROLE IF EXISTS cdc_docs_role")
        admin.execute(setup)  # type: ignore[call-overload]
    as_cdc = make_conninfo(postgres_dsn, user="cdc_docs_role", password="change-me")
    backend = open_backend("postgres", {"dsn": as_cdc, "tables": "public.orders,public.customers",
                                        "publication.name": "cdc_shop", "slot.name": "cdc_docs"})
    try:
        backend.prepare_start()  # the role creates its replication slot
        start = backend.latest("changes")
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("INSERT INTO orders VALUES (1, 'new')")
        planned = backend.plan("changes", start, None, backend.latest("changes"))
        rows = [b for b in backend.reader().read("changes", start, planned.end)]
        assert sum(b.num_rows for b in rows) == 1
    finally:
        backend.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_drop_replication_slot('cdc_docs')")
            admin.execute("DROP PUBLICATION cdc_shop")
            admin.execute("DROP OWNED BY cdc_docs_role")
            admin.execute("DROP ROLE cdc_docs_role")


def test_the_replica_identity_sql_makes_updates_whole_rows(postgres_dsn: str) -> None:
    """The page's statements set FULL and show it; an update that leaves a TOASTed value alone is then read
    as a whole row (``_unchanged`` empty)."""
    import psycopg

    from cdc.backend import open_backend

    sql = (ROOT / "docs" / "snippets" / "postgres_replica_identity.sql").read_text()
    big = "".join(chr(65 + (i * 7919) % 26) for i in range(20_000))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, note text)")
        conn.execute("INSERT INTO orders VALUES (1, 'new', %s)", (big,))
        backend = open_backend("postgres", {"dsn": postgres_dsn, "tables": "public.orders", "slot.name": "docs_ri"})
        try:
            backend.prepare_start()
            start = backend.latest("changes")
            alter, select = [s for s in sql.split(";") if s.strip()][:2]
            conn.execute(alter)  # type: ignore[call-overload]
            assert conn.execute(select).fetchall() == [("orders", "f")]  # type: ignore[call-overload]
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
            planned = backend.plan("changes", start, None, backend.latest("changes"))
            rows = [r for b in backend.reader().read("changes", start, planned.end) for r in b.to_pylist()]
            assert [(r["status"], r["note"] == big, r["_unchanged"]) for r in rows] == [("paid", True, None)]
        finally:
            backend.close()
            conn.execute("SELECT pg_drop_replication_slot('docs_ri')")


def test_block_languages_are_ones_a_test_checks() -> None:
    # text blocks are outputs and illustrations (a terminal table, a directory tree), not code.
    assert {lang for _, lang, _ in BLOCKS} <= {"python", "bash", "json", "sql", "text", "properties"}


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "properties"], ids=_id)
def test_debezium_configuration_is_the_one_the_real_debezium_tests_run(block: tuple[str, str, str]) -> None:
    engine = (ROOT / "tests" / "debezium" / "engine.py").read_text() + "".join(
        p.read_text() for p in (ROOT / "tests" / "debezium" / "engine").rglob("*.java"))
    for line in block[2].splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert f"{key}=" in engine or f'"{key}"' in engine, f"{block[0]}: {key} is not set by tests/debezium"
            if "{" not in value and key not in ("table.include.list", "converter.schemas.enable",
                                                 "provide.transaction.metadata"):
                assert f"{key}={value}" in engine, f"{block[0]}: {key}={value} is not what tests/debezium runs"
