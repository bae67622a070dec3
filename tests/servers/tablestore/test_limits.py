"""The local server refuses what the service refuses (its documented limits), with the service's codes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tablestore import (
    INF_MAX,
    INF_MIN,
    BatchWriteRowRequest,
    CapacityUnit,
    Condition,
    Direction,
    OTSClient,
    OTSServiceError,
    PutRowItem,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    TableInBatchWriteRowItem,
    TableMeta,
    TableOptions,
)
from tablestore.retry import NoRetryPolicy

from cdc.servers.tablestore import LocalTablestore

IGNORE = Condition(RowExistenceExpectation.IGNORE)
MB = 1024 * 1024


@pytest.fixture
def client(tmp_path: Path) -> Iterator[OTSClient]:
    with LocalTablestore(tmp_path) as server:
        yield OTSClient(
            server.endpoint,
            server.access_key_id,
            server.access_key_secret,
            server.instance,
            retry_policy=NoRetryPolicy(),
        )


def _create(client: OTSClient, name: str, pk: list[tuple[str, str]] | None = None) -> None:
    meta = TableMeta(name, pk or [("id", "STRING")])
    client.create_table(meta, TableOptions(), ReservedThroughput(CapacityUnit(0, 0)))


def _refused(call: object, *args: object, **kwargs: object) -> str:
    assert callable(call)
    with pytest.raises(OTSServiceError) as refused:
        call(*args, **kwargs)
    assert refused.value.get_http_status() == 400
    return str(refused.value.get_error_code())


@pytest.mark.parametrize("name", ["../x", "a" * 256, "a\0b", "1abc", "a-b", "naïve", ""])
def test_table_names_outside_the_rules_are_refused(client: OTSClient, name: str) -> None:
    assert _refused(_create, client, name) == "OTSParameterInvalid"
    assert client.list_table() == ()


def test_names_inside_the_rules_are_accepted(client: OTSClient) -> None:
    _create(client, "_" + "a" * 254, [("Id_9", "STRING")])
    client.put_row("_" + "a" * 254, Row([("Id_9", "k")], [("_x" + "y" * 253, 1)]), IGNORE)


@pytest.mark.parametrize("column", ["bad-name", "a" * 256, "x\0", "9lives"])
def test_column_names_outside_the_rules_are_refused(client: OTSClient, column: str) -> None:
    assert _refused(_create, client, "t", [(column, "STRING")]) == "OTSParameterInvalid"
    _create(client, "t")
    assert _refused(client.put_row, "t", Row([("id", "k")], [(column, 1)]), IGNORE) == "OTSParameterInvalid"
    update = Row([("id", "k")], {"PUT": [(column, 1)]})
    assert _refused(client.update_row, "t", update, IGNORE) == "OTSParameterInvalid"


def test_a_primary_key_column_over_1_kb_is_refused(client: OTSClient) -> None:
    _create(client, "t", [("id", "STRING"), ("b", "BINARY")])
    client.put_row("t", Row([("id", "k" * 1024), ("b", bytearray(1024))], [("v", 1)]), IGNORE)
    client.put_row("t", Row([("id", "é" * 512), ("b", bytearray(1))], [("v", 1)]), IGNORE)  # 1024 bytes
    for pk in (
        [("id", "k" * 1025), ("b", bytearray(1))],
        [("id", "é" * 513), ("b", bytearray(1))],
        [("id", "k"), ("b", bytearray(1025))],
    ):
        assert _refused(client.put_row, "t", Row(pk, [("v", 1)]), IGNORE) == "OTSParameterInvalid"
        assert _refused(client.get_row, "t", pk, max_version=1) == "OTSParameterInvalid"
    _, _, rows, _ = client.get_range(
        "t",
        Direction.FORWARD,
        [("id", INF_MIN), ("b", INF_MIN)],
        [("id", INF_MAX), ("b", INF_MAX)],
        max_version=1,
    )
    assert len(rows) == 2


def test_attribute_values_over_2_mb_are_refused(client: OTSClient) -> None:
    _create(client, "t")
    client.put_row("t", Row([("id", "ok")], [("s", "x" * (2 * MB)), ("b", bytearray(10))]), IGNORE)
    client.put_row("t", Row([("id", "ok2")], [("b", bytearray(2 * MB))]), IGNORE)
    assert _refused(client.put_row, "t", Row([("id", "k")], [("s", "x" * (2 * MB + 1))]), IGNORE) == (
        "OTSParameterInvalid"
    )
    assert _refused(client.put_row, "t", Row([("id", "k")], [("b", bytearray(2 * MB + 1))]), IGNORE) == (
        "OTSParameterInvalid"
    )
    update = Row([("id", "ok")], {"PUT": [("s", "x" * (2 * MB + 1))]})
    assert _refused(client.update_row, "t", update, IGNORE) == "OTSParameterInvalid"


def test_a_write_over_4_mb_or_1024_columns_is_refused(client: OTSClient) -> None:
    _create(client, "t")
    big = [("a", "x" * (2 * MB)), ("b", "x" * (2 * MB))]  # 4 MiB of values plus the names
    assert _refused(client.put_row, "t", Row([("id", "k")], big), IGNORE) == "OTSParameterInvalid"
    assert _refused(client.update_row, "t", Row([("id", "k")], {"PUT": big}), IGNORE) == "OTSParameterInvalid"
    client.put_row("t", Row([("id", "k")], [(f"c{i}", i) for i in range(1024)]), IGNORE)
    wide = Row([("id", "k")], [(f"c{i}", i) for i in range(1025)])
    assert _refused(client.put_row, "t", wide, IGNORE) == "OTSParameterInvalid"
    request = BatchWriteRowRequest()
    rows = [PutRowItem(Row([("id", f"r{i}")], [("v", "x" * MB)]), IGNORE) for i in range(4)]
    request.add(TableInBatchWriteRowItem("t", rows))
    assert _refused(client.batch_write_row, request) == "OTSParameterInvalid"
    _, row, _ = client.get_row("t", [("id", "r0")], max_version=1)
    assert row is None


@pytest.mark.parametrize("limit", [0, -1])
def test_get_range_limit_must_be_positive(client: OTSClient, limit: int) -> None:
    _create(client, "t")
    code = _refused(
        client.get_range,
        "t",
        Direction.FORWARD,
        [("id", INF_MIN)],
        [("id", INF_MAX)],
        max_version=1,
        limit=limit,
    )
    assert code == "OTSParameterInvalid"
