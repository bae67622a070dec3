"""The cdc source over Pulsar inside real Spark: streaming with live producers (exactly once, in order per
partition), batch reads, and the Pulsar sink (batch and streaming). A broker SIGKILL mid-stream and a driver
restart are tests/backends/pulsar/test_restarts.py's, in a driver process of its own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc.servers.pulsar import ApachePulsar
from tests.backends.pulsar.helpers import backend, drain, produce

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def registered(spark: Any) -> Any:
    from cdc.backends.pulsar.writer import register

    register(spark)
    return spark


def _stream(spark: Any, url: str, topic: str, checkpoint: Path, out: Path, **extra: str) -> Any:
    reader = (
        spark.readStream.format("cdc")
        .option("backend", "pulsar")
        .option("service.url", url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("catchUpMs", "100")
        .option("pollTimeoutMs", "60000")
    )
    for k, v in extra.items():
        reader = reader.option(k, v)
    df = reader.load().selectExpr("cast(value as string) as v", "__key as k", "__topic as topic", "__messageId as mid")
    return (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def _rows(spark: Any, out: Path) -> list[Any]:
    if not (out / "_spark_metadata").exists():
        return []
    return spark.read.schema("v string, k string, topic string, mid binary").parquet(str(out)).collect()


def _wait_rows(spark: Any, out: Path, n: int, timeout: float = 120) -> list[Any]:
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = _rows(spark, out)
        if len(rows) >= n:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"only {len(rows)} of {n} rows arrived")


def _check_exactly_once_in_order(rows: list[Any], expected: int) -> None:
    import pulsar

    values = [r.v for r in rows]
    assert len(values) == expected, f"{len(values)} rows for {expected} messages (duplicates or loss)"
    assert sorted(values) == sorted(f"m-{i}" for i in range(expected))
    # In each partition, message-id order must agree with each key's production order.
    per_partition: dict[str, list[tuple[tuple[int, int, int], str, int]]] = {}
    for r in rows:
        mid = pulsar.MessageId.deserialize(bytes(r.mid))
        per_partition.setdefault(r.topic, []).append(
            ((mid.ledger_id(), mid.entry_id(), mid.batch_index()), r.k, int(r.v.split("-")[1]))
        )
    for items in per_partition.values():
        items.sort()
        last: dict[str, int] = {}
        for _, key, n in items:
            assert n > last.get(key, -1), f"key {key}: message {n} after {last[key]}"
            last[key] = n


def _payloads(lo: int, hi: int) -> tuple[list[bytes], list[str | None]]:
    return [f"m-{i}".encode() for i in range(lo, hi)], [f"key{i % 13}" for i in range(lo, hi)]


def test_stream_with_producer_writing_during_the_query(registered: Any, broker: ApachePulsar, topic: str,
                                                       tmp_path: Path) -> None:
    spark = registered
    produce(broker.url, topic, *_payloads(0, 200))
    query = _stream(spark, broker.url, topic, tmp_path / "cp", tmp_path / "out")

    def producer() -> None:
        for lo in range(200, 1200, 100):
            produce(broker.url, topic, *_payloads(lo, lo + 100), batching=lo % 200 == 0)
            time.sleep(0.2)

    t = threading.Thread(target=producer)
    t.start()
    try:
        t.join()
        rows = _wait_rows(spark, tmp_path / "out", 1200)
        time.sleep(1.5)  # a few more triggers: nothing may arrive twice
        rows = _rows(spark, tmp_path / "out")
        assert query.exception() is None
        assert query.lastProgress is not None
    finally:
        query.stop()
    _check_exactly_once_in_order(rows, 1200)


def test_batch_read_with_ending_offsets(registered: Any, broker: ApachePulsar, topic: str) -> None:
    spark = registered
    produce(broker.url, topic, *_payloads(0, 50))
    b = backend(broker.url, topic)
    _, end = drain(b)
    ending = {c: e["pos"] for c, e in end["channels"].items()}
    produce(broker.url, topic, *_payloads(50, 80))  # after the ending offsets: not read
    df = (
        spark.read.format("cdc").option("backend", "pulsar").option("service.url", broker.url)
        .option("topic", topic).option("endingOffsets", json.dumps(ending)).load()
    )
    assert df.count() == 50
    assert df.schema["__properties"].dataType.simpleString() == "map<string,string>"


# ---------------------------------------------------------------------------------------------- the sink
def test_batch_sink_routes_by_topic_column_and_key(registered: Any, broker: ApachePulsar, topic: str) -> None:
    spark = registered
    other = topic + "-other"
    rows = [(f"p{i}".encode(), f"k{i % 3}", topic if i % 2 else other, {"n": str(i)}) for i in range(40)]
    df = spark.createDataFrame(rows, "value binary, key string, topic string, properties map<string,string>")
    df.write.format("cdc-pulsar").option("service.url", broker.url).mode("append").save()
    t1, _ = drain(backend(broker.url, topic))
    t2, _ = drain(backend(broker.url, other))
    assert t1.num_rows == 20 and t2.num_rows == 20
    got = {r["value"]: (r["__key"], dict(r["__properties"])) for r in t1.to_pylist() + t2.to_pylist()}
    assert got[b"p7"] == ("k1", {"n": "7"})


def test_sink_json_values_and_too_large_message_names_the_key(registered: Any, broker: ApachePulsar,
                                                              topic: str) -> None:
    spark = registered
    df = spark.createDataFrame([(1, "a", "k1"), (2, "b", "k2")], "id long, name string, key string")
    (df.write.format("cdc").option("backend", "pulsar").option("service.url", broker.url).option("topic", topic)
     .option("valueFormat", "json").mode("append").save())
    table, _ = drain(backend(broker.url, topic))
    assert sorted((json.loads(v) for v in table.column("value").to_pylist()), key=lambda r: r["id"]) == [
        {"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    big = spark.createDataFrame([("x" * 2000, "the-big-one")], "value string, key string")
    with pytest.raises(Exception, match="the-big-one.*maxMessageSize"):
        (big.write.format("cdc-pulsar").option("service.url", broker.url).option("topic", topic)
         .option("maxMessageSize", "1000").mode("append").save())


def test_streaming_sink(registered: Any, broker: ApachePulsar, topic: str, tmp_path: Path) -> None:
    spark = registered
    source = topic + "-src"
    produce(broker.url, source, *_payloads(0, 100))
    query = (
        spark.readStream.format("cdc").option("backend", "pulsar").option("service.url", broker.url)
        .option("topic", source).load().selectExpr("value", "__key as key")
        .writeStream.format("cdc").option("backend", "pulsar").option("service.url", broker.url).option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    table, _ = drain(backend(broker.url, topic))
    assert sorted(table.column("value").to_pylist()) == sorted(_payloads(0, 100)[0])


@pytest.fixture(autouse=True)
def _no_leftover_queries(registered: Any) -> Iterator[None]:
    yield
    for q in registered.streams.active:
        q.stop()
