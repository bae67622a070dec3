"""The cdc source over Kafka in a real Spark driver process while things break: the broker killed with SIGKILL
and restarted mid-stream, then the driver killed with SIGKILL and restarted on its checkpoint (in the test's
own Spark session: only the kill needs a process of its own), with a transactional producer and a partition
added to the topic along the way. Nothing is lost or duplicated (an aborted transaction's records never
arrive), each partition's records come in offset order, and each key's in the order they were produced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from cdc.servers.kafka import ApacheKafka
from tests.backends.kafka.helpers import produce
from tests.streaming import driver_args, kill_driver, start_query, wait_for

pytestmark = pytest.mark.slow


def _rows(out: Path) -> list[dict[str, Any]]:
    """The committed output in commit order: the files the parquet sink's log lists, batch by batch (a killed
    driver may leave others; a compacted entry ``N.compact`` repeats the files of the batches before it)."""
    log = out / "_spark_metadata"
    entries = [e for e in (log.iterdir() if log.exists() else []) if e.name.split(".")[0].isdigit()]
    files: dict[str, None] = {}
    for entry in sorted(entries, key=lambda e: (int(e.name.split(".")[0]), e.name)):
        for line in entry.read_text().splitlines()[1:]:
            files.setdefault(json.loads(line)["path"].removeprefix("file://"))
    rows: list[dict[str, Any]] = []
    for f in files:
        table = pq.read_table(f, columns=["key", "value", "partition", "offset"]).sort_by("offset")
        rows += table.to_pylist()
    return rows


def _start(options: dict[str, str], out: Path, ck: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as sink:
        return subprocess.Popen(driver_args(options, out, ck, "forever"),
                                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _send(kafka: ApacheKafka, topic: str, lo: int, hi: int) -> None:
    produce(kafka.bootstrap, topic, [f"m{i}".encode() for i in range(lo, hi)], [f"k{i % 7}" for i in range(lo, hi)])


def test_broker_and_driver_kill_9_mid_stream(spark: Any, apache_kafka: ApacheKafka, tmp_path: Path) -> None:
    topic = f"restarts-{uuid.uuid4().hex[:8]}"
    apache_kafka.create_topic(topic, 2)
    out, ck, log = tmp_path / "out", tmp_path / "ck", tmp_path / "driver.log"
    options = {"backend": "kafka", "kafka.bootstrap.servers": apache_kafka.bootstrap, "subscribe": topic,
               "maxOffsetsPerTrigger": "300", "kafkaConsumer.pollTimeoutMs": "120000",
               "metadataTimeoutMs": "120000"}  # a loaded machine restarts the broker in more than the default 30 s
    _send(apache_kafka, topic, 0, 500)
    proc = _start(options, out, ck, log)
    query = None
    try:
        wait_for(lambda: len(_rows(out)) >= 200, 300, "the first records")
        apache_kafka.kill()  # mid-stream: the query has a backlog left
        apache_kafka.start()
        _send(apache_kafka, topic, 500, 1000)
        tx = Producer({"bootstrap.servers": apache_kafka.bootstrap, "transactional.id": f"{topic}-tx"})
        tx.init_transactions(60)
        for commit, lo in ((False, 1000), (True, 1100)):
            tx.begin_transaction()
            for i in range(lo, lo + 100):
                tx.produce(topic, value=f"{'m' if commit else 'aborted'}{i}".encode(), key=f"k{i % 7}".encode())
            tx.flush(60)
            (tx.commit_transaction if commit else tx.abort_transaction)(60)
        wait_for(lambda: len(_rows(out)) >= 1100, 300, "the records produced after the broker restart")
        kill_driver(proc)
        apache_kafka.add_partitions(topic, 3)  # keys move: their later records go to the new partition too
        _send(apache_kafka, topic, 1200, 1600)
        # The restarted driver is this process's Spark session: only the kill needs a process of its own.
        query = start_query(spark, options, out, ck)
        wait_for(lambda: len(_rows(out)) >= 1500, 300, "the records produced after the driver restart")
    except AssertionError as exc:
        failed = query.exception() if query is not None else None
        raise AssertionError(f"{exc}; restarted query: {failed}; driver log: {log.read_text()[-3000:]}") from None
    finally:
        kill_driver(proc)
        if query is not None:
            query.stop()
    rows = _rows(out)
    values = [r["value"].decode() for r in rows]
    expected = [f"m{i}" for i in (*range(1000), *range(1100, 1600))]
    assert sorted(values) == sorted(expected)  # nothing lost or duplicated, no aborted record
    per_partition: dict[int, list[int]] = {}
    per_key: dict[bytes, list[int]] = {}
    for r in rows:
        per_partition.setdefault(r["partition"], []).append(r["offset"])
    for p, offsets in per_partition.items():
        assert offsets == sorted(offsets), f"partition {p} out of order"
    assert 2 in per_partition  # the added partition was read
    # a key's records in the order they were produced: the sink's log order, then offsets within a batch
    for r in rows:
        per_key.setdefault(r["key"], []).append(int(r["value"][1:]))
    for key, order in per_key.items():
        assert order == sorted(order), f"key {key!r} out of order"
