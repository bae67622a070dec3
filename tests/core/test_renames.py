"""Names that moved keep working for one release, with a DeprecationWarning that names the new place; and the
options that change meaning (a read or write without ``backend``) warn the same way."""

from __future__ import annotations

import importlib
import warnings

import pytest

from cdc.backend import backend_class
from cdc.source import _Config, named_backend

MOVED = [
    ("cdc.backends.postgres.slot", "peek", "cdc.backends.postgres.connection"),
    ("cdc.backends.pulsar.client", "open_client", "cdc.backends.pulsar.connection"),
    ("cdc.backends.pulsar.codec", "Decoder", "cdc.backends.pulsar.records"),
    ("cdc.backends.pulsar.debezium", "value_of", "cdc.formats.debezium"),
    ("cdc.backends.pulsar.debezium", "TruncateError", "cdc.errors"),
    ("cdc.backends.pulsar.debezium", "SchemaChangedError", "cdc.errors"),
    ("cdc.backends.postgres.errors", "SchemaChangedError", "cdc.errors"),
    ("cdc.backends.tablestore.client", "TunnelClient", "cdc.backends.tablestore.connection"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_a_moved_name_still_resolves_and_warns(old: str, name: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{new.replace('.', '[.]')}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


def test_the_new_places_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _, name, new in MOVED:
            getattr(importlib.import_module(new), name)
        import cdc.backends.tablestore as tablestore

        assert tablestore.TunnelClient is importlib.import_module("cdc.backends.tablestore.connection").TunnelClient


def test_a_read_without_backend_still_reads_the_local_log_and_warns(tmp_path: object) -> None:
    with pytest.warns(FutureWarning, match=r"read of format\('cdc'\) without option 'backend' uses backend 'local'"):
        config = _Config({"path": str(tmp_path)})
    assert config.backend_cls is backend_class("local")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert named_backend({"BACKEND": "pulsar"}, "write") is backend_class("pulsar")
