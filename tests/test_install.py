"""A user's install: extras, the errors a missing extra gives, the `cdc` command on a core install.

A missing extra is simulated in a subprocess by a meta-path finder that refuses the extra's modules (as if
pip had not installed them), so the rest of this environment stays as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc.cli import main

ROOT = Path(__file__).resolve().parents[1]

# The top-level modules each extra brings (what `pip install 'cdc-tunnel[<extra>]'` installs and the code imports).
EXTRA_MODULES: dict[str, list[str]] = {
    "postgres": ["psycopg"],
    "pulsar": ["pulsar", "pulsar_lite", "fastavro"],
    "tablestore": ["google.protobuf", "urllib3", "tablestore"],
    "delta": ["deltalake", "delta", "duckdb"],
    "monitor": ["prometheus_client"],
    "connect": ["grpc", "grpc_status", "zstandard"],
    "kafka": ["confluent_kafka"],
    "mysql": ["pymysql", "pymysqlreplication"],
}

_BLOCKER = """
import sys
from importlib.abc import MetaPathFinder

BLOCKED = {blocked!r}

class _Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""


def _run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess[str]:
    script = _BLOCKER.format(blocked=blocked) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)


ALL_EXTRAS = sorted({m for mods in EXTRA_MODULES.values() for m in mods})


def test_help_of_every_command_works_on_a_core_install() -> None:
    out = _run_without(ALL_EXTRAS, """
        import json
        import click
        from click.testing import CliRunner
        from cdc.cli import main

        def walk(group, path, ctx):
            yield path
            if isinstance(group, click.Group):
                for name in group.list_commands(ctx):
                    cmd = group.get_command(ctx, name)
                    if cmd is not None and not cmd.hidden:
                        yield from walk(cmd, [*path, name], click.Context(cmd, info_name=name, parent=ctx))

        results = {}
        for path in walk(main, [], click.Context(main, info_name="cdc")):
            r = CliRunner().invoke(main, [*path, "--help"])
            results[" ".join(path) or "cdc"] = [r.exit_code, r.output[-300:] + repr(r.exception)]
        print(json.dumps(results))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.splitlines()[-1])
    failed = {cmd: text for cmd, (code, text) in results.items() if code != 0}
    assert not failed, failed
    assert {"cdc", "server tablestore", "server pulsar", "pulsar drop-subscription", "postgres slots"} <= set(results)


# Each extra's first import site, as a user reaches it: the error names the extra to install.
FIRST_USE = {
    "postgres": ["from cdc.backend import backend_class; backend_class('postgres')",
                 "from click.testing import CliRunner; from cdc.cli import main; "
                 "r = CliRunner().invoke(main, ['postgres', 'slots', '--dsn', 'postgresql://x@127.0.0.1:1/db']); "
                 "print(r.output); raise SystemExit(r.exit_code)",
                 "from click.testing import CliRunner; from cdc.cli import main; "
                 "r = CliRunner().invoke(main, ['verify', 't', '/nowhere', '--dsn', 'postgresql://x@127.0.0.1:1/db']); "
                 "print(r.output); raise SystemExit(r.exit_code)"],
    "pulsar": ["from cdc.backend import open_backend; "
               "open_backend('pulsar', {'service.url': 'pulsar://127.0.0.1:1', 'topic': 't'})",
               "from cdc.backends.pulsar.connection import open_client; open_client('pulsar://127.0.0.1:1')",
               "from cdc.servers.pulsar.broker import pulsar_lite_binary; pulsar_lite_binary()",
               "from click.testing import CliRunner; from cdc.cli import main; "
               "r = CliRunner().invoke(main, ['pulsar', 'drop-subscription', '--service-url', 'pulsar://127.0.0.1:1', "
               "'--topics', 't']); print(r.output); raise SystemExit(r.exit_code)"],
    "tablestore": ["from cdc.backend import backend_class; backend_class('tablestore')",
                   "from cdc.backends.tablestore.scan_source import TablestoreTableSource; "
                   "TablestoreTableSource({'endpoint': 'http://127.0.0.1:1', 'instance.name': 'i', "
                   "'table.name': 't', 'access.key.id': 'a', 'access.key.secret': 's'}).planner",
                   "from cdc.servers.tablestore import LocalTablestore"],
    "delta": ["from sinks.delta import DeltaUpsertSink",
              "from click.testing import CliRunner; from cdc.cli import main; "
              "r = CliRunner().invoke(main, ['verify', 't', '/nowhere', '--dsn', 'postgresql://x@127.0.0.1:1/db']); "
              "print(r.output); raise SystemExit(r.exit_code)"],
    "monitor": ["import cdc.monitor"],
    "mysql": ["from cdc.backend import backend_class; backend_class('mysql')",
              "from cdc.servers.mysql.process import MariaDBServer; MariaDBServer.root(None)"],
}


@pytest.mark.parametrize("extra", sorted(FIRST_USE))
def test_a_missing_extra_fails_naming_the_extra_never_a_bare_module_error(extra: str) -> None:
    # Every first use of the extra in one interpreter (a failed import leaves nothing behind in sys.modules).
    cases = "".join(f"""
try:
    {use}
    print("NO ERROR")
except BaseException as exc:
    from cdc.errors import MissingExtraError
    print(type(exc).__name__, isinstance(exc, MissingExtraError), str(exc).replace(chr(10), " "))
print("---")
""" for use in FIRST_USE[extra])
    out = _run_without(EXTRA_MODULES[extra], cases)
    assert out.returncode == 0, out.stderr[-3000:]
    reports = out.stdout.split("---")[:-1]
    assert len(reports) == len(FIRST_USE[extra])
    for use, text in zip(FIRST_USE[extra], reports, strict=True):
        assert f"pip install 'cdc-tunnel[{extra}]'" in text, (use, text[-2000:])
        assert "Traceback" not in text and "ModuleNotFoundError" not in text, (use, text[-2000:])


def test_cdc_version() -> None:
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"cdc-tunnel {version('cdc-tunnel')}"


def test_cdc_offsets_takes_the_checkpoint_uris_cdc_status_takes(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    offset = {"channels": {"c0": {"pos": 5, "from": 0}}, "initial": True}
    (ck / "offsets" / "0").write_text("v1\n{\"batchWatermarkMs\":0,\"batchTimestampMs\":0}\n" + json.dumps(offset))
    (ck / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    out = CliRunner().invoke(main, ["offsets", ck.as_uri(), "--starting-offsets"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"c0": 5}
    missing = CliRunner().invoke(main, ["offsets", (tmp_path / "nothing").as_uri()])
    assert missing.exit_code == 1 and "Traceback" not in missing.output and missing.output.startswith("Error:")


def test_secrets_of_commands_come_from_a_file_or_the_environment_named_in_help(tmp_path: Path) -> None:
    helps = {
        ("pulsar", "drop-subscription"): "PULSAR_AUTH_TOKEN",
        ("server", "tablestore"): "CDC_TABLESTORE_ACCESS_KEY_SECRET",
        ("postgres", "slots"): "CDC_POSTGRES_DSN",
        ("status",): "--option-from-file",
    }
    for path, name in helps.items():
        out = CliRunner().invoke(main, [*path, "--help"])
        assert out.exit_code == 0 and name in out.output, (path, out.output)
    assert "--auth-token " not in CliRunner().invoke(main, ["pulsar", "drop-subscription", "--help"]).output


def test_every_option_of_every_command_has_help_text() -> None:
    import click

    missing = []

    def walk(cmd: click.Command, path: list[str], ctx: click.Context) -> None:
        for p in cmd.get_params(ctx):
            if isinstance(p, click.Option) and p.name not in ("help", "version") and not p.hidden and not p.help:
                missing.append(f"{' '.join(path)} {p.opts[0]}")
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))

    walk(main, ["cdc"], click.Context(main, info_name="cdc"))
    assert not missing, missing
