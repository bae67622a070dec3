"""Types of the compiled PlainBuffer reader (native/plainbuffer.c); see :mod:`.plainbuffer`."""

from typing import Any

def configure(
    row: type, cell: type, sequence_info: type, error: type, inf_min: Any, inf_max: Any, auto_increment: Any
) -> None: ...
def decode_rows(data: bytes | bytearray | memoryview) -> list[Any]: ...
