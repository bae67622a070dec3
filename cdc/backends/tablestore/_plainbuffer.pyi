"""Types of the compiled PlainBuffer reader and record layout (native/); see :mod:`.plainbuffer`."""

from typing import Any

def configure(
    row: type, cell: type, sequence_info: type, error: type, inf_min: Any, inf_max: Any, auto_increment: Any
) -> None: ...
def decode_rows(data: bytes | bytearray | memoryview) -> list[Any]: ...
def layout_columns(
    payloads: list[bytes],
    actions: list[int],
    base: bool,
    first_n: int,
    channel: str,
    catalog: dict[str, int],
    codes: bytes,
    nkeys: int,
    partial: bool,
    ots: bool,
    strings: tuple[str, ...],
    value_names: tuple[str, ...],
) -> list[list[Any]] | None: ...
