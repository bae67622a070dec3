"""Decoding PostgreSQL changes in-process: the column-wise decoder (``cdc/backends/postgres/changes.py``)
against the one it replaced (frozen in ``benchmarks/pgoutput_reference.py``), on the same messages.

A PostgreSQL started on loopback by this script takes ``--changes`` row changes (50k by default) in
transactions of 1-20 statements on a typed table (bigint key, text, numeric(12,2), int, bool, timestamptz,
date, float8 with nulls, and a large text that 10% of the rows carry, stored out of line, so that updates
of other columns send it as unchanged TOAST): 40% inserts, 35% updates of one int, 10% updates of two
columns, 10% deletes, 5% key changes (a delete and an insert each). The slot's messages are peeked once
(timed: PostgreSQL's own logical decoding and the transfer), then both decoders turn the same messages
into Arrow batches, alternately, best of ``--repeat``; the results must be equal. Printed too: planning's
count of the range (:func:`cdc.backends.postgres.connection.transaction_sizes`, decoded by PostgreSQL again) and
a whole in-process read (peek and decode), to show where a read's time goes. ``--profile`` prints each
decoder's cProfile. Last line: ``ratio <new decoder's changes/s / old decoder's changes/s>``.

    python benchmarks/postgres_decode.py [--changes 50000] [--repeat 3] [--profile]
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from record import append_record

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKLOAD = """
DO $$
DECLARE done int := 0; got int; n int; k bigint; r float8; top bigint := 0;
BEGIN
  WHILE done < %(changes)s LOOP
    n := 1 + floor(random() * 20)::int;
    FOR j IN 1..n LOOP
      r := random();
      k := 1 + floor(random() * greatest(top, 1))::bigint;
      IF r < 0.40 OR top < 100 THEN
        top := top + 1;
        INSERT INTO orders VALUES (top, 'customer-' || top, round((random() * 1000)::numeric, 2),
          floor(random() * 10)::int, random() < 0.5, now(), current_date,
          CASE WHEN random() < 0.2 THEN NULL ELSE random() END,
          CASE WHEN random() < 0.1 THEN (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 125))
          END);
      ELSIF r < 0.75 THEN
        UPDATE orders SET qty = qty + 1 WHERE id = k;
      ELSIF r < 0.85 THEN
        UPDATE orders SET amount = amount + 1, customer = customer || 'x' WHERE id = k;
      ELSIF r < 0.95 THEN
        DELETE FROM orders WHERE id = k;
      ELSE
        UPDATE orders SET id = id + 10000000 WHERE id = k;
      END IF;
      GET DIAGNOSTICS got = ROW_COUNT;
      done := done + got;
    END LOOP;
    COMMIT;
  END LOOP;
END $$;
"""


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return min(times), out


def profile(fn: Callable[[], Any], title: str) -> None:
    prof = cProfile.Profile()
    prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    print(f"--- cProfile: {title} (by own time)")
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


@click.command()
@click.option("--changes", default=50_000, show_default=True, help="Row changes to decode.")
@click.option("--repeat", default=3, show_default=True, help="Runs of each decoder; the best counts.")
@click.option("--profile", "with_profile", is_flag=True, help="Print each decoder's cProfile.")
def main(changes: int, repeat: int, with_profile: bool) -> None:
    import psycopg
    import pyarrow as pa

    from benchmarks.pgoutput_reference import old_read
    from cdc.backend import open_backend
    from cdc.backends.postgres import connection
    from cdc.backends.postgres.changes import decode_changes
    from cdc.backends.postgres.positions import lsn_of
    from cdc.servers.postgres import PostgresServer

    with PostgresServer() as pg:
        dsn = pg.create_database("decode")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric(12,2), qty int, "
                         "paid bool, placed timestamptz, day date, score float8, note text)")
        backend = open_backend("postgres", {"dsn": dsn, "tables": "orders", "slot.name": "decode"})
        backend.prepare_start()
        began = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(WORKLOAD.replace("%(changes)s", str(changes)).encode())
        print(f"workload: {time.perf_counter() - began:.1f} s")
        start, end = backend.earliest("changes"), backend.latest("changes")
        slot, publication, layout = backend.slot, backend.publication, backend.layout  # type: ignore[attr-defined]
        with connection.connect(dsn) as conn:
            planned, sizes = best(lambda: list(connection.transaction_sizes(conn, slot, publication, start, lsn_of(end))), 1)
            peeked, rows = best(lambda: list(connection.peek(conn, slot, publication, lsn_of(end))), 1)
        n = sum(s for _, s in sizes)
        print(f"{len(rows):,} messages, {len(sizes):,} transactions, {n:,} change records counted by planning")

        def old() -> list[pa.RecordBatch]:
            return old_read(rows, layout, "changes", start, end)

        def new() -> list[pa.RecordBatch]:
            return list(decode_changes(rows, layout, "changes", start, end))

        old_s, new_s = float("inf"), float("inf")
        for _ in range(repeat):  # alternately: load on the shared machine hits both alike
            t, old_out = best(old, 1)
            old_s = min(old_s, t)
            t, new_out = best(new, 1)
            new_s = min(new_s, t)
        expected = pa.Table.from_batches(old_out).cast(layout.arrow_schema())
        got = pa.Table.from_batches(new_out)
        assert got.equals(expected), "the decoders disagree"
        records = got.num_rows
        unchanged = records - got.column("_unchanged").null_count
        reader = backend.reader()
        read_s, _ = best(lambda: sum(b.num_rows for b in reader.read("changes", start, end)), repeat)
        backend.acknowledge({"changes": end})
        backend.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            connection.drop_slot(conn, slot)

    def us(seconds: float) -> str:
        return f"{seconds / records * 1e6:5.1f} us/change ({records / seconds:9,.0f} changes/s)"

    print(f"{records:,} change records ({unchanged:,} with unchanged TOAST columns)")
    print(f"planning's count (PostgreSQL decodes, SQL counts) {us(planned)}")
    print(f"peek: PostgreSQL decodes, sends the messages      {us(peeked)}")
    print(f"old decoder (per-message objects, records)        {us(old_s)}")
    print(f"new decoder (column-wise)                         {us(new_s)}")
    print(f"whole read in-process (peek + new decoder)        {us(read_s)}")
    if with_profile:
        profile(old, "old decoder")
        profile(new, "new decoder")
    append_record("postgres_decode", {"old decoder": (old_s / records * 1e6, "us/change"), "new decoder": (new_s / records * 1e6, "us/change"), "peek": (peeked / records * 1e6, "us/change"), "planning's count": (planned / records * 1e6, "us/change")}, ratio=old_s / new_s, params={"changes": records})
    print(f"ratio {old_s / new_s:.2f}")


if __name__ == "__main__":
    main()
