from __future__ import annotations

import json
from typing import Any

import pytest

from cdc.backends.tablestore.plainbuffer import Cell, Row, SequenceInfo, encode_row
from udfs import debezium, plainbuffer_json

pytestmark = pytest.mark.spark


def test_debezium_envelopes_become_change_records(spark: Any) -> None:
    rows = [
        '{"op": "c", "ts_ms": 1700000000000, "before": null, "after": {"order_id": 1, "amount": 5.5}}',
        '{"payload": {"op": "u", "ts_ms": 1700000001000, "before": {"order_id": 1, "amount": 5.5},'
        ' "after": {"order_id": 1, "amount": 7.0}}}',
        '{"op": "d", "ts_ms": 1700000002000, "before": {"order_id": 1, "amount": 7.0}, "after": null}',
        '{"op": "r", "ts_ms": 1700000003000, "after": {"order_id": 2, "amount": 1.0}}',
        '{"op": "x", "after": {"order_id": 3}}',
        "not json",
    ]
    df = spark.createDataFrame([(r,) for r in rows], "value string")
    out = df.select(debezium("value", "order_id long, amount double").alias("c")).select("c.*").collect()
    assert [(r["_op"], r["order_id"], r["amount"]) for r in out[:4]] == [
        ("insert", 1, 5.5),
        ("update", 1, 7.0),
        ("delete", 1, 7.0),
        ("snapshot", 2, 1.0),
    ]
    assert out[0]["_commit_ts"].timestamp() == 1700000000
    assert out[4]["_op"] is None and out[5]["_op"] is None  # kept, for quarantine, not dropped
    assert [r["_unchanged"] for r in out[:4]] == [None] * 4


def test_debezium_placeholders_are_unchanged_columns_and_old_keys_link_key_changes(spark: Any) -> None:
    """What Debezium's PostgreSQL connector sends for unchanged TOASTed values (tests/debezium captured it):
    the placeholder in text columns, its bytes (base64) in bytea ones; under REPLICA IDENTITY FULL before has
    the value. A key change's create carries the old key in its __debezium.oldkey header."""
    unavailable = {"b": "__debezium_unavailable_value", "raw": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="}

    def env(op: str, before: Any, after: Any) -> str:
        return json.dumps({"op": op, "before": before, "after": after})

    rows = [
        (env("u", None, {"id": 1, "n": 5, **unavailable}), None),
        (env("u", {"id": 1, "n": 4, "b": "old", "raw": "AQI="}, {"id": 1, "n": 5, **unavailable}), None),
        (env("c", None, {"id": 10, "n": 5, **unavailable}), '{"schema": {"type": "struct"}, "payload": {"id": 1}}'),
        (env("r", None, {"id": 2, "n": 1, "b": "x", "raw": "AQI="}), None),
        (env("u", None, {"id": 2, "n": 1, "b": "--", "raw": "AQI="}), None),
    ]
    df = spark.createDataFrame(rows, "value string, oldkey string")
    schema = "id int, n int, b string, raw binary"
    out = df.select(debezium("value", schema, keys=["id"], old_key="oldkey").alias("c")).select("c.*").collect()
    assert [(r["_op"], r["id"], r["b"], r["raw"], r["_unchanged"], r["_old_key"] and r["_old_key"].asDict())
            for r in out] == [
        ("update", 1, None, None, ["b", "raw"], None),
        ("update", 1, "old", bytearray(b"\x01\x02"), None, None),
        ("insert", 10, None, None, ["b", "raw"], {"id": 1}),
        ("snapshot", 2, "x", bytearray(b"\x01\x02"), None, None),
        ("update", 2, "--", bytearray(b"\x01\x02"), None, None),
    ]
    told = df.select(debezium("value", schema, placeholder="hex:2d2d").alias("c")).select("c.*").collect()
    assert [r["_unchanged"] for r in told] == [None, None, None, None, ["b"]]


def test_plainbuffer_records_decode_in_sql_and_bad_ones_fail_or_are_kept(spark: Any) -> None:
    good = encode_row(
        Row(
            primary_key=(("id", 7),),
            cells=(Cell("v", "x"), Cell("gone", None, cell_type=1)),
            sequence_info=SequenceInfo(epoch=1, timestamp=1700000000000000, row_index=3),
        )
    )
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # break the row checksum
    df = spark.createDataFrame([(good,), (bytes(bad),)], "record binary")
    df.createOrReplaceTempView("raw_records")
    doc = json.loads(spark.sql("SELECT cdc_plainbuffer_json(record) AS j FROM raw_records LIMIT 1").first()["j"])
    assert doc == {
        "primary_key": {"id": 7},
        "columns": {"v": "x"},
        "deleted_columns": ["gone"],
        "delete_row": False,
        "sequence": [1, 1700000000000000, 3],
    }
    kept = [json.loads(r[0]) for r in df.select(plainbuffer_json("record", errors="record")).collect()]
    assert "checksum" in kept[1]["error"]
    with pytest.raises(Exception, match="checksum"):
        df.select(plainbuffer_json("record")).collect()
