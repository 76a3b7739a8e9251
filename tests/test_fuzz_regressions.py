"""Regression tests for what fuzzing the native codec found (fuzz/, `make fuzz`).

Each test drives the reproducer through the Python API. The native-level inputs that found them
are kept in the seed corpus (fuzz/corpus/<target>/regression-*), so every fuzz run replays them.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from ray_tfrecord._src.core import _native, codec
from ray_tfrecord._src.core._contract import EncodeColumn, Kind, RecordTypeCode, Shape
from ray_tfrecord._src.core.framing import frame_records, iter_chunks
from ray_tfrecord._src.core.schema import infer_schema


def native_in_subprocess(code: str) -> subprocess.CompletedProcess:
    """Run code against _native in a fresh interpreter, so a regression crashes it, not pytest."""
    preamble = ("from ray_tfrecord._src.core import _native\n"
                "from ray_tfrecord._src.core._contract import EncodeColumn, Kind, RecordTypeCode, Shape\n")
    return subprocess.run([sys.executable, "-c", preamble + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60)


def test_inspect_gives_every_new_feature_its_own_column():
    # fuzz target `inspect`: when the 8th distinct feature grew the column hash table, inspect
    # attributed it to column 0, so schema inference saw a kind clash (or merged statistics).
    batch = pa.record_batch({**{f"c{i}": pa.array([i, i]) for i in range(7)}, "z": pa.array([b"x", b"y"]),
                             "y": pa.array([[1.0], [2.0, 3.0]], pa.list_(pa.float32()))})
    chunks = list(iter_chunks(io.BytesIO(bytes(codec.encode(batch).data)), path="m"))
    assert infer_schema(chunks) == pa.schema(sorted(batch.schema, key=lambda f: f.name))
    stats = {col.name: col.present for col in
             _native.inspect(chunks[0].buffer, chunks[0].positions, chunks[0].lengths, RecordTypeCode.EXAMPLE)}
    assert stats == {f.name.encode(): 2 for f in batch.schema}


@pytest.mark.parametrize("nrows", [2**61, 2**62, 2**63 - 1])
def test_encode_of_more_rows_than_memory_holds_is_a_memory_error(nrows):
    # fuzz target `encode`: with no columns, nrows * 8 wrapped to a small size and the record
    # offsets were written far past their buffer (a segfault).
    out = native_in_subprocess(f"""
        try:
            _native.encode(RecordTypeCode.EXAMPLE, {nrows}, [])
        except MemoryError:
            print("MemoryError")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "MemoryError", out.stderr[-2000:]


def test_encode_rejects_a_bitmap_offset_that_overflows_with_the_row_count():
    # fuzz target `encode` (UBSan): validity offset + row count overflowed int64, so the check
    # passed and the bitmap was read at an offset of 2^60 bytes.
    out = native_in_subprocess(f"""
        import numpy as np
        try:
            _native.encode(RecordTypeCode.EXAMPLE, 3, [EncodeColumn(
                b"a", Kind.INT64, Shape.SCALAR, b"\\xff", {2**63 - 3}, None, None, np.zeros(3, np.int64), None)])
        except _native.CodecError as e:
            print(e)
    """)
    assert out.returncode == 0 and out.stdout.strip() == "column b'a': validity bitmap too short", out.stderr[-2000:]


def test_encode_rejects_a_row_count_whose_successor_overflows():
    # fuzz target `encode` (UBSan): nrows + 1 overflowed int64 in the list-offsets check.
    with pytest.raises(_native.CodecError, match=r"^column b'a': fewer list offsets than rows$"):
        _native.encode(RecordTypeCode.EXAMPLE, 2**63 - 1, [EncodeColumn(
            b"a", Kind.INT64, Shape.LIST, None, 0, np.zeros(2, np.int64), None, np.zeros(1, np.int64), None)])


def test_empty_values_as_the_first_values_of_a_batch():
    # fuzz target `encode` round trip (UBSan): the first value of a column being empty did pointer
    # arithmetic on a not-yet-allocated (NULL) buffer.
    batch = pa.record_batch({"b": pa.array([[b""], [b"x"]], pa.list_(pa.binary())),
                             "f": pa.array([[], [1.5]], pa.list_(pa.float32())),
                             "i": pa.array([[], [2]], pa.list_(pa.int64())),
                             "s": pa.array([b"", b"y"], pa.binary())})
    chunk = next(iter_chunks(io.BytesIO(bytes(codec.encode(batch).data)), path="m"))
    assert codec.decode(chunk, batch.schema).equals(batch)
    empty = codec.encode(batch.slice(0, 0))
    assert len(empty) == 0 and bytes(empty.data) == b""
    chunk = next(iter_chunks(io.BytesIO(frame_records([b""])), path="m"))
    assert codec.decode(chunk, batch.schema).to_pylist() == [{"b": None, "f": None, "i": None, "s": None}]
