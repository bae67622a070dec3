"""Reading a query's positions from its Spark checkpoint (``cdc offsets``), on offset files laid out the way
Spark's OffsetSeqLog writes them. The offset-recovery example runs the same code against a real query."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc.checkpoint import CheckpointError, last_committed, read_batch, starting_offsets
from cdc.cli import main


def _write(ck: Path, batch: int, offset: dict | None, committed: bool) -> None:
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    (ck / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    lines = ["v1", json.dumps(meta), "-" if offset is None else json.dumps(offset)]
    (ck / "offsets" / str(batch)).write_text("\n".join(lines))
    (ck / "offsets" / f".{batch}.crc").write_text("")
    if committed:
        (ck / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_last_committed_skips_a_planned_batch(tmp_path: Path) -> None:
    _write(tmp_path, 0, {"channels": {"c0": {"pos": 5, "from": 0}}, "initial": True}, True)
    _write(tmp_path, 1, {"channels": {"c0": {"pos": 9, "done": True}, "c1": {"pos": 3, "from": 0}}}, True)
    _write(tmp_path, 2, {"channels": {"c0": {"pos": 9, "done": True}, "c1": {"pos": 7}}}, False)
    assert read_batch(tmp_path).batch_id == 2 and not read_batch(tmp_path).committed
    batch = last_committed(tmp_path)
    assert batch.batch_id == 1 and batch.committed
    assert starting_offsets(batch.source()) == {"c0": 9, "c1": 3}


def test_a_half_read_snapshot_cannot_seed_a_new_query(tmp_path: Path) -> None:
    _write(tmp_path, 0, {"channels": {"snap-1-0": {"pos": 2, "snapshot": True}, "c0": {"pos": 4}}}, True)
    with pytest.raises(CheckpointError, match="inside a snapshot"):
        starting_offsets(last_committed(tmp_path).source())
    _write(tmp_path, 1, {"channels": {"snap-1-0": {"pos": 3, "snapshot": True, "done": True}, "c0": {"pos": 6}}}, True)
    assert starting_offsets(last_committed(tmp_path).source()) == {"c0": 6}


def test_errors_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no offset log"):
        read_batch(tmp_path)
    _write(tmp_path, 0, None, False)
    with pytest.raises(CheckpointError, match="no committed batch"):
        last_committed(tmp_path)
    with pytest.raises(CheckpointError, match="not a cdc source"):
        read_batch(tmp_path, 0).source()
    with pytest.raises(CheckpointError, match="batch 4 is not in the offset log"):
        read_batch(tmp_path, 4)


def test_cli_prints_positions_and_starting_offsets(tmp_path: Path) -> None:
    _write(tmp_path, 0, {"channels": {"c0": {"pos": 5, "done": True}, "c1": {"pos": 2}}}, True)
    _write(tmp_path, 1, {"channels": {"c0": {"pos": 5, "done": True}, "c1": {"pos": 8}}}, False)
    runner = CliRunner()
    shown = runner.invoke(main, ["offsets", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "batch 0 (committed)" in shown.output and "last batch in the offset log: 1" in shown.output
    assert '{"channel": "c0", "pos": 5, "flags": ["done"]}' in shown.output
    start = runner.invoke(main, ["offsets", str(tmp_path), "--starting-offsets"])
    assert json.loads(start.output) == {"c0": 5, "c1": 2}
    missing = runner.invoke(main, ["offsets", str(tmp_path), "--batch", "7"])
    assert missing.exit_code != 0 and "batch 7 is not in the offset log" in missing.output
