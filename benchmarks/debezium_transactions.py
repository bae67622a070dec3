"""What ``debezium.transactionTopic`` costs: the same Debezium topic read with and without it, in one run.

The benchmark starts its own Apache Pulsar standalone (``make pulsar-standalone`` resolves it), produces
PostgreSQL-shaped Debezium envelopes with transaction blocks (transactions of 1-8 events, keyed over a
2-partition topic, so most transactions span both partitions) and their BEGIN/END events to a transaction
topic. Each variant plans and reads every batch here (planning on the driver, then each range decoded into
change records as an executor does, one after another; no Spark): without a budget (the reference takes
the fast path: heads from the broker, no message read to plan) and with ``maxRecordsPerTrigger``-like
budgets. With the option the driver reads every message once more and parses its transaction block.
Every variant must deliver every change; with the option every batch must hold whole transactions.

    python benchmarks/debezium_transactions.py            # 200k envelopes
    python benchmarks/debezium_transactions.py --quick    # 50k

Last line: ``ratio <seconds without the option / seconds with it>``, no budget (the throughput kept).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter

import click
from record import append_record

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOPIC = "persistent://public/default/dbz-bench"
TX_TOPIC = "persistent://public/default/dbz-bench.transaction"
SCHEMA = json.dumps({"type": "record", "name": "items", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]},
    {"name": "qty", "type": ["null", "long"]}, {"name": "ok", "type": ["null", "boolean"]}]})
BUDGET = 10_000


def envelopes(n: int) -> tuple[list[bytes], list[str], list[bytes], dict[int, int]]:
    """(data payloads, their keys, transaction events, row id -> transaction number)."""
    rnd = random.Random(7)
    data: list[bytes] = []
    keys: list[str] = []
    marks: list[bytes] = []
    tx_of: dict[int, int] = {}
    xid, lsn = 1000, 3_000_000
    while len(data) < n:
        size = min(rnd.randint(1, 8), n - len(data))
        marks.append(json.dumps({"status": "BEGIN", "id": f"{xid}:{lsn}", "event_count": None,
                                 "data_collections": None, "ts_ms": 1700000000000}).encode())
        for k in range(size):
            i = len(data)
            lsn += 136
            source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1700000000000 + xid,
                      "snapshot": "false", "db": "app", "sequence": f'["{lsn - 136}","{lsn}"]',
                      "ts_us": 1700000000000000 + xid, "schema": "public", "table": "items", "txId": xid, "lsn": lsn,
                      "xmin": None}
            data.append(json.dumps({
                "before": None, "after": {"id": i, "name": f"row {i}", "qty": i * 10, "ok": i % 2 == 0},
                "source": source, "transaction": {"id": f"{xid}:{lsn}", "total_order": k + 1,
                                                  "data_collection_order": k + 1},
                "op": "c", "ts_ms": 1700000000001 + xid}, separators=(",", ":")).encode())
            keys.append(json.dumps({"id": i}))
            tx_of[i] = xid
        marks.append(json.dumps({"status": "END", "id": f"{xid}:{lsn + 8}", "event_count": size, "data_collections": [
            {"data_collection": "public.items", "event_count": size}], "ts_ms": 1700000000000}).encode())
        xid, lsn = xid + 1, lsn + 200
    return data, keys, marks, tx_of


def produce(url: str, topic: str, payloads: list[bytes], keys: list[str] | None) -> None:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True)
    for i, p in enumerate(payloads):
        producer.send_async(p, None, **({"partition_key": keys[i]} if keys else {}))
    producer.flush()
    producer.close()
    client.close()


def run(url: str, n: int, tx_of: dict[int, int], sizes: Counter[int], budget: int | None,
        transactions: bool) -> tuple[float, int]:
    """Seconds to plan and read every change, and the batches; checks what was delivered."""
    from cdc.backend import open_backend
    from cdc.planner import Planner
    from cdc.testing import batches

    options = {"service.url": url, "topic": TOPIC, "valueFormat": "debezium", "valueSchema": SCHEMA,
               "changeKeys": "id"}
    if transactions:
        options["debezium.transactionTopic"] = TX_TOPIC
    backend = open_backend("pulsar", options)
    start = time.perf_counter()
    rows = count = 0
    try:
        for _, table in batches(backend, Planner(backend).initial("earliest"), budget):
            count += 1
            rows += table.num_rows
            if transactions:
                in_batch = Counter(tx_of[i] for i in table.column("id").to_pylist())
                if any(sizes[t] != k for t, k in in_batch.items()):
                    raise SystemExit(f"a batch holds part of a transaction: {in_batch}")
    finally:
        backend.close()
    elapsed = time.perf_counter() - start
    if rows != n:
        raise SystemExit(f"read {rows} changes, not {n}: the figures are void")
    return elapsed, count


@click.command()
@click.option("--quick", is_flag=True, help="50k envelopes instead of 200k")
@click.option("--messages", type=int, default=None)
def main(quick: bool, messages: int | None) -> None:
    from cdc.servers.pulsar import ApachePulsar

    n = messages or (50_000 if quick else 200_000)
    data, keys, marks, tx_of = envelopes(n)
    sizes = Counter(tx_of.values())
    with ApachePulsar(heap="512m") as broker:
        print(f"Apache Pulsar standalone ready in {broker.last_start_s:.1f} s")
        broker.create_partitioned_topic(TOPIC, 2)
        t = time.perf_counter()
        produce(broker.url, TOPIC, data, keys)
        produce(broker.url, TX_TOPIC, marks, None)
        print(f"produced {n} envelopes in {len(sizes)} transactions (+{len(marks)} BEGIN/END) in "
              f"{time.perf_counter() - t:.1f} s; {sum(len(p) for p in data) / n:.0f} B per envelope")
        run(broker.url, n, tx_of, sizes, None, False)  # warm-up: broker caches, imports
        figures = {}
        for budget in (None, BUDGET):
            for transactions in (False, True):
                elapsed, count = run(broker.url, n, tx_of, sizes, budget, transactions)
                figures[(budget, transactions)] = elapsed
                print(f"budget {budget or 'none':>6}, debezium.transactionTopic {'given' if transactions else 'absent'}: "
                      f"{count} batches, {elapsed:.2f} s ({n / elapsed:,.0f} changes/s)")
        print(f"with a budget of {BUDGET}: ratio {figures[(BUDGET, False)] / figures[(BUDGET, True)]:.3f}")
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    append_record("debezium_transactions", {f"budget {b or 'none'}, transactionTopic {'given' if tx else 'absent'}": (n / e, "changes/s") for (b, tx), e in figures.items()}, ratio=figures[(None, False)] / figures[(None, True)], params={"envelopes": n})
    print(f"ratio {figures[(None, False)] / figures[(None, True)]:.3f}")


if __name__ == "__main__":
    main()
