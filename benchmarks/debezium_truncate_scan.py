"""What ``debezium.truncate=apply`` adds to planning: the driver's id index checks every message for a
truncate (:func:`cdc.formats.debezium.is_truncate`). Measured against decoding the same messages
into change records (what the executors do with them anyway), in the same run, on real-shaped Debezium
envelopes (PostgreSQL connector, with and without schemas).

    python benchmarks/debezium_truncate_scan.py [messages]

The last line is ``ratio <scan time / decode time>``.
"""

from __future__ import annotations

import json
import sys
import time

from record import append_record

from cdc.backends.pulsar.records import Decoder
from cdc.formats.debezium import is_truncate

SCHEMA = json.dumps({"type": "record", "name": "items", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]},
    {"name": "qty", "type": ["null", "long"]}, {"name": "ok", "type": ["null", "boolean"]}]})


def envelope(i: int) -> bytes:
    source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1700000000000 + i,
              "snapshot": "false", "db": "app", "sequence": f'["{i}","{i + 1}"]', "ts_us": 1700000000000000 + i,
              "schema": "public", "table": "items", "txId": 900 + i, "lsn": 3000 + i, "xmin": None}
    return json.dumps({"before": None, "after": {"id": i, "name": f"row {i}", "qty": i * 10, "ok": i % 2 == 0},
                       "source": source, "transaction": None, "op": "u" if i % 3 else "c",
                       "ts_ms": 1700000000001 + i}, separators=(",", ":")).encode()


def best_of(runs: int, fn: object, payloads: list[bytes]) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        for p in payloads:
            fn(p)  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    payloads = [envelope(i) for i in range(n)]
    decoder = Decoder("debezium", SCHEMA, "id")
    scan = best_of(3, is_truncate, payloads)
    decode = best_of(3, lambda p: decoder.decode_change(p, 0), payloads)
    print(f"{n} envelopes: truncate scan {scan / n * 1e9:.0f} ns/message, decode {decode / n * 1e9:.0f} ns/message")
    append_record("debezium_truncate_scan", {"truncate scan": (scan / n * 1e9, "ns/message"), "decode": (decode / n * 1e9, "ns/message")}, ratio=scan / decode, params={"envelopes": n})
    print(f"ratio {scan / decode:.4f}")


if __name__ == "__main__":
    main()
