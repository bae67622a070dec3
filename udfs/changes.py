"""Spark SQL functions that parse change-log record formats into the change model.

* :func:`debezium` turns a Debezium JSON change envelope (``op`` c/u/d/r, ``before``, ``after``,
  ``source.ts_ms``) into change-model columns. It is a native Spark expression (``from_json``), no Python UDF.
* :func:`plainbuffer_json` decodes a Tablestore PlainBuffer record (what the tunnel service and the
  Tablestore streams hand out, often landed raw in a lake) into a JSON document; registered for SQL as
  ``cdc_plainbuffer_json(binary)`` by :func:`cdc.register`. A record that does not decode (a bad checksum
  included) fails the query with the reason, or, with ``errors="record"``, yields
  ``{"error": "..."}`` so it can be quarantined; it is never silently dropped.

Example::

    changes = raw.select(udfs.debezium("value", "order_id long, amount double").alias("c")).select("c.*")
    spark.sql("SELECT cdc_plainbuffer_json(record) FROM raw_tunnel_records")
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from cdc.formats.debezium import DEFAULT_PLACEHOLDER, placeholder_octets
from cdc.model import COMMIT_TS, OLD_KEY, OP, UNCHANGED, Op

_DEBEZIUM_OPS = {"c": Op.INSERT.value, "u": Op.UPDATE.value, "d": Op.DELETE.value, "r": Op.SNAPSHOT.value}


def debezium(
    column: Any,
    row_schema: str | Any,
    *,
    placeholder: str = DEFAULT_PLACEHOLDER,
    keys: Sequence[str] | None = None,
    old_key: Any = None,
) -> Any:
    """A struct column ``(_op, _commit_ts, _unchanged, [_old_key,] <row columns>)`` from a Debezium JSON
    envelope column.

    ``row_schema`` is the row's schema (DDL string or ``StructType``). For a delete the row columns come
    from ``before`` (the key identifies the row); otherwise from ``after``. ``_commit_ts`` is the source's
    commit time (``source.ts_us``, ``ts_ns`` or ``ts_ms``), the top-level ``ts_ms`` only when the source has
    none. An ``op`` outside c/u/d/r (a truncate ``t`` included), a tombstone (empty value) or a payload that
    is not an envelope gives ``_op`` null: filter ``_op IS NULL`` to set them aside.

    A text or bytes column of a create or update holding Debezium's ``unavailable.value.placeholder``
    (``placeholder``: what the connector was told, Debezium's default if not given; ``hex:`` octets as
    Debezium reads it) was not sent by the database (PostgreSQL: an unchanged TOASTed value): it is null and
    named in ``_unchanged`` (see :mod:`cdc.model`), or, when the update's ``before`` image holds its value
    (``REPLICA IDENTITY FULL``), that value. With ``keys`` (the key columns) and ``old_key`` (a column
    holding the old key as Debezium's key converter wrote it: the ``__debezium.oldkey`` header Debezium puts
    on the create that ends a key change, e.g. from Kafka's ``includeHeaders``), the struct has ``_old_key``
    too: what :class:`sinks.delta.DeltaUpsertSink` takes a key change's unchanged columns from. Without the
    link such a create's unchanged columns cannot be known, and the sink fails naming them.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType, StructType

    schema = row_schema if isinstance(row_schema, StructType) else _struct(row_schema)
    envelope = _struct(
        f"op string, ts_ms long, source struct<ts_ms: long, ts_us: long, ts_ns: long>, "
        f"before {schema.simpleString()}, after {schema.simpleString()}"
    )
    col = F.col(column) if isinstance(column, str) else column
    parsed = F.from_json(col.cast("string"), envelope)
    # Debezium's JSON converter may wrap the envelope in {"schema": ..., "payload": ...}
    wrapped = F.from_json(col.cast("string"), _struct(f"payload {envelope.simpleString()}"))
    env = F.when(parsed["op"].isNotNull(), parsed).otherwise(wrapped["payload"])
    op = F.coalesce(*[F.when(env["op"] == k, F.lit(v)) for k, v in _DEBEZIUM_OPS.items()])
    is_delete = env["op"] == "d"
    row = F.when(is_delete, env["before"]).otherwise(env["after"])
    # The source's commit time, the most precise given; the top-level ts_ms is when Debezium processed it.
    source = env["source"]
    commit = F.coalesce(
        F.timestamp_micros(source["ts_us"]),
        F.timestamp_micros(F.floor(source["ts_ns"] / 1000).cast("long")),
        F.timestamp_millis(source["ts_ms"]),
        F.timestamp_millis(env["ts_ms"]),
    )
    octets = placeholder_octets(placeholder)
    forms: dict[Any, Any] = {StringType(): F.lit(octets.decode("utf-8", "replace")), BinaryType(): F.lit(octets)}
    values = []
    unsent = []
    for f in schema.fields:
        value = row[f.name]
        if f.dataType in forms and f.name not in (keys or ()):
            marker = forms[f.dataType]
            before = env["before"][f.name]
            missing = ~is_delete & F.coalesce(value == marker, F.lit(False))
            known = (env["op"] == "u") & before.isNotNull() & (before != marker)  # REPLICA IDENTITY FULL
            value = F.when(missing & known, before).when(missing, F.lit(None).cast(f.dataType)).otherwise(value)
            unsent.append(F.when(missing & ~known, F.lit(f.name)))
        values.append(value.alias(f.name))
    names = F.filter(F.array(*unsent), lambda n: n.isNotNull()) if unsent else F.array().cast("array<string>")
    fields = [op.alias(OP), commit.alias(COMMIT_TS), F.when(F.size(names) > 0, names).alias(UNCHANGED)]
    if old_key is not None:
        if not keys:
            raise ValueError("debezium(): old_key needs keys, the key columns it holds")
        key_type = StructType([schema[k] for k in keys])
        text = (F.col(old_key) if isinstance(old_key, str) else old_key).cast("string")
        key = F.coalesce(F.from_json(text, _struct(f"payload {key_type.simpleString()}"))["payload"],
                         F.from_json(text, key_type))
        fields.append(F.when(env["op"] == "c", key).alias(OLD_KEY))
    return F.struct(*fields, *values)


def _struct(ddl: str) -> Any:
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    if not isinstance(schema, StructType):
        raise ValueError(f"not a row schema: {ddl!r}")
    return schema


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    if hasattr(value, "name") and not isinstance(value, str):  # INF_MIN / INF_MAX / AUTO_INCREMENT
        return {"special": value.name}
    return value


def decode_plainbuffer(record: bytes | None, errors: str = "fail") -> str | None:
    """The JSON document of one PlainBuffer record (``None`` for ``None``)."""
    from cdc.backends.tablestore.plainbuffer import PlainBufferError, decode_row

    if record is None:
        return None
    try:
        row = decode_row(bytes(record))
    except PlainBufferError as exc:
        if errors == "record":
            return json.dumps({"error": str(exc)})
        raise
    doc: dict[str, Any] = {
        "primary_key": {k: _jsonable(v) for k, v in row.primary_key},
        "columns": {c.name: _jsonable(c.value) for c in row.cells if c.cell_type is None},
        "deleted_columns": sorted(c.name for c in row.cells if c.cell_type is not None),
        "delete_row": row.delete_marker,
    }
    if row.sequence_info is not None:
        doc["sequence"] = list(row.sequence_info)
    return json.dumps(doc, sort_keys=True)


def plainbuffer_json(column: Any, errors: str = "fail") -> Any:
    """A string column: :func:`decode_plainbuffer` applied to a binary column (Arrow-optimised UDF)."""
    from pyspark.sql import functions as F

    if errors not in ("fail", "record"):
        raise ValueError(f"errors: accepted values are 'fail' and 'record', got {errors!r}")
    _decode = F.udf(lambda r: decode_plainbuffer(r, errors), "string", useArrow=True)
    col = F.col(column) if isinstance(column, str) else column
    return _decode(col)


def register(spark: Any) -> None:
    """Register the SQL functions: ``cdc_plainbuffer_json(binary) -> string``."""
    spark.udf.register("cdc_plainbuffer_json", lambda r: decode_plainbuffer(r), "string")
