"""The documentation's generated parts stay complete: every public error class has a troubleshooting entry,
every option a description, and `cdc options` prints the tables the site shows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from cdc.backend import BACKEND_OPTIONS, option_tables, options_model
from cdc.options import describe_options, options_markdown

ROOT = Path(__file__).resolve().parents[2]


def _macros() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cdc_docs_macros", ROOT / "docs" / "macros.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


macros = _macros()


def test_every_public_error_class_has_a_troubleshooting_entry_and_no_entry_is_stale() -> None:
    missing, stale = macros.missing_error_entries()
    assert not missing, f"add a cause and fix for these to docs/operations/errors.yml: {missing}"
    assert not stale, f"docs/operations/errors.yml names classes that no longer exist: {stale}"


def test_the_error_walk_finds_errors_of_every_area_including_subclasses_of_subclasses() -> None:
    found = {(e.area, e.name) for e in macros.public_errors()}
    assert {("core", "OptionError"), ("core", "MissingExtraError"), ("delta", "SchemaEvolutionError"),
            ("tablestore", "TunnelServerUnavailableError"), ("postgres", "NoPrimaryKeyError")} <= found
    assert not any(area == "core" and name.startswith("_") for area, name in found)


def test_error_entries_name_their_cause_and_fix() -> None:
    for area, names in macros.load_error_entries().items():
        for name, entry in names.items():
            assert set(entry) == {"cause", "fix"} and all(v.strip() for v in entry.values()), (area, name)


MODELS = [*BACKEND_OPTIONS, "cdc.backends.pulsar.options:PulsarSinkOptions", "cdc.backends.tablestore.scan:ScanOptions",
          "sinks.delta:DeltaUpsertSink"]


@pytest.mark.parametrize("name", ["source", *MODELS])
def test_every_option_has_a_description_and_a_type(name: str) -> None:
    table = macros.options_table(name)
    rows = [line for line in table.splitlines()[2:]]
    assert rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1] and cells[5], f"option {cells[0]} of {name} has no type or no description"


def test_cdc_options_prints_the_tables_the_site_shows() -> None:
    from cdc.cli import main

    out = CliRunner().invoke(main, ["options", "postgres"])
    assert out.exit_code == 0, out.output
    for _, rows in option_tables("postgres"):
        assert options_markdown(rows) in out.output
    assert options_markdown(describe_options(options_model("postgres"))) in macros.options_table("postgres")
    assert "`backend` | one of `kafka`, `local`, `mysql`, `postgres`" in out.output


def test_defaults_are_written_one_way() -> None:
    rows = {r.name: r for r in describe_options(options_model("pulsar"))}
    assert rows["acknowledge"].default == "true" and rows["tls.allowInsecureConnection"].default == "false"
    assert rows["admin.url"].default == "" and not rows["admin.url"].required
    assert rows["service.url"].required and rows["service.url"].default == ""
    assert rows["valueFormat"].type == "one of `bytes`, `json`, `avro`, `debezium`"
    assert rows["auth.token"].type == "string (secret)"


def test_the_performance_page_is_made_from_the_records_benchmarks_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from record import append_record
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setenv("CDC_BENCH_RESULTS", str(tmp_path))
    append_record("source_overhead", {"cdc batch": (1.5e6, "rows/s"), "parquet": (1.6e6, "rows/s")}, ratio=0.9375,
                  target=">= 0.8", params={"rows": 1000})
    append_record("source_overhead", {"cdc batch": (1.2e6, "rows/s")}, ratio=0.75, params={"rows": 1000})
    lines = (tmp_path / "source_overhead.jsonl").read_text().splitlines()
    assert len(lines) == 2 and {"load", "cores", "date", "figures", "ratio"} <= set(json.loads(lines[0]))
    page = macros.performance_tables(folder=tmp_path)
    assert "| date (UTC) | cdc batch | parquet | ratio | target | load (1 min) | cores |" in page
    assert "1,500.0k rows/s" in page and "**0.938**" in page and "**0.750**" in page and "<svg" in page
    monkeypatch.setenv("CDC_BENCH_RESULTS", "")
    assert append_record("x", {"a": 1.0}) is None
