"""Order-preserving byte keys for primary keys, so sqlite's BLOB order (memcmp) is Tablestore's row order.

Each primary-key column becomes ``tag + payload``: integers ``0x01`` + 8 big-endian bytes with the sign
bit flipped; strings ``0x02`` and binaries ``0x03`` + the bytes with ``0x00`` escaped as ``0x00 0xFF``
and a ``0x00 0x00`` terminator (so a prefix sorts first); booleans ``0x04`` + one byte. ``INF_MIN`` is
``0x00`` (below every value) and ``INF_MAX`` is ``0xFF`` (above every value): a range bound with an
infinite column sorts before/after every row sharing its leading columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdc.backends.tablestore.plainbuffer import INF_MAX, INF_MIN, PrimaryKeyValue, Special

_SIGN = 1 << 63


def encode_value(value: PrimaryKeyValue) -> bytes:
    """One primary-key column as an order-preserving byte string."""
    if isinstance(value, Special):
        if value is INF_MIN:
            return b"\x00"
        if value is INF_MAX:
            return b"\xff"
        raise ValueError("an auto-increment placeholder has no position")
    if isinstance(value, bool):
        return b"\x04\x01" if value else b"\x04\x00"
    if isinstance(value, int):
        return b"\x01" + (value + _SIGN).to_bytes(8, "big")
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    tag = b"\x02" if isinstance(value, str) else b"\x03"
    return tag + data.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def encode_key(primary_key: Sequence[tuple[str, PrimaryKeyValue]]) -> bytes:
    """A whole primary key (values only; the table schema fixes names and order)."""
    return b"".join(encode_value(value) for _, value in primary_key)


def decode_key(key: bytes, names: Sequence[str]) -> tuple[tuple[str, PrimaryKeyValue], ...]:
    """Invert :func:`encode_key` for a key of real values (used for readable admin output)."""
    out: list[tuple[str, PrimaryKeyValue]] = []
    pos = 0
    for name in names:
        if pos >= len(key):
            break
        tag = key[pos]
        pos += 1
        value: PrimaryKeyValue
        if tag == 0x00:
            value = INF_MIN
        elif tag == 0xFF:
            value = INF_MAX
        elif tag == 0x01:
            value = int.from_bytes(key[pos : pos + 8], "big") - _SIGN
            pos += 8
        elif tag == 0x04:
            value = key[pos] == 1
            pos += 1
        else:
            chunks = bytearray()
            while True:
                byte = key[pos]
                if byte == 0x00:
                    if key[pos + 1] == 0x00:
                        pos += 2
                        break
                    chunks.append(0x00)
                    pos += 2
                else:
                    chunks.append(byte)
                    pos += 1
            value = chunks.decode("utf-8") if tag == 0x02 else bytes(chunks)
        out.append((name, value))
    return tuple(out)
