from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from cdc.errors import DataLossError, OptionError
from cdc.model import ChangeSchema
from cdc.options import BackendOptions, Field, SecretStr, parse
from cdc.source import _Config


def test_change_schema_arrow_and_spark_agree_exactly() -> None:
    cs = ChangeSchema.of(
        [
            ("id", pa.int64()),
            ("region", pa.string()),
            ("amount", pa.float64()),
            ("qty", pa.int32()),
            ("paid", pa.bool_()),
            ("at", pa.timestamp("ms", tz="Asia/Shanghai")),
            ("price", pa.decimal128(12, 2)),
            ("day", pa.date32()),
            ("blob", pa.large_binary()),
        ],
        ["id", "region"],
    )
    assert to_arrow_schema(cs.spark(), timezone="UTC") == cs.arrow()
    assert cs.arrow().field("id").nullable is False
    assert cs.arrow().field("amount").nullable is True
    assert cs.arrow().field("at").type == pa.timestamp("us", tz="UTC")
    assert ChangeSchema.from_json(cs.to_json()) == cs


def test_partial_change_schema_adds_unchanged_and_agrees_with_spark() -> None:
    cs = ChangeSchema.of([("id", pa.int64()), ("name", pa.string())], ["id"], partial=True)
    assert cs.arrow().names == ["_op", "_seq", "_commit_ts", "_channel", "_position", "_unchanged", "id", "name"]
    assert to_arrow_schema(cs.spark(), timezone="UTC") == cs.arrow()
    assert ChangeSchema.from_json(cs.to_json()) == cs
    assert "_unchanged" not in ChangeSchema.of([("id", pa.int64())], ["id"]).arrow().names


def test_key_changes_add_the_old_key_struct_in_key_order_and_agree_with_spark() -> None:
    cs = ChangeSchema.of([("a", pa.int32()), ("b", pa.large_string()), ("v", pa.string())], ["b", "a"],
                         partial=True, key_changes=True)
    assert cs.arrow().names == ["_op", "_seq", "_commit_ts", "_channel", "_position", "_unchanged", "_old_key",
                                "a", "b", "v"]
    assert cs.arrow().field("_old_key").type == pa.struct(
        [pa.field("b", pa.string()), pa.field("a", pa.int32())])
    assert cs.arrow().field("_old_key").nullable
    assert to_arrow_schema(cs.spark(), timezone="UTC") == cs.arrow()
    assert ChangeSchema.from_json(cs.to_json()) == cs


@pytest.mark.parametrize(
    ("table", "keys", "message"),
    [
        ([("id", pa.int64())], [], "at least one key"),
        ([("id", pa.int64())], ["nope"], "not a column"),
        ([("_seq", pa.int64())], ["_seq"], "collide"),
        ([("id", pa.int64()), ("_unchanged", pa.string())], ["id"], "collide"),
        ([("id", pa.int64()), ("_old_key", pa.string())], ["id"], "collide"),
        ([("id", pa.int64()), ("t", pa.timestamp("us"))], ["id"], "naive timestamps"),
        ([("id", pa.int64()), ("l", pa.list_(pa.int64()))], ["id"], "not supported"),
    ],
)
def test_change_schema_rejects(table: list, keys: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChangeSchema.of(table, keys)


def test_unknown_option_names_it_and_lists_accepted() -> None:
    with pytest.raises(OptionError) as e:
        _Config({"backend": "local", "path": "/x", "maxRecordsPerTriger": "3"})
    assert "'maxRecordsPerTriger'" in str(e.value) and "maxRecordsPerTrigger" in str(e.value)
    assert e.value.option == "maxRecordsPerTriger"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"backend": "local", "path": "/x", "maxRecordsPerTrigger": "-3"}, "'maxRecordsPerTrigger'"),
        ({"backend": "local", "path": "/x", "maxrecordspertrigger": "many"}, "'maxRecordsPerTrigger'"),
        ({"backend": "local", "path": "/x", "maxBytesPerTrigger": "0"}, "'maxBytesPerTrigger'"),
        ({"backend": "local", "path": "/x", "maxBytesPerTrigger": "1MB"}, "'maxBytesPerTrigger'"),
        ({"backend": "local", "path": "/x", "failOnDataLoss": "maybe"}, "accepted values: true, false"),
        ({"backend": "kinesis"}, "accepted values: kafka, local, mysql, postgres, pulsar, tablestore"),
        ({"backend": "local"}, "option 'path' is required"),
    ],
)
def test_invalid_options(raw: dict, fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment):
        _Config(raw)


def test_options_are_case_insensitive() -> None:
    cfg = _Config({"Backend": "local", "PATH": "/x", "maxrecordspertrigger": "7", "FAILONDATALOSS": "false"})
    assert cfg.source.max_records_per_trigger == 7
    assert cfg.source.fail_on_data_loss is False


class _WithSecret(BackendOptions):
    key: SecretStr = Field(alias="access.key.secret")
    n: int = Field(1, alias="n")


def test_secrets_never_show() -> None:
    opts = parse(_WithSecret, {"access.key.secret": "hunter2"}, what="test")
    assert "hunter2" not in repr(opts) and "hunter2" not in str(opts)
    with pytest.raises(OptionError) as e:
        parse(_WithSecret, {"access.key.secret": "hunter2", "n": "x"}, what="test")
    assert "hunter2" not in str(e.value)


@pytest.mark.parametrize("value", [["x", "TOPSECRET-1"], {"k": "TOPSECRET-1"}, 7.5])
def test_a_secret_of_the_wrong_type_is_not_echoed(value: object) -> None:
    """pydantic reports errors under the option name (the alias), not the field name."""
    with pytest.raises(OptionError, match="'access.key.secret'") as e:
        parse(_WithSecret, {"access.key.secret": value}, what="test")
    assert "TOPSECRET" not in str(e.value) and "7.5" not in str(e.value)


@pytest.mark.parametrize(
    ("backend", "secret"),
    [("tablestore", "access.key.secret"), ("tablestore", "access.key.id"), ("tablestore", "sts.token"),
     ("pulsar", "auth.token")],
)
def test_backend_secrets_of_the_wrong_type_are_not_echoed(backend: str, secret: str) -> None:
    from cdc.backends.pulsar.options import PulsarOptions
    from cdc.backends.tablestore.options import TablestoreOptions
    from cdc.options import split_and_parse

    model = {"pulsar": PulsarOptions, "tablestore": TablestoreOptions}[backend]
    with pytest.raises(OptionError, match=repr(secret)) as e:
        split_and_parse({"backend": backend, secret: ["x", "TOPSECRET-1"]}, model, backend)
    assert "TOPSECRET" not in str(e.value)


def test_register_warns_once_when_py4j_logs_option_values(caplog: pytest.LogCaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """At DEBUG, py4j logs every call the driver makes, ``.option("access.key.secret", ...)`` included."""
    import logging
    from unittest.mock import MagicMock

    import cdc

    py4j = logging.getLogger("py4j")
    monkeypatch.setattr(cdc, "_warned_py4j_debug", False, raising=False)  # a once-per-process warning
    caplog.set_level(logging.WARNING, logger="cdc")
    level = py4j.level
    try:
        py4j.setLevel(logging.INFO)
        cdc.register(MagicMock())
        assert not [r for r in caplog.records if "py4j" in r.getMessage()]
        py4j.setLevel(logging.DEBUG)
        cdc.register(MagicMock())
        cdc.register(MagicMock())
    finally:
        py4j.setLevel(level)
    warned = [r for r in caplog.records if "py4j" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "secret" in warned[0].getMessage() and "environment" in warned[0].getMessage()


def test_errors_pickle() -> None:
    for err in (OptionError("bad", "opt"), DataLossError("gone", "c0")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)


def test_max_bytes_per_trigger_needs_a_backend_that_estimates_record_sizes(tmp_path: Path) -> None:
    """A backend that cannot estimate record sizes (the contract's default, e.g. a third-party backend) fails the query at
    its first batch with an error naming the option; with one that can, the budget becomes a record count."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from cdc.backends.local import LocalBackend, LocalLog
    from cdc.source import CdcStreamReader

    log = LocalLog.create(tmp_path / "log", [("k", pa.int64())], ["k"], channels=1)
    log.append([{"k": i} for i in range(100)])
    config = _Config({"backend": "local", "path": str(log.path), "maxBytesPerTrigger": str(int(log.average_record_bytes() * 30))})
    schema = from_arrow_schema(log.arrow_schema)
    reader = CdcStreamReader(config, schema)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["channels"]["c0"]["pos"] in (29, 30)  # 30 records' bytes (the float division may round down)

    class Unsized(LocalBackend):  # what every backend inherits from the contract unless it overrides it
        def average_record_bytes(self) -> float | None:
            return None

    reader = CdcStreamReader(config, schema)
    reader._backend = Unsized(config.backend_options)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"maxBytesPerTrigger.*cannot estimate record sizes.*maxRecordsPerTrigger"):
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())


def test_a_rule_over_several_options_is_reported_in_its_own_words() -> None:
    """A model-level rule (here: a table without a database needs one in the DSN) names its options itself;
    the error does not invent an option called '?'."""
    from cdc.backends.mysql.options import MySQLOptions
    from cdc.options import parse

    with pytest.raises(OptionError) as refused:
        parse(MySQLOptions, {"dsn": "mysql://cdc@db", "tables": "orders"}, what="backend 'mysql'")
    assert "need a database in the dsn" in str(refused.value)
    assert "'?'" not in str(refused.value) and refused.value.option is None
