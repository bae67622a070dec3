"""Spark SQL functions that parse change-log record formats (see :mod:`udfs.changes`)."""

from udfs.changes import debezium, decode_plainbuffer, plainbuffer_json, register

__all__ = ["debezium", "decode_plainbuffer", "plainbuffer_json", "register"]
