"""The service's documented limits, enforced as the service enforces them (``OTSParameterInvalid``).

The numbers and their sources are listed in one table in this package's ``README.md``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cdc.backends.tablestore.plainbuffer import Cell, PrimaryKeyValue, Special

from .errors import param_invalid

DEFAULT_IDLE_TIMEOUT_S = 60.0
"""A connection idle (between calls, or half-way through a request) this long is closed."""
DEFAULT_MAX_CONNECTIONS = 64
"""Connections served at once; more get 503 ``OTSServerBusy``."""

KB = 1024
MB = 1024 * KB

MAX_NAME_BYTES = 255
MAX_PK_VALUE_BYTES = 1 * KB
MAX_ATTRIBUTE_VALUE_BYTES = 2 * MB
MAX_WRITE_BYTES = 4 * MB  # one PutRow/UpdateRow, and one BatchWriteRow in total
MAX_COLUMNS_PER_WRITE = 1024
MAX_COLUMNS_TO_GET = 128
MAX_DEFINED_COLUMNS = 32

# Letters, digits and underscores, not starting with a digit (ASCII only: the rule names a-z, A-Z, 0-9).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_name(kind: str, name: str) -> None:
    """Table and column names: 1 to 255 bytes of ``[A-Za-z0-9_]``, not starting with a digit."""
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME_BYTES:
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise param_invalid(
            f"Invalid {kind} name: {shown!r}. It must be 1 to {MAX_NAME_BYTES} bytes of letters, digits and "
            "underscores, and start with a letter or an underscore."
        )


def value_size(value: object) -> int:
    """A value's size as the service counts it: UTF-8 bytes, binary length, 8 for numbers, 1 for bool."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float):
        return 8
    return 0


def check_pk_values(pk: Sequence[tuple[str, PrimaryKeyValue]]) -> None:
    for name, value in pk:
        if isinstance(value, Special):
            continue
        size = value_size(value)
        if size > MAX_PK_VALUE_BYTES:
            raise param_invalid(
                f"The length of primary key column: {name!r} exceeds the MaxLength:{MAX_PK_VALUE_BYTES} "
                f"with CurrentLength:{size}."
            )


def data_size(pk: Sequence[tuple[str, PrimaryKeyValue]], cells: Sequence[Cell]) -> int:
    """A row change's data size as the service counts it: every column's name plus value."""
    columns = [*pk, *((c.name, c.value) for c in cells)]
    return sum(len(name.encode("utf-8")) + value_size(value) for name, value in columns)


def check_write(pk: Sequence[tuple[str, PrimaryKeyValue]], cells: Sequence[Cell]) -> None:
    """Column names, value sizes, the column count and the data size of one row change."""
    if len(cells) > MAX_COLUMNS_PER_WRITE:
        raise param_invalid(
            f"The number of attribute columns ({len(cells)}) exceeds the limit of {MAX_COLUMNS_PER_WRITE} "
            "per row in one request."
        )
    for cell in cells:
        check_name("column", cell.name)
        size = value_size(cell.value)
        if size > MAX_ATTRIBUTE_VALUE_BYTES:
            raise param_invalid(
                f"The length of attribute column: {cell.name!r} exceeds the MaxLength:"
                f"{MAX_ATTRIBUTE_VALUE_BYTES} with CurrentLength:{size}."
            )
    check_write_size(data_size(pk, cells))


def check_write_size(total: int) -> None:
    if total > MAX_WRITE_BYTES:
        raise param_invalid(
            f"The data size of the request ({total} bytes) exceeds the limit of {MAX_WRITE_BYTES}."
        )
