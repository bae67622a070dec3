"""The local Tablestore server's table API, driven by the real ``tablestore`` SDK (``OTSClient``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tablestore import (
    INF_MAX,
    INF_MIN,
    BatchWriteRowRequest,
    CapacityUnit,
    ComparatorType,
    CompositeColumnCondition,
    Condition,
    DeleteRowItem,
    Direction,
    LogicalOperator,
    OTSClient,
    OTSServiceError,
    PutRowItem,
    ReservedThroughput,
    ReturnType,
    Row,
    RowExistenceExpectation,
    SingleColumnCondition,
    TableInBatchWriteRowItem,
    TableMeta,
    TableOptions,
    UpdateRowItem,
)
from tablestore.retry import NoRetryPolicy

from cdc.servers.tablestore import LocalTablestore, TablestoreProcess

IGNORE = Condition(RowExistenceExpectation.IGNORE)


def _create(client: OTSClient, name: str = "t", pk: list[tuple[str, str]] | None = None) -> None:
    meta = TableMeta(name, pk or [("id", "INTEGER"), ("s", "STRING")])
    client.create_table(meta, TableOptions(), ReservedThroughput(CapacityUnit(0, 0)))


def _all(client: OTSClient, table: str = "t", width: int = 2) -> list[tuple[list, list]]:
    start, end = [("id", INF_MIN), ("s", INF_MIN)][:width], [("id", INF_MAX), ("s", INF_MAX)][:width]
    out = []
    while start is not None:
        _, start, rows, _ = client.get_range(table, Direction.FORWARD, start, end, max_version=1, limit=7)
        out.extend((r.primary_key, [(c[0], c[1]) for c in r.attribute_columns]) for r in rows)
    return out


def test_crud_and_describe(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    _create(client)
    assert client.list_table() == ("t",)
    described = client.describe_table("t")
    assert described.table_meta.schema_of_primary_key == [("id", "INTEGER"), ("s", "STRING")]
    with pytest.raises(OTSServiceError) as exists:
        _create(client)
    assert exists.value.get_error_code() == "OTSObjectAlreadyExist"

    client.put_row(
        "t",
        Row([("id", 1), ("s", "a")], [("v", 1), ("f", 2.5), ("b", True), ("bin", bytearray(b"\x00\x01"))]),
    )
    _, row, _ = client.get_row("t", [("id", 1), ("s", "a")], max_version=1)
    assert row.primary_key == [("id", 1), ("s", "a")]
    assert [(c[0], c[1]) for c in row.attribute_columns] == [
        ("v", 1),
        ("f", 2.5),
        ("b", True),
        ("bin", bytearray(b"\x00\x01")),
    ]
    assert all(c[2] > 1_600_000_000_000 for c in row.attribute_columns)  # cell versions are epoch millis

    _, row, _ = client.get_row("t", [("id", 1), ("s", "a")], columns_to_get=["f"], max_version=1)
    assert [c[0] for c in row.attribute_columns] == ["f"]

    update = Row([("id", 1), ("s", "a")], {"PUT": [("v", 10)], "DELETE_ALL": ["f"], "INCREMENT": [("n", 5)]})
    client.update_row("t", update, Condition(RowExistenceExpectation.EXPECT_EXIST))
    client.update_row("t", Row([("id", 1), ("s", "a")], {"INCREMENT": [("n", 2)]}), IGNORE)
    _, row, _ = client.get_row("t", [("id", 1), ("s", "a")], max_version=1)
    assert {c[0]: c[1] for c in row.attribute_columns} == {
        "v": 10,
        "b": True,
        "bin": bytearray(b"\x00\x01"),
        "n": 7,
    }

    client.delete_row("t", Row([("id", 1), ("s", "a")]), IGNORE)
    _, row, _ = client.get_row("t", [("id", 1), ("s", "a")], max_version=1)
    assert row is None
    client.delete_table("t")
    assert client.list_table() == ()
    with pytest.raises(OTSServiceError) as gone:
        client.describe_table("t")
    assert gone.value.get_error_code() == "OTSObjectNotExist"


def test_conditions(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    _create(client)
    pk = [("id", 1), ("s", "a")]
    client.put_row("t", Row(pk, [("v", 1)]), Condition(RowExistenceExpectation.EXPECT_NOT_EXIST))
    for expectation in (RowExistenceExpectation.EXPECT_NOT_EXIST,):
        with pytest.raises(OTSServiceError) as failed:
            client.put_row("t", Row(pk, [("v", 2)]), Condition(expectation))
        assert failed.value.get_error_code() == "OTSConditionCheckFail"
    with pytest.raises(OTSServiceError):
        client.update_row(
            "t",
            Row([("id", 2), ("s", "a")], {"PUT": [("v", 1)]}),
            Condition(RowExistenceExpectation.EXPECT_EXIST),
        )
    wrong = Condition(RowExistenceExpectation.IGNORE, SingleColumnCondition("v", 5, ComparatorType.EQUAL))
    with pytest.raises(OTSServiceError):
        client.put_row("t", Row(pk, [("v", 3)]), wrong)
    both = CompositeColumnCondition(LogicalOperator.AND)
    both.add_sub_condition(SingleColumnCondition("v", 0, ComparatorType.GREATER_THAN))
    both.add_sub_condition(SingleColumnCondition("missing", 1, ComparatorType.EQUAL, pass_if_missing=True))
    client.put_row("t", Row(pk, [("v", 4)]), Condition(RowExistenceExpectation.EXPECT_EXIST, both))
    _, row, _ = client.get_row("t", pk, max_version=1)
    assert row.attribute_columns[0][1] == 4


def test_batch_write_per_row_results(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    _create(client)
    items = [PutRowItem(Row([("id", i), ("s", "x")], [("v", i)]), IGNORE) for i in range(5)]
    items.append(
        UpdateRowItem(
            Row([("id", 99), ("s", "x")], {"PUT": [("v", 0)]}),
            Condition(RowExistenceExpectation.EXPECT_EXIST),
        )
    )
    items.append(DeleteRowItem(Row([("id", 0), ("s", "x")]), IGNORE))
    request = BatchWriteRowRequest()
    request.add(TableInBatchWriteRowItem("t", items))
    result = client.batch_write_row(request)
    assert not result.is_all_succeed()
    _, [failed] = result.get_update()
    assert failed.error_code == "OTSConditionCheckFail"
    assert all(r.is_ok for r in result.get_put_by_table("t")) and len(result.get_put_by_table("t")) == 5
    assert [pk[0][1] for pk, _ in _all(client)] == [1, 2, 3, 4]
    too_many = BatchWriteRowRequest()
    too_many.add(
        TableInBatchWriteRowItem(
            "t", [PutRowItem(Row([("id", i), ("s", "y")], [("v", 1)]), IGNORE) for i in range(201)]
        )
    )
    with pytest.raises(OTSServiceError) as invalid:
        client.batch_write_row(too_many)
    assert invalid.value.get_error_code() == "OTSParameterInvalid"


def test_get_range_directions_and_paging(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    _create(client)
    for i in range(-5, 20):
        for s in ("b", "a", "ab"):
            client.put_row("t", Row([("id", i), ("s", s)], [("v", i)]), IGNORE)
    keys = [tuple(v for _, v in pk) for pk, _ in _all(client)]
    assert keys == sorted((i, s) for i in range(-5, 20) for s in ("a", "ab", "b"))
    _, nxt, rows, _ = client.get_range(
        "t",
        Direction.BACKWARD,
        [("id", 3), ("s", INF_MAX)],
        [("id", 1), ("s", INF_MAX)],
        max_version=1,
        limit=4,
    )
    assert [tuple(v for _, v in r.primary_key) for r in rows] == [(3, "b"), (3, "ab"), (3, "a"), (2, "b")]
    assert nxt == [("id", 2), ("s", "ab")]
    with pytest.raises(OTSServiceError) as invalid:
        client.get_range(
            "t",
            Direction.FORWARD,
            [("id", "x"), ("s", INF_MIN)],
            [("id", INF_MAX), ("s", INF_MAX)],
            max_version=1,
        )
    assert invalid.value.get_error_code() == "OTSParameterInvalid"


def test_auto_increment_and_return_pk(tablestore_server: TablestoreProcess) -> None:
    from tablestore import PK_AUTO_INCR

    client = tablestore_server.ots_client()
    meta = TableMeta("auto", [("part", "STRING"), ("seq", "INTEGER", PK_AUTO_INCR)])
    client.create_table(meta, TableOptions(), ReservedThroughput(CapacityUnit(0, 0)))
    seen = []
    for _ in range(3):
        _, row = client.put_row(
            "auto", Row([("part", "p"), ("seq", PK_AUTO_INCR)], [("v", 1)]), IGNORE, ReturnType.RT_PK
        )
        seen.append(row.primary_key[1][1])
    assert seen == sorted(seen) and len(set(seen)) == 3


def test_wrong_secret_is_rejected(tablestore_server: TablestoreProcess) -> None:
    server = tablestore_server
    bad = OTSClient(
        server.endpoint, server.access_key_id, "not-the-secret", server.instance, retry_policy=NoRetryPolicy()
    )
    with pytest.raises(OTSServiceError) as failed:
        bad.list_table()
    assert failed.value.get_error_code() == "OTSAuthFailed"
    assert failed.value.get_http_status() == 403
    other_id = OTSClient(
        server.endpoint,
        "someone-else",
        server.access_key_secret,
        server.instance,
        retry_policy=NoRetryPolicy(),
    )
    with pytest.raises(OTSServiceError) as failed:
        other_id.list_table()
    assert failed.value.get_error_code() == "OTSAuthFailed"


def test_responses_are_signed_with_the_secret(tmp_path) -> None:
    """A client that knows the id but computes response signatures with another secret must refuse them."""
    from tablestore.error import OTSClientError

    with LocalTablestore(tmp_path, access_key_secret="server-secret") as server:
        good = OTSClient(
            server.endpoint,
            server.access_key_id,
            "server-secret",
            server.instance,
            retry_policy=NoRetryPolicy(),
        )
        assert good.list_table() == ()
        # Sign requests right but check responses with another key: the SDK's response check must fail.
        tricked = OTSClient(
            server.endpoint,
            server.access_key_id,
            "server-secret",
            server.instance,
            retry_policy=NoRetryPolicy(),
        )
        tricked._signer.get_signing_key = lambda _ctx: "other-secret"  # type: ignore[method-assign]
        tricked._signer.make_request_signature_and_add_headers = (
            good._signer.make_request_signature_and_add_headers
        )  # type: ignore[method-assign]
        with pytest.raises(OTSClientError, match="Invalid signature in response"):
            tricked.list_table()


def test_restart_after_kill_keeps_everything(tablestore_server: TablestoreProcess) -> None:
    client = tablestore_server.ots_client()
    _create(client)
    for i in range(50):
        client.put_row("t", Row([("id", i), ("s", "k")], [("v", i)]), IGNORE)
    split = tablestore_server.split("t")
    before = _all(client)
    tablestore_server.restart(crash=True)
    client = tablestore_server.ots_client()
    assert client.list_table() == ("t",)
    assert _all(client) == before
    assert {s["shard_id"] for s in tablestore_server.shards("t") if not s["sealed"]} == set(split["children"])
    client.put_row("t", Row([("id", 100), ("s", "k")], [("v", 1)]), IGNORE)
    assert len(_all(client)) == 51


def test_faults(tablestore_server: TablestoreProcess) -> None:
    import time

    client = tablestore_server.ots_client()
    tablestore_server.fault("unavailable", count=1)
    with pytest.raises(OTSServiceError) as unavailable:
        client.list_table()
    assert unavailable.value.get_error_code() == "OTSServerUnavailable"
    assert client.list_table() == ()
    tablestore_server.fault("drop", count=1)
    with pytest.raises(Exception):  # noqa: B017 - urllib3/SDK surface a dropped connection in several types
        client.list_table()
    assert tablestore_server.ots_client().list_table() == ()
    tablestore_server.fault("delay", seconds=0.5, count=1, path_prefix="/ListTable")
    started = time.monotonic()
    assert tablestore_server.ots_client().list_table() == ()
    assert time.monotonic() - started >= 0.5
    tablestore_server.fault("unavailable", path_prefix="/tunnel/")
    assert tablestore_server.ots_client().list_table() == ()  # other paths are not faulted
    tablestore_server.clear_faults()


# ------------------------------------------------------------------------------------------ model-based

keys = st.tuples(st.integers(-3, 3), st.sampled_from(["", "a", "b\x00", "bb"]))
values = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.text(max_size=5), st.booleans(), st.floats(allow_nan=False)
)
ops = st.one_of(
    st.tuples(st.just("put"), keys, st.dictionaries(st.sampled_from(["x", "y", "z"]), values, max_size=3)),
    st.tuples(
        st.just("update"),
        keys,
        st.dictionaries(
            st.sampled_from(["x", "y", "z"]), st.one_of(st.none(), values), min_size=1, max_size=3
        ),
    ),
    st.tuples(st.just("delete"), keys, st.just({})),
)


@settings(max_examples=50)
@given(st.lists(ops, max_size=25))
def test_matches_a_dict_model(tmp_path_factory, operations) -> None:
    """Random puts/updates/deletes through the SDK leave exactly what a dict model says, in key order."""
    with LocalTablestore(tmp_path_factory.mktemp("model")) as server:
        client = OTSClient(
            server.endpoint,
            server.access_key_id,
            server.access_key_secret,
            server.instance,
            retry_policy=NoRetryPolicy(),
        )
        _create(client)
        model: dict[tuple[int, str], dict[str, object]] = {}
        for kind, key, cols in operations:
            pk = [("id", key[0]), ("s", key[1])]
            if kind == "put":
                client.put_row("t", Row(pk, list(cols.items())), IGNORE)
                model[key] = dict(cols)
            elif kind == "update":
                puts = [(k, v) for k, v in cols.items() if v is not None]
                deletes = [k for k, v in cols.items() if v is None]
                change = {**({"PUT": puts} if puts else {}), **({"DELETE_ALL": deletes} if deletes else {})}
                client.update_row("t", Row(pk, change), IGNORE)
                row = model.setdefault(key, {})
                row.update(puts)
                for k in deletes:
                    row.pop(k, None)
            else:
                client.delete_row("t", Row(pk), IGNORE)
                model.pop(key, None)
        got = {tuple(v for _, v in pk): dict(cols) for pk, cols in _all(client)}
        assert list(got) == sorted(model)
        assert got == model


def test_signature_v4_requests_and_responses(tmp_path) -> None:
    """``OTSClient(..., region=...)`` signs with signature v4; the server verifies it and signs its answers."""
    with LocalTablestore(tmp_path, access_key_secret="v4-secret") as server:
        v4 = OTSClient(
            server.endpoint,
            server.access_key_id,
            "v4-secret",
            server.instance,
            region="cn-hangzhou",
            retry_policy=NoRetryPolicy(),
        )
        _create(v4)
        v4.put_row("t", Row([("id", 1), ("s", "a")], [("v", 1)]), IGNORE)
        assert v4.get_row("t", [("id", 1), ("s", "a")], max_version=1)[1].attribute_columns[0][1] == 1
        wrong = OTSClient(
            server.endpoint,
            server.access_key_id,
            "nope",
            server.instance,
            region="cn-hangzhou",
            retry_policy=NoRetryPolicy(),
        )
        with pytest.raises(OTSServiceError) as failed:
            wrong.list_table()
        assert failed.value.get_error_code() == "OTSAuthFailed"
