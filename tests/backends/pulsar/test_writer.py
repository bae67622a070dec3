"""Writes through ``format("cdc")`` belong to the backend named by ``backend`` (the writer hook), without
Spark: the data source's ``writer()`` is called as Spark calls it, and its tasks' ``write()`` run here."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from cdc.backends.pulsar.writer import PulsarStreamWriter, PulsarWriter
from cdc.errors import OptionError
from cdc.servers.pulsar import ApachePulsar
from cdc.source import CdcDataSource
from tests.backends.pulsar.helpers import backend, drain

SCHEMA = StructType([StructField("value", BinaryType()), StructField("key", StringType())])


def _rows(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"value": [f"v{i}".encode() for i in range(n)], "key": [f"k{i}" for i in range(n)]},
        schema=pa.schema([("value", pa.binary()), ("key", pa.string())]),
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_write_to_a_backend_without_a_writer_fails_naming_backend(tmp_path: object, stream: bool) -> None:
    source = CdcDataSource({"backend": "local", "path": str(tmp_path)})
    with pytest.raises(OptionError, match=r"option 'backend': backend 'local' does not accept writes; "
                                          r"accepted values for writes: pulsar") as err:
        if stream:
            source.streamWriter(SCHEMA, False)
        else:
            source.writer(SCHEMA, False)
    assert err.value.option == "backend"


def test_a_write_naming_pulsar_gets_the_pulsar_writers(broker: ApachePulsar, topic: str) -> None:
    options = {"backend": "pulsar", "service.url": broker.url, "topic": topic}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # naming the backend: no deprecation warning
        assert isinstance(CdcDataSource(options).writer(SCHEMA, False), PulsarWriter)
        assert isinstance(CdcDataSource(options).streamWriter(SCHEMA, False), PulsarStreamWriter)
    with pytest.raises(OptionError, match=r"only appends.*mode\('append'\)"):
        CdcDataSource(options).writer(SCHEMA, True)


def test_a_write_naming_no_backend_still_reaches_pulsar_and_warns(broker: ApachePulsar, topic: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    source = CdcDataSource({"service.url": broker.url, "topic": topic})
    with pytest.warns(FutureWarning, match=r"write of format\('cdc'\) without option 'backend' uses backend 'pulsar'.*deprecated"):
        writer = source.writer(SCHEMA, False)
    assert "deprecated" in caplog.text
    commit = writer.write(iter([_rows(5)]))
    writer.commit([commit])
    table, _ = drain(backend(broker.url, topic))
    assert sorted(table.column("value").to_pylist()) == [f"v{i}".encode() for i in range(5)]
    assert sorted(table.column("__key").to_pylist()) == [f"k{i}" for i in range(5)]


def test_wire_modules_load_neither_the_client_nor_pyspark_nor_pydantic() -> None:
    """The package is lazy: its records and positions load neither the client, nor pyspark, pydantic or fastavro
    (pyarrow, which the records module builds batches with, brings numpy: that one is expected)."""
    code = (
        "import sys, cdc; before = set(sys.modules)\n"
        "import cdc.backends.pulsar.records, cdc.backends.pulsar.positions, cdc.backends.pulsar.errors\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    loaded = {name.split(".")[0] for name in out}
    assert not loaded & {"pulsar", "_pulsar", "pyspark", "pydantic", "fastavro"}, out
    assert "cdc.backends.pulsar.backend" not in out and "cdc.backends.pulsar.options" not in out, out
