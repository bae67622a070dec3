"""MySQL/MariaDB source throughput: the changes of a binary log read by the cdc source into Spark's ``noop`` sink,
against ``mysql-replication`` alone decoding the same binary log into the same Arrow columns; and, when its jars
resolve, Debezium's MariaDB connector (embedded engine) reading the same changes on the same server.

The benchmark starts its own MariaDB (Debian's ``mariadb-server``) on loopback and writes ``--changes`` changes
to ``bench`` (id, name, amount DECIMAL(12,2), at DATETIME(6), n INT): half inserts, half updates, in
transactions of ``--txn`` rows. Each round, back to back:

* ``mysql-replication``: ``BinLogStreamReader`` from the changes' first position, non-blocking, its rows
  events decoded into the columns the source returns (``_op``, ``_seq``, ``_commit_ts``, ``_channel``,
  ``_position`` and the typed table columns) and one Arrow table built from them;
* ``cdc``: a batch read (``spark.read``) of the same range (``startingOffsets``/``endingOffsets`` at the
  changes' first and last positions) into ``noop``: planning on the driver and reading in a Spark task
  included; Spark's session start and a warm-up job excluded.

Each round's ratio is ``cdc rows/s / mysql-replication rows/s``; the median of the rounds' ratios is the last
line, ``ratio <median>`` (target >= 0.8). Debezium (``--debezium``, default on): the embedded engine with
``snapshot.mode=never`` reads the binary log from its beginning (which holds the table's creation and the
changes), in Kafka Connect's record form (no serialisation); its rate is from its first change event to its
last, so its start-up is excluded.

The snapshot (``--snapshot-rows``, default 1M; 0 skips it): a table ``snap`` of the same columns, read by a
streaming query with ``startingOffsets=snapshot`` (default chunk options) under ``Trigger.AvailableNow`` into
``noop`` (query start included, Spark's session start excluded), against the ``mariadb`` client's ``--quick
--batch`` ``SELECT *`` of the same table to ``/dev/null``; ``snapshot/client <median ratio>`` (target >= 0.5),
recorded as ``mysql_snapshot``. The changes' ``ratio`` stays the last line.

    python benchmarks/mysql_source.py            # 200k changes, 1M snapshot rows, 3 rounds
    python benchmarks/mysql_source.py --quick    # 40k changes, 200k snapshot rows, 3 rounds, no Debezium
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from record import append_record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

COLUMNS = ("id", "name", "amount", "at", "n")
DEBEZIUM = ROOT / "benchmarks" / "debezium_mariadb"
MAVEN_REPO = Path(os.environ.get("CDC_MAVEN_REPO", Path.home() / ".cache" / "cdc-tunnel" / "m2"))


def write_changes(server: Any, changes: int, txn: int) -> tuple[str, int, int]:
    """Create ``bench`` and write the changes; returns (database DSN, first position, end position)."""
    import pymysql

    from cdc.backends.mysql.positions import file_number, pack

    dsn = server.create_database("shop")
    conn = pymysql.connect(**server.connect_args("shop"))
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE bench (id BIGINT PRIMARY KEY, name VARCHAR(64), amount DECIMAL(12,2), "
                    "at DATETIME(6), n INT)")
        cur.execute("SHOW MASTER STATUS")
        name, offset = cur.fetchone()[:2]
        start = pack(file_number(name), offset)
        inserts = changes // 2
        for lo in range(1, inserts + 1, txn):
            hi = min(inserts, lo + txn - 1)
            cur.execute(f"INSERT INTO bench SELECT seq, CONCAT('customer-', seq), seq * 1.25, NOW(6), seq % 1000 "
                        f"FROM seq_{lo}_to_{hi}")
        for lo in range(1, changes - inserts + 1, txn):
            cur.execute("UPDATE bench SET n = n + 1, amount = amount + 1 WHERE id BETWEEN %s AND %s",
                        (lo, min(changes - inserts, lo + txn - 1)))
        cur.execute("SHOW MASTER STATUS")
        name, offset = cur.fetchone()[:2]
    conn.close()
    return dsn, start, pack(file_number(name), offset)


def replication_alone(server: Any, start: int) -> tuple[float, int]:
    """``mysql-replication`` decoding the changes into the source's Arrow columns: (seconds, rows)."""
    import pyarrow as pa
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from cdc.backends.mysql.positions import file_of, offset_of

    settings = {k: v for k, v in server.connect_args().items() if k != "autocommit"}
    began = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings=settings, server_id=4242, log_file=f"binlog.{file_of(start):06d}",
        log_pos=offset_of(start), resume_stream=True, blocking=False, enable_logging=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent], only_schemas=["shop"], only_tables=["bench"])
    ops: list[str] = []
    positions: list[int] = []
    times: list[int] = []
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    file = file_of(start)
    for event in stream:
        base = (file << 32) | (event.packet.log_pos - event.packet.event_size)
        op = "insert" if isinstance(event, WriteRowsEvent) else "update" if isinstance(event, UpdateRowsEvent) else "delete"
        for i, row in enumerate(event.rows):
            values = row.get("after_values", row.get("values"))
            for c in COLUMNS:
                cols[c].append(values[c])
            ops.append(op)
            positions.append(base + i)
            times.append(event.timestamp * 1_000_000)
    stream.close()
    pos = pa.array(positions, pa.int64())
    table = pa.table({
        "_op": pa.array(ops, pa.string()), "_seq": pos,
        "_commit_ts": pa.array(times, pa.timestamp("us", tz="UTC")),
        "_channel": pa.repeat(pa.scalar("changes"), len(ops)), "_position": pos,
        "id": pa.array(cols["id"], pa.int64()), "name": pa.array(cols["name"], pa.string()),
        "amount": pa.array(cols["amount"], pa.decimal128(12, 2)),
        "at": pa.array(cols["at"], pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC")),
        "n": pa.array(cols["n"], pa.int32()),
    })
    return time.perf_counter() - began, table.num_rows


def write_table(server: Any, rows: int) -> str:
    """Create ``snap`` with ``rows`` rows in a database of its own; returns its DSN."""
    import pymysql

    dsn = server.create_database("snapshot")
    conn = pymysql.connect(**server.connect_args("snapshot"))
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE snap (id BIGINT PRIMARY KEY, name VARCHAR(64), amount DECIMAL(12,2), "
                    "at DATETIME(6), n INT)")
        for lo in range(1, rows + 1, 100_000):
            hi = min(rows, lo + 99_999)
            cur.execute(f"INSERT INTO snap SELECT seq, CONCAT('customer-', seq), seq * 1.25, NOW(6), seq % 1000 "
                        f"FROM seq_{lo}_to_{hi}")
    conn.close()
    return str(dsn)


def client_select(server: Any) -> float:
    """The ``mariadb`` client's ``--quick --batch`` ``SELECT *`` of ``snap`` to /dev/null: seconds."""
    client = shutil.which("mariadb") or shutil.which("mysql")
    assert client, "the mariadb client is not on PATH (apt-get install mariadb-client)"
    began = time.perf_counter()
    subprocess.run([client, "--quick", "--batch", "--protocol=TCP", "-h", server.host, "-P", str(server.port), "-u",
                    "cdc", "snapshot", "-e", "SELECT * FROM snap"], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def cdc_snapshot_noop(spark: Any, dsn: str, work: Path) -> tuple[float, int]:
    """A chunked snapshot of ``snap`` into ``noop`` with Trigger.AvailableNow: (seconds, rows)."""
    shutil.rmtree(work, ignore_errors=True)
    began = time.perf_counter()
    query = (spark.readStream.format("cdc").option("backend", "mysql").option("dsn", dsn).option("tables", "snap")
             .option("startingOffsets", "snapshot").option("snapshot.path", str(work / "snapshot")).load()
             .writeStream.format("noop").option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - began
    return seconds, sum(int(p["numInputRows"]) for p in query.recentProgress)


def cdc_noop(spark: Any, options: dict[str, str]) -> tuple[float, int]:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observed = Observation("rows")
    reader = spark.read.format("cdc").option("backend", "mysql")
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load().observe(observed, F.count(F.lit(1)).alias("n"))
    began = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began, int(observed.get["n"])


def debezium_rate(server: Any, changes: int) -> float | None:
    """Debezium's MariaDB connector reading the changes: change events per second, first to last; None when its
    engine cannot be built here (the reason is printed)."""
    if shutil.which("mvn") is None or shutil.which("java") is None:
        print("debezium: skipped (no mvn or java on PATH)")
        return None
    build = subprocess.run(["mvn", "-B", "-q", "--no-transfer-progress", "-f", str(DEBEZIUM / "pom.xml"),
                            f"-Dmaven.repo.local={MAVEN_REPO}", "package"], capture_output=True, text=True)
    if build.returncode != 0:
        print(f"debezium: skipped (its engine did not build: {build.stdout[-500:]}{build.stderr[-500:]})")
        return None
    classpath = (DEBEZIUM / "target" / "classpath.txt").read_text().strip()
    jar = next((DEBEZIUM / "target").glob("debezium-mariadb-bench-*.jar"))
    with tempfile.TemporaryDirectory() as tmp:
        props = Path(tmp) / "engine.properties"
        props.write_text("\n".join(f"{k}={v}" for k, v in {
            "name": "bench", "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
            "database.hostname": server.host, "database.port": server.port, "database.user": "cdc",
            "database.password": "", "database.server.id": "5501", "topic.prefix": "bench",
            "database.include.list": "shop", "table.include.list": "shop.bench", "snapshot.mode": "never",
            "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
            "schema.history.internal": "io.debezium.relational.history.MemorySchemaHistory",
            "max.batch.size": "8192", "max.queue.size": "32768", "decimal.handling.mode": "precise",
        }.items()))
        out = subprocess.run(["java", "-Xmx1g", "-cp", f"{jar}{os.pathsep}{classpath}", "cdctunnel.CountChanges",
                              str(props), str(changes)], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        print(f"debezium: failed ({out.stderr[-1500:]})")
        return None
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["events"]) / max(1e-9, result["seconds"])


@click.command()
@click.option("--changes", default=200_000, show_default=True, help="changes written (half inserts, half updates)")
@click.option("--txn", default=100, show_default=True, help="rows per transaction")
@click.option("--rounds", default=3, show_default=True, help="paired rounds (the ratio is the median of theirs)")
@click.option("--debezium/--no-debezium", default=True, show_default=True, help="also run Debezium's connector")
@click.option("--snapshot-rows", default=1_000_000, show_default=True, help="rows of the snapshot's table (0: skip)")
@click.option("--quick", is_flag=True, help="40k changes, 200k snapshot rows, no Debezium.")
def main(changes: int, txn: int, rounds: int, debezium: bool, snapshot_rows: int, quick: bool) -> None:
    import cdc
    from cdc.servers.mysql import MariaDBServer
    from tests.conftest import spark_builder

    if quick:
        changes, debezium, snapshot_rows = 40_000, False, min(snapshot_rows, 200_000)
    with MariaDBServer() as server:
        began = time.perf_counter()
        dsn, start, end = write_changes(server, changes, txn)
        print(f"wrote {changes:,} changes in transactions of {txn} in {time.perf_counter() - began:.1f} s")
        spark = spark_builder("mysql-source-benchmark").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        cdc.register(spark)
        options = {"dsn": dsn, "tables": "bench", "startingOffsets": json.dumps({"changes": start}),
                   "endingOffsets": json.dumps({"changes": end})}
        warm_end = json.dumps({"changes": start})  # nothing: starts the Python workers
        cdc_noop(spark, {**options, "endingOffsets": warm_end})
        ratios, ours, refs = [], [], []
        for r in range(rounds):
            seconds, n = replication_alone(server, start)
            assert n == changes, (n, changes)
            ref = n / seconds
            seconds, n = cdc_noop(spark, options)
            assert n == changes, (n, changes)
            rate = n / seconds
            ratios.append(rate / ref)
            ours.append(rate)
            refs.append(ref)
            print(f"round {r + 1}: mysql-replication {ref:,.0f} rows/s, cdc -> noop {rate:,.0f} rows/s, "
                  f"ratio {rate / ref:.3f} (load {os.getloadavg()[0]:.1f})")
        if snapshot_rows:
            snap_dsn = write_table(server, snapshot_rows)
            snap_ratios, snap_ours, snap_refs = [], [], []
            with tempfile.TemporaryDirectory() as tmp:
                for r in range(rounds):
                    ref_seconds = client_select(server)
                    seconds, n = cdc_snapshot_noop(spark, snap_dsn, Path(tmp) / f"round-{r}")
                    assert n == snapshot_rows, (n, snapshot_rows)
                    snap_ratios.append(ref_seconds / seconds)
                    snap_ours.append(n / seconds)
                    snap_refs.append(n / ref_seconds)
                    print(f"snapshot round {r + 1}: mariadb client {n / ref_seconds:,.0f} rows/s, cdc snapshot -> "
                          f"noop {n / seconds:,.0f} rows/s, ratio {ref_seconds / seconds:.3f} "
                          f"(load {os.getloadavg()[0]:.1f})")
            snap_ratio = statistics.median(snap_ratios)
            append_record("mysql_snapshot", {"cdc snapshot -> noop": (statistics.median(snap_ours), "rows/s"),
                                             "mariadb --quick --batch": (statistics.median(snap_refs), "rows/s")},
                          ratio=snap_ratio, target=">= 0.5", params={"rows": snapshot_rows, "rounds": rounds})
            print(f"snapshot/client {snap_ratio:.3f}")
        spark.stop()
        figures: dict[str, Any] = {"cdc -> noop": (statistics.median(ours), "rows/s"),
                                   "mysql-replication": (statistics.median(refs), "rows/s")}
        if debezium:
            rate = debezium_rate(server, changes)
            if rate is not None:
                figures["debezium mariadb connector"] = (rate, "rows/s")
                print(f"debezium mariadb connector (embedded, 3.5.0.Final): {rate:,.0f} rows/s")
    ratio = statistics.median(ratios)
    print(f"load {os.getloadavg()}, cores {os.cpu_count()}")
    print(f"changes/mysql-replication {ratio:.3f}")
    append_record("mysql_source", figures, ratio=ratio, target=">= 0.8",
                  params={"changes": changes, "txn": txn, "rounds": rounds, "debezium": debezium})
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
