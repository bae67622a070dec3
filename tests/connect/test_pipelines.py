"""Spark Declarative Pipelines (pyspark 4.2's ``spark-pipelines``): ``examples/pipelines/orders`` streams
``format("cdc")`` into a table and derives the orders table from it, end to end; the table equals the
source. ``examples/pipelines/orders_auto_cdc`` (``create_auto_cdc_flow``) is analysed by a dry run: pyspark
4.2.1 has no MERGE-capable catalog target here (parquet and Delta 4.4 both refuse AUTO CDC)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdc.backends.local import LocalLog
from cdc.servers.spark import python_env, spark_home

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "pipelines"
sys.path.insert(0, str(ROOT / "examples"))
from orders_demo import SCHEMA, OrderSource  # noqa: E402

pytestmark = pytest.mark.slow

# pyspark 4.2.1's spark-pipelines client exits with this after "Run is COMPLETED" when a flow read a Python data
# source: the read's (empty) Python accumulator update reaches the client as observed metrics of the
# run-events stream, which its event loop does not expect. The run itself has completed by then.
CLIENT_BUG = "[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__"


def _project(tmp_path: Path, name: str) -> tuple[Path, OrderSource]:
    """A copy of the example with its storage in ``tmp_path`` and a change log of orders beside it."""
    project = tmp_path / name
    shutil.copytree(EXAMPLES / name, project)
    spec = project / "spark-pipeline.yaml"
    text = spec.read_text()
    storage = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("storage: "))
    spec.write_text(text.replace(storage, (tmp_path / f"{name}-storage").as_uri()))
    log = LocalLog.create(project / "demo-output" / "orders-log", SCHEMA, keys=["order_id"], channels=2)
    source = OrderSource(log, seed=5)
    for _ in range(4):
        source.burst(250)  # inserts, updates and deletes
    return project, source


def _pipelines(project: Path, command: str) -> str:
    env = python_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    run = subprocess.run([str(spark_home() / "bin" / "spark-pipelines"), command, "--spec", "spark-pipeline.yaml"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    if command == "run" and run.returncode != 0:
        assert "Run is COMPLETED" in output and CLIENT_BUG in output, output[-4000:]
    else:
        assert run.returncode == 0, output[-4000:]
    assert "Importing" in output  # the definitions file loaded (cdc.register ran inside the pipeline)
    return output


def test_the_orders_pipeline_applies_the_change_log(tmp_path: Path) -> None:
    project, source = _project(tmp_path, "orders")
    _pipelines(project, "run")
    tables = [p for p in (project / "spark-warehouse").rglob("orders") if p.is_dir()]
    assert len(tables) == 1, tables
    rows = pq.read_table(tables[0]).to_pylist()  # a plain parquet table: the pipeline's default format
    assert {r["order_id"]: r for r in rows} == source.rows


def test_the_auto_cdc_pipeline_is_valid(tmp_path: Path) -> None:
    project, _ = _project(tmp_path, "orders_auto_cdc")
    _pipelines(project, "dry-run")
