"""Errors cross the driver/executor boundary: every cdc error pickles with every attribute."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import cdc
from cdc.errors import CdcError, DataLossError, OptionError, TerminalError


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(cdc.__path__, "cdc.") if not m.name.endswith("__main__"))


def _error_classes() -> list[type[CdcError]]:
    for name in _modules():
        importlib.import_module(name)
    seen: dict[str, type[CdcError]] = {}
    todo: list[type[CdcError]] = [CdcError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] == "cdc":
            seen[f"{cls.__module__}.{cls.__qualname__}"] = cls
        todo.extend(cls.__subclasses__())
    return [seen[k] for k in sorted(seen)]


def _overrides_the_rule(cls: type) -> str | None:
    for base in cls.__mro__:
        if base is CdcError:
            return None
        if "__reduce__" in vars(base):
            return f"{base.__module__}.{base.__qualname__}"
    return None


def _cases() -> list[object]:
    return [pytest.param(cls, id=cls.__qualname__) for cls in _error_classes()]


def test_one_pickling_rule_no_error_overrides_it() -> None:
    owners = {owner for cls in _error_classes() if (owner := _overrides_the_rule(cls))}
    assert not owners, f"these define their own __reduce__ and would drop attributes: {sorted(owners)}"


def test_the_walk_finds_the_errors_of_the_core_backends_and_servers() -> None:
    names = {cls.__qualname__ for cls in _error_classes()}
    assert {"CheckpointError", "OffsetError", "BrokerError", "TrimmedDataError", "PlainBufferError"} <= names


@pytest.mark.parametrize("cls", _cases())
def test_every_error_pickles_with_every_attribute(cls: type[CdcError]) -> None:
    err = cls.__new__(cls, "boom: channel 'c0'")
    err.__dict__.update({"channel": "c0", "extra": {"positions": [1, 2]}})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err) and back.args == err.args
    assert back.__dict__ == err.__dict__


def test_constructor_arguments_and_later_attributes_both_survive() -> None:
    err = OptionError("option 'x': bad", "x")
    err.hint = "try y"
    back = pickle.loads(pickle.dumps(err))
    assert (back.option, back.hint, str(back)) == ("x", "try y", "option 'x': bad")
    assert isinstance(back, ValueError)
    lost = pickle.loads(pickle.dumps(DataLossError("gone", "c3")))
    assert lost.channel == "c3"


class _NeedsTable(TerminalError):
    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


def test_a_subclass_whose_constructor_needs_more_than_the_message_still_pickles() -> None:
    back = pickle.loads(pickle.dumps(_NeedsTable("no such table", table="orders")))
    assert (str(back), back.table) == ("no such table", "orders")


def test_trimmed_data_error_keeps_its_channel_across_pickling() -> None:
    from cdc.backends.tablestore.errors import TrimmedDataError, error_for

    err = error_for("OTSTrimmedDataAccess", "records expired", 400, "req-1")
    assert isinstance(err, TrimmedDataError)
    err.channel = "8d1f-0"
    back = pickle.loads(pickle.dumps(err))
    assert (back.channel, back.code, back.http_status, back.request_id) == ("8d1f-0", err.code, 400, "req-1")


def test_checkpoint_errors_are_cdc_errors_and_still_value_errors() -> None:
    from cdc.checkpoint import CheckpointError

    assert issubclass(CheckpointError, TerminalError) and issubclass(CheckpointError, ValueError)
