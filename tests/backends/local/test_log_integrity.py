"""A damaged or foreign local log fails loudly, naming the file and channel; what is not ours is ignored."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.backends.local import LocalLog
from cdc.backends.local.errors import CorruptLogError, LogFormatError

ROWS = 10  # rows per append, so segment i holds records [10 i, 10 i + 10) of c0


def three_segments(root: Path) -> LocalLog:
    log = LocalLog.create(root / "log", [("k", pa.int64()), ("v", pa.string())], ["k"], channels=1)
    for i in range(3):
        log.append([{"k": 1_000 * i + j, "v": f"v{i}"} for j in range(ROWS)])
    return log


def segment_files(log: LocalLog, channel: str = "c0") -> list[Path]:
    return sorted(p for p in (log.path / "channels" / channel).iterdir() if p.name.endswith(".arrow"))


def read_everything(path: Path) -> pa.Table:
    log = LocalLog(path)  # a fresh reader, as an executor would open it
    return log.read_all()


def assert_names(err: CorruptLogError, name: str) -> None:
    assert err.channel == "c0"
    assert err.file is not None and name in err.file
    assert name in str(err) and "c0" in str(err)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["first", "middle", "last"])
def test_a_deleted_segment_is_corruption_naming_the_gap(tmp_path: Path, which: int) -> None:
    log = three_segments(tmp_path)
    gone = segment_files(log)[which]
    gone.unlink()
    with pytest.raises(CorruptLogError) as err:
        read_everything(log.path)
    # The error names the missing records by their positions, whatever file held them.
    assert err.value.channel == "c0"
    assert f"[{which * ROWS}, {which * ROWS + ROWS})" in str(err.value)


def test_a_segment_rewritten_with_fewer_rows_is_corruption(tmp_path: Path) -> None:
    log = three_segments(tmp_path)
    middle = segment_files(log)[1]
    with pa.memory_map(str(middle), "r") as source:
        table = pa.ipc.open_file(source).read_all()
    with pa.OSFile(str(middle), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table.slice(0, 5))
    with pytest.raises(CorruptLogError) as err:
        read_everything(log.path)
    assert_names(err.value, middle.name)


def test_an_overlapping_segment_is_corruption(tmp_path: Path) -> None:
    log = three_segments(tmp_path)
    first = segment_files(log)[0]
    m = re.match(r"^(\d+)-(\d+)(.*)$", first.name)
    assert m is not None
    width = len(m.group(1))
    overlapping = first.with_name(f"{5:0{width}d}-{15:0{width}d}{m.group(3)}")
    shutil.copy(first, overlapping)
    with pytest.raises(CorruptLogError) as err:
        read_everything(log.path)
    assert_names(err.value, overlapping.name)


def test_a_truncated_segment_is_corruption_naming_it(tmp_path: Path) -> None:
    log = three_segments(tmp_path)
    last = segment_files(log)[2]
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptLogError) as err:
        read_everything(log.path)
    assert_names(err.value, last.name)


@settings(max_examples=40, deadline=None)
@given(which=st.integers(0, 2), where=st.floats(0, 1, exclude_max=True), xor=st.integers(1, 255))
def test_every_flipped_byte_is_detected(tmp_path_factory: pytest.TempPathFactory, which: int, where: float,
                                        xor: int) -> None:
    log = three_segments(tmp_path_factory.mktemp("flip"))
    target = segment_files(log)[which]
    data = bytearray(target.read_bytes())
    data[int(where * len(data))] ^= xor
    target.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as err:
        read_everything(log.path)
    assert_names(err.value, target.name)


def test_what_is_not_ours_is_ignored(tmp_path: Path) -> None:
    log = three_segments(tmp_path)
    (log.path / "channels" / "notes.txt").write_text("a stray file")
    (log.path / "channels" / "c99").mkdir()
    (log.path / "channels" / "c0" / "README").write_text("not a segment")
    (log.path / "channels" / "c0" / "000-bad.arrow").write_text("not a segment name")
    fresh = LocalLog(log.path)
    assert [c.id for c in fresh.channels()] == ["c0"]
    assert fresh.read_all().column("k").to_pylist() == [1_000 * i + j for i in range(3) for j in range(ROWS)]


def test_a_log_of_the_previous_format_is_refused_naming_its_version(tmp_path: Path) -> None:
    log = three_segments(tmp_path)
    meta = json.loads((log.path / "log.json").read_text())
    meta["format"] = 1
    (log.path / "log.json").write_text(json.dumps(meta))
    with pytest.raises(LogFormatError, match="format 1") as err:
        LocalLog(log.path)
    assert err.value.version == 1


def test_the_errors_pickle_with_their_fields() -> None:
    err = pickle.loads(pickle.dumps(CorruptLogError("bad", "channels/c0/x.arrow", "c0")))
    assert (str(err), err.file, err.channel) == ("bad", "channels/c0/x.arrow", "c0")
    fmt = pickle.loads(pickle.dumps(LogFormatError("old", 1)))
    assert (str(fmt), fmt.version) == ("old", 1)


def test_a_damaged_manifest_is_corruption_naming_it(tmp_path: Path) -> None:
    log = three_segments(tmp_path)
    manifest = log.path / "manifest.json"
    text = manifest.read_text()
    assert '"head": 30' in text
    manifest.write_text(text.replace('"head": 30', '"head": 20'))
    with pytest.raises(CorruptLogError, match="manifest.json") as err:
        read_everything(log.path)
    assert err.value.file is not None and err.value.file.endswith("manifest.json")


def test_a_reader_racing_a_truncation_sees_the_truncation_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = three_segments(tmp_path)
    reader = LocalLog(log.path)
    stale = reader.manifest()  # read just before another process truncates and removes the segments
    LocalLog(log.path).truncate("c0", 2 * ROWS)
    answers = iter([stale])
    current = reader.manifest
    monkeypatch.setattr(reader, "manifest", lambda: next(answers, None) or current())
    assert reader.channel("c0").earliest == 2 * ROWS
