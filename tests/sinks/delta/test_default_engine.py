"""engine='auto': which engine runs where (the choice the benchmark's figures justify, see the README)."""

from __future__ import annotations

from typing import Any

import pytest

import sinks.delta.session as engine_module
from cdc.errors import OptionError
from sinks.delta import DeltaUpsertSink
from sinks.delta.session import default_engine


class Session:
    """Only what default_engine asks a session: its master."""

    def __init__(self, master: str) -> None:
        self.conf = self
        self.master = master

    def get(self, key: str, default: Any = None) -> Any:
        return self.master if key == "spark.master" else default


@pytest.mark.parametrize(
    ("master", "jars", "pipelined", "expected"),
    [
        ("local[2]", True, False, "delta-rs"),
        ("local", True, False, "delta-rs"),
        ("spark://10.0.0.1:7077", True, False, "delta-spark"),
        ("yarn", True, False, "delta-spark"),
        ("spark://10.0.0.1:7077", False, False, "delta-rs"),  # no io.delta jars on the cluster's session
        ("spark://10.0.0.1:7077", True, True, "delta-rs"),  # pipelined mode is delta-rs's
    ],
)
def test_auto_picks_by_master(monkeypatch: pytest.MonkeyPatch, master: str, jars: bool, pipelined: bool, expected: str) -> None:
    monkeypatch.setattr(engine_module, "delta_jars_available", lambda _: jars)
    assert default_engine(Session(master), pipelined=pipelined) == expected


def test_auto_without_a_session_is_delta_rs() -> None:
    assert default_engine(None) == "delta-rs"
    assert DeltaUpsertSink("/tmp/x", keys=["id"], app_id="a").engine().name == "delta-rs"


def test_pipelined_delta_spark_is_refused() -> None:
    with pytest.raises(OptionError, match="pipelined"):
        DeltaUpsertSink("/tmp/x", keys=["id"], engine="delta-spark", pipelined=True)
