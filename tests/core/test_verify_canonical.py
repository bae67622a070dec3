"""The canonical encoding's hashes: DuckDB's vectorised MD5 (large arrays) and hashlib (small ones) agree."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pyarrow as pa
import pytest

from cdc.verify import canonical


def test_duckdb_and_hashlib_hash_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    values = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 300, 2000]))) for _ in range(300)]
    expected = np.array([int.from_bytes(hashlib.md5(v).digest()[:8], "big") for v in values], dtype=np.uint64)
    for encoded in (pa.array(values, pa.large_binary()), pa.array(values, pa.binary())):
        monkeypatch.setattr(canonical, "SMALL", 0)  # DuckDB
        assert np.array_equal(canonical.row_hashes(encoded), expected)
        assert canonical._md5_hex(encoded).to_pylist() == [hashlib.md5(v).hexdigest() for v in values]
        monkeypatch.setattr(canonical, "SMALL", 10_000)  # hashlib
        assert np.array_equal(canonical.row_hashes(encoded), expected)


def test_chunk_digest_is_the_md5_of_the_ordered_pieces() -> None:
    values = [b"b", b"x" * 300, b"a", b""]
    order = np.array([2, 0, 1, 3])  # key order: a, b, the long one, the empty one
    chunk = np.array([0, 1, 0, 1])  # chunks are key ranges: a, b in the first; the rest in the second
    got = canonical.chunk_digests(pa.array(values, pa.binary()), order, chunk, 3)
    long = b"H" + hashlib.md5(b"x" * 300).hexdigest().encode()
    assert got == [(2, int(hashlib.md5(b"Ra" + b"Rb").hexdigest(), 16)),
                   (2, int(hashlib.md5(long + b"R").hexdigest(), 16)), canonical.EMPTY]
