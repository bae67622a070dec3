"""backend=mysql against a real MariaDB: options, server settings and privileges refused by name, every type,
key changes, transactions and budgets, schema changes, data loss, binary log rotation, user positions, lag."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.backend import open_backend
from cdc.backends.mysql.errors import (
    MissingPrivilegeError,
    NoPrimaryKeyError,
    ServerSettingError,
    UnsupportedTransactionError,
)
from cdc.errors import BackendUnavailableError, DataLossError, OptionError, PositionError, SchemaChangedError
from cdc.planner import Planner
from cdc.testing import batches, drain, read_range
from tests.backends.mysql.harness import MySQLHarness, connect, purge_binlogs
from tests.backends.postgres.fold import fold_json, fold_typed


def _rows(tables: list[pa.Table]) -> list[dict[str, Any]]:
    return [r for t in tables for r in t.to_pylist()]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"tables": "t"}, "option 'dsn' is required"),
        ({"dsn": "mysql://u@h/db"}, "option 'tables' is required"),
        ({"dsn": "postgresql://u@h/db", "tables": "t"}, "option 'dsn'"),
        ({"dsn": "mysql://u@h/db", "tables": "a.b.c"}, "option 'tables'"),
        ({"dsn": "mysql://u@h", "tables": "t"}, "need a database in the dsn"),
        ({"dsn": "mysql://u@h/db", "tables": "t", "ssl.mode": "sometimes"}, "accepted values: disabled, preferred"),
        ({"dsn": "mysql://u@h/db", "tables": "t", "sslmode": "x"}, "did you mean 'ssl.mode'"),
    ],
)
def test_bad_options_name_the_option(raw: dict[str, str], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        open_backend("mysql", raw)


def test_password_never_in_errors_or_reprs(mysql_dsn: str) -> None:
    secret_dsn = mysql_dsn.replace("cdc@", "cdc:s3cret@")
    with pytest.raises(OptionError) as info:
        open_backend("mysql", {"dsn": secret_dsn, "tables": "t", "x": "1"})
    assert "s3cret" not in str(info.value)
    with pytest.raises(MissingPrivilegeError) as denied:  # the user has no password: a wrong one is refused
        open_backend("mysql", {"dsn": secret_dsn, "tables": "t"})
    assert "s3cret" not in str(denied.value) and denied.value.privilege == "login"
    from cdc.backends.mysql.options import MySQLOptions
    from cdc.options import parse

    options = parse(MySQLOptions, {"dsn": secret_dsn, "tables": "t"}, what="mysql")
    assert "s3cret" not in repr(options) and "s3cret" not in repr(options.endpoint)


def test_tables_without_primary_key_or_that_do_not_exist_are_refused_by_name(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn, tables=("keyed",))
    try:
        h.execute("CREATE TABLE loose (id INT, v TEXT)")
        h.execute("CREATE VIEW seen AS SELECT * FROM keyed")
        db = h.database
        with pytest.raises(NoPrimaryKeyError, match=f"'{db}.loose' has no primary key") as info:
            open_backend("mysql", {"dsn": mysql_dsn, "tables": "keyed,loose"})
        assert info.value.table == f"{db}.loose"
        with pytest.raises(OptionError, match=f"'{db}.missing' does not exist"):
            open_backend("mysql", {"dsn": mysql_dsn, "tables": "missing"})
        with pytest.raises(OptionError, match="is a view"):
            open_backend("mysql", {"dsn": mysql_dsn, "tables": "seen"})
    finally:
        h.close()


def test_server_settings_it_cannot_serve_are_refused_naming_the_fix(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        for setting, bad, good in (("binlog_format", "'STATEMENT'", "'ROW'"),
                                   ("binlog_row_image", "'MINIMAL'", "'FULL'"),
                                   ("binlog_row_metadata", "'MINIMAL'", "'FULL'"),
                                   ("log_bin_compress", "ON", "OFF")):
            h.execute(f"SET GLOBAL {setting} = {bad}")
            try:
                with pytest.raises(ServerSettingError, match=f"SET GLOBAL {setting} = ") as info:
                    open_backend("mysql", h.options)
                assert info.value.setting == setting
            finally:
                h.execute(f"SET GLOBAL {setting} = {good}")
        open_backend("mysql", h.options).close()
    finally:
        h.close()


def test_missing_replication_privileges_are_named_with_the_grant(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    user = f"reader_{h.database}"[:32]
    try:
        h.execute(f"CREATE USER '{user}'@'127.0.0.1'")
        h.execute(f"GRANT SELECT ON `{h.database}`.* TO '{user}'@'127.0.0.1'")
        options = {**h.options, "dsn": mysql_dsn.replace("cdc@", f"{user}@")}
        with pytest.raises(MissingPrivilegeError, match="GRANT BINLOG MONITOR ON") as info:
            open_backend("mysql", options)
        assert info.value.privilege == "BINLOG MONITOR"
        h.execute(f"GRANT BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'")
        with pytest.raises(MissingPrivilegeError, match="GRANT REPLICATION SLAVE ON") as info:
            open_backend("mysql", options)
        assert info.value.privilege == "REPLICATION SLAVE"
        h.execute(f"GRANT REPLICATION SLAVE ON *.* TO '{user}'@'127.0.0.1'")
        h.append(3)
        assert sum(t.num_rows for t in drain(open_backend("mysql", options))) == 3
    finally:
        h.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        h.close()


KINDS = """CREATE TABLE kinds (
  k VARCHAR(40) PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, miu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  d1 DECIMAL(10,2), d2 DECIMAL(38,10), d3 DECIMAL(65,30), f FLOAT, dbl DOUBLE,
  b1 BIT(1), b12 BIT(12), yr YEAR,
  day DATE, dtm DATETIME, dtm6 DATETIME(6), dtm3 DATETIME(3), ts TIMESTAMP(6) NULL DEFAULT NULL,
  tm TIME, tm6 TIME(6), e ENUM('a','b','c'), st SET('x','y','z'),
  j JSON, bl BLOB, tx TEXT, vb VARBINARY(10), fb BINARY(4), ch CHAR(5), lt VARCHAR(10) CHARACTER SET latin1, big LONGTEXT
)"""
TEXT_KEY = 'max "q" \\ \'é'
BIG = "".join(chr(65 + (i * 7919) % 26) for i in range(100_000))
MAX_ROW = {
    "k": TEXT_KEY, "ti": -128, "tiu": 255, "si": -32768, "siu": 65535, "mi": -8388608, "miu": 16777215,
    "i": -2147483648, "iu": 4294967295, "bi": -9223372036854775808, "biu": Decimal(18446744073709551615),
    "d1": Decimal("-12345678.90"), "d2": Decimal("1234567890123456789012345678.0123456789"),
    "d3": "12345678901234567890123456789012345.000000000000000000000000000001", "f": 1.5, "dbl": 2.25,
    "b1": True, "b12": b"\x0a\x03", "yr": 2024, "day": dt.date(2024, 2, 29),
    "dtm": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    "dtm6": dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
    "dtm3": dt.datetime(1000, 1, 1, 0, 0, 0, 500000, tzinfo=dt.UTC),
    "ts": dt.datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=dt.UTC),  # written at +02:00
    "tm": "-838:59:59", "tm6": "12:34:56.000001", "e": "b", "st": "x,z", "j": '{"a": [1, "é"]}',
    "bl": b"\x00\xff\x10", "tx": "😀 utf8mb4", "vb": b"\x01\x02", "fb": b"a\x00b\x00", "ch": "ab", "lt": "café",
    "big": BIG,
}


def _insert(h: MySQLHarness, row: dict[str, Any]) -> None:
    names = ", ".join(row)
    values = []
    for k, v in row.items():
        if k == "b1":
            values.append(1 if v else 0)
        elif k == "b12":
            values.append(int.from_bytes(v, "big"))
        elif isinstance(v, dt.datetime) and k == "ts":
            values.append("2024-01-02 03:04:05.500000")
        elif isinstance(v, dt.datetime):
            values.append(v.replace(tzinfo=None).isoformat(sep=" "))
        else:
            values.append(v)
    h.execute(f"INSERT INTO kinds ({names}) VALUES ({', '.join(['%s'] * len(values))})", values)


def test_every_type_zero_dates_and_text_keys(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn, tables=("kinds",), create=False)
    try:
        h.execute(KINDS)
        h.execute("SET SESSION time_zone = '+02:00'")
        _insert(h, MAX_ROW)
        h.execute("INSERT INTO kinds (k) VALUES ('nulls')")
        h.execute("SET SESSION sql_mode = ''")  # zero dates and invalid labels, as old applications write them
        h.execute("INSERT INTO kinds (k, day, dtm, dtm6, ts, e, st, yr) VALUES ('zero', '0000-00-00', "
                  "'0000-00-00 00:00:00', '2024-00-10 00:00:00', '0000-00-00 00:00:00', 'zz', '', 0)")
        h.execute("UPDATE kinds SET k = 'moved' WHERE k = 'nulls'")  # a key change: delete, then insert
        h.execute("DELETE FROM kinds WHERE k = 'zero'")
        backend = h.backend()
        schema = backend.schema()
        assert [str(schema.field(c).type) for c in ("tiu", "miu", "iu", "biu", "d2", "d3", "b1", "b12", "tm")] == [
            "int16", "int32", "int64", "decimal128(20, 0)", "decimal128(38, 10)", "string", "bool", "binary",
            "string"]
        rows = _rows(list(drain(backend)))
        assert [(r["_op"], r["k"]) for r in rows] == [
            ("insert", TEXT_KEY), ("insert", "nulls"), ("insert", "zero"), ("delete", "nulls"), ("insert", "moved"),
            ("delete", "zero")]
        assert {k: rows[0][k] for k in MAX_ROW} == MAX_ROW
        assert all(v is None for k, v in rows[1].items() if not k.startswith("_") and k != "k")
        zero = rows[2]
        assert (zero["day"], zero["dtm"], zero["dtm6"], zero["ts"]) == (None, None, None, None)  # zero dates: null
        assert (zero["e"], zero["st"], zero["yr"]) == ("", "", 0)  # the invalid label, the empty set, YEAR 0000
        assert rows[5]["ti"] is None and rows[5]["k"] == "zero"  # a delete carries its key only
        assert [r["_seq"] for r in rows] == sorted(r["_seq"] for r in rows) == [r["_position"] for r in rows]
        assert all(r["_commit_ts"].tzinfo is not None for r in rows)
    finally:
        h.close()


def test_many_tables_carry_table_key_and_row_as_json_and_an_added_column_flows(
    mysql_dsn: str, tmp_path: Path
) -> None:
    from sinks.routing import RoutingDeltaSink

    h = MySQLHarness(mysql_dsn, tables=("orders", "customers"))
    db = h.database
    try:
        h.execute("INSERT INTO orders VALUES (1, 'o', 1), (2, 'p', 2)")
        h.execute("INSERT INTO customers VALUES (1, 'c\\\\\"', 2)")
        sink = RoutingDeltaSink(str(tmp_path / "lake"))
        got = list(batches(h.backend()))
        for i, (_, table) in enumerate(got):
            sink.write(table, i, "q")
        backend = h.backend()  # opened before the change: it keeps running across it
        h.execute("ALTER TABLE customers ADD COLUMN city VARCHAR(20)")
        h.execute("INSERT INTO customers VALUES (2, 'd', 3, 'Oslo')")
        h.execute("UPDATE customers SET city = 'Bergen' WHERE id = 1")
        h.execute("DELETE FROM orders WHERE id = 1")
        more = list(batches(backend, got[-1][0]))
        for i, (_, table) in enumerate(more, start=len(got)):
            sink.write(table, i, "q")
        rows = _rows([t for _, t in got + more])
        assert [(r["_table"], r["_op"]) for r in rows] == [
            (f"{db}.orders", "insert"), (f"{db}.orders", "insert"), (f"{db}.customers", "insert"),
            (f"{db}.customers", "insert"), (f"{db}.customers", "update"), (f"{db}.orders", "delete")]
        assert rows[0]["_key"] == '{"id":1}' and rows[-1]["_row"] is None
        assert json.loads(rows[2]["_row"]) == {"id": 1, "v": 'c\\"', "n": 2}
        assert fold_json([t for _, t in got + more]) == {
            (f"{db}.orders", '{"id":2}'): {"id": 2, "v": "p", "n": 2},
            (f"{db}.customers", '{"id":1}'): {"id": 1, "v": 'c\\"', "n": 2, "city": "Bergen"},
            (f"{db}.customers", '{"id":2}'): {"id": 2, "v": "d", "n": 3, "city": "Oslo"},  # the added column
        }
        from deltalake import DeltaTable

        for t in ("orders", "customers"):
            lake = sorted(({k: v for k, v in r.items() if not k.startswith("_")}
                           for r in DeltaTable(sink.path(f"{db}.{t}")).to_pyarrow_table().to_pylist()),
                          key=lambda r: r["id"])
            names = [r[0] for r in h.rows(f"SHOW COLUMNS FROM {t}")]
            assert lake == [dict(zip(names, r, strict=True)) for r in h.rows(f"SELECT * FROM {t} ORDER BY id")]
    finally:
        h.close()


def test_a_typed_query_stops_on_an_added_column_and_a_restart_reads_the_new_schema(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        h.append(2)
        backend = h.backend()
        h.execute("ALTER TABLE items ADD COLUMN extra INT")
        h.execute("INSERT INTO items VALUES (100, 'x', 1, 7)")
        start = backend.earliest("changes")
        end = backend.plan("changes", start).end
        with pytest.raises(SchemaChangedError, match="column 'extra' was added .* restart the query") as info:
            read_range(backend, "changes", start, end)
        assert info.value.table == f"{h.database}.items"
        restarted = h.backend()  # a restart reads the new schema; the rows from before it have no value there
        assert "extra" in restarted.schema().names
        state = fold_typed(list(drain(restarted)), ("id",))
        assert state == {(0,): {"id": 0, "v": "v0", "n": 0, "extra": None},
                         (1,): {"id": 1, "v": "v1", "n": 1, "extra": None},
                         (100,): {"id": 100, "v": "x", "n": 1, "extra": 7}}
    finally:
        h.close()


@pytest.mark.parametrize("tables", [("items",), ("items", "other")], ids=["typed", "json"])
def test_a_rename_or_a_type_change_fails_naming_table_and_column(mysql_dsn: str, tables: tuple[str, ...]) -> None:
    h = MySQLHarness(mysql_dsn, tables=tables)
    try:
        h.append(1)
        backend = h.backend()
        h.execute("ALTER TABLE items RENAME COLUMN v TO w")
        h.append(1)
        with pytest.raises(SchemaChangedError, match=f"{h.database}.items.*column 'w' came in as 'v' went out"):
            list(drain(backend))
        h.execute("ALTER TABLE items RENAME COLUMN w TO v, MODIFY n BIGINT")
        start = backend.latest("changes")
        h.append(1)
        end = backend.latest("changes")
        with pytest.raises(SchemaChangedError, match=r"column 'n' changed type from int\(4 bytes\) to int\(8 bytes\)"):
            read_range(backend, "changes", start, end)
    finally:
        h.close()


def test_a_transaction_is_never_split_and_a_large_one_is_taken_whole(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        h.txn_size = 4
        h.append(12)  # three transactions of four
        h.txn_size = 30
        h.append(30)
        h.execute("FLUSH BINARY LOGS")  # and the next transactions in a new file: batches cross the rotation
        h.txn_size = 5
        h.append(10)
        backend = h.backend()
        got = list(batches(backend, limit=6))
        assert [t.num_rows for _, t in got] == [4, 4, 4, 30, 5, 5]
        for end, _ in got:  # every end lies between transactions: the boundary check accepts it as a position
            assert backend.parse_position("changes", end["channels"]["changes"]["pos"]) == end["channels"]["changes"]["pos"]
        ids = [i for _, t in got for i in t.column("id").to_pylist()]
        assert ids == list(range(52))
        assert backend.plan("changes", backend.earliest("changes"), max_records=6).records == 4  # exact with a budget
    finally:
        h.close()


def test_a_purged_binary_log_is_data_loss_and_failondataloss_false_skips(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        h.append(3)
        backend = h.backend()
        start = Planner(backend).initial("earliest")
        end = Planner(backend).next(start)
        purge_binlogs(h.conn)  # the server expired the files the query still needs
        h.append(2)
        with pytest.raises(DataLossError, match="no longer on the server"):
            Planner(backend).next(start)
        with pytest.raises(DataLossError, match="no longer on the server"):
            list(drain(backend, start))
        with pytest.raises(DataLossError):  # a planned batch replayed after the purge
            read_range(backend, "changes", start["channels"]["changes"]["pos"], end["channels"]["changes"]["pos"])
        skipped = Planner(backend, fail_on_data_loss=False).next(start)
        rows = sum(read_range(backend, r.channel, r.start, r.end).num_rows for r in Planner.ranges(start, skipped))
        assert rows == 2
    finally:
        h.close()


def test_positions_given_by_the_user(mysql_dsn: str, mariadb_server: Any) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        h.txn_size = 2
        h.append(2)
        backend = h.backend()
        middle = backend.latest("changes")
        gtid = h.rows("SELECT @@gtid_binlog_pos")[0][0]
        h.append(4)
        name, offset = h.rows("SHOW BINARY LOGS")[-1][0], middle & 0xFFFFFFFF
        for given in (middle, f"{name}:{offset}", gtid):
            start = backend.parse_position("changes", given)
            assert start == middle, given
            assert read_range(backend, "changes", start, backend.latest("changes")).column("id").to_pylist() == [
                2, 3, 4, 5]
        inside = read_range(backend, "changes", middle, backend.latest("changes")).column("_position")[2].as_py()
        with pytest.raises(PositionError, match="inside a transaction"):
            backend.parse_position("changes", inside)
        with pytest.raises(PositionError, match="MySQL GTID set"):
            backend.parse_position("changes", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5")
        with pytest.raises(PositionError, match="not the start of a binary log event"):
            backend.parse_position("changes", middle + 3)
        with pytest.raises(PositionError):
            backend.parse_position("changes", "0-1-999999999")  # a GTID the server never wrote
        with pytest.raises(PositionError):
            backend.parse_position("changes", {"not": "a position"})
    finally:
        h.close()


def test_sessions_that_override_the_format_and_xa_transactions_fail_clearly(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        h.append(1)
        backend = h.backend()
        for setting, statement in (("binlog_format", "SET SESSION binlog_format = 'STATEMENT'"),
                                   ("binlog_row_image", "SET SESSION binlog_row_image = 'MINIMAL'")):
            start = backend.latest("changes")
            other = connect(h.dsn)
            with other.cursor() as cur:
                cur.execute(statement)
                cur.execute("UPDATE items SET n = n + 1 WHERE id = 0")
            other.close()
            with pytest.raises(ServerSettingError, match=setting) as info:
                read_range(backend, "changes", start, backend.latest("changes"))
            assert info.value.setting == setting
        start = backend.latest("changes")
        h.execute("XA START 'x1'")
        h.execute("INSERT INTO items VALUES (50, 'xa', 0)")
        h.execute("XA END 'x1'")
        h.execute("XA PREPARE 'x1'")
        h.execute("XA COMMIT 'x1'")
        with pytest.raises(UnsupportedTransactionError, match="XA transaction"):
            read_range(backend, "changes", start, backend.latest("changes"))
    finally:
        h.close()


def test_lag_in_binlog_bytes_and_gtids(mysql_dsn: str) -> None:
    h = MySQLHarness(mysql_dsn)
    try:
        backend = h.backend()
        planner = Planner(backend)
        start = planner.initial("latest")
        pos = start["channels"]["changes"]["pos"]
        h.append(200)
        behind = backend.heads({"changes": pos})["changes"]
        assert behind.measures["binlogBytesBehind"] > 200 * 20 and behind.measures["gtidBehind"] == 200
        end = planner.next(start, None)
        caught_up = backend.heads({"changes": end["channels"]["changes"]["pos"]})["changes"]
        assert caught_up.measures == {"binlogBytesBehind": 0.0, "gtidBehind": 0.0} and caught_up.behind == 0
    finally:
        h.close()


def test_tls_required_from_a_server_without_tls_fails_clearly(mysql_dsn: str) -> None:
    with pytest.raises(BackendUnavailableError, match="ssl.mode=required"):
        open_backend("mysql", {"dsn": mysql_dsn, "tables": "items", "ssl.mode": "required"})
