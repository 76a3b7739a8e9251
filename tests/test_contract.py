"""The native codec's contract is named: its constants come from the extension, its results and
errors are read by field name, and its specs are passed as NamedTuples."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ray_tfrecord.core import _native
from ray_tfrecord.core._contract import (
    DecodeSpec,
    EncodeColumn,
    Kind,
    RecordTypeCode,
    Section,
    Shape,
    Status,
    is_malformed,
)
from ray_tfrecord.core.framing import frame_records, iter_chunks

from .wire import entry, example, ints, ld


@pytest.mark.parametrize("enum, exported", [(Status, _native.STATUS), (Kind, _native.KINDS), (Shape, _native.SHAPES),
                                            (Section, _native.SECTIONS), (RecordTypeCode, _native.RECORD_TYPES)])
def test_enums_mirror_the_extension(enum, exported):
    assert {m.name: m.value for m in enum} == exported
    assert len(set(exported.values())) == len(exported)


def chunk_of(*payloads: bytes):
    (chunk,) = iter_chunks(io.BytesIO(frame_records(payloads)), path="m")
    return chunk


def test_decode_results_and_errors_are_named():
    chunk = chunk_of(example(entry(b"x", ints(1, 2))), example())
    spec = [DecodeSpec(b"x", Kind.INT64, Shape.LIST, 0, Section.CONTEXT)]
    (col,) = _native.decode(chunk.buffer, chunk.positions, chunk.lengths, RecordTypeCode.EXAMPLE, spec)
    assert (col.null_count, col.value_count, col.data) == (1, 2, None)
    assert np.frombuffer(col.values, np.int64).tolist() == [1, 2]
    assert np.frombuffer(col.row_offsets, np.int32).tolist() == [0, 2, 2]

    bad = chunk_of(example(), example(entry(b"x", ld(1, ld(1, b"")))))  # bytes_list where int64 is expected
    with pytest.raises(_native.CodecError) as info:
        _native.decode(bad.buffer, bad.positions, bad.lengths, RecordTypeCode.EXAMPLE, spec)
    e = info.value
    assert (e.status, e.record, e.column, e.actual, e.expected) == (Status.KIND_MISMATCH, 1, b"x", Kind.BYTES,
                                                                    Kind.INT64)

    truncated = chunk_of(b"\x0a\x05\x0a")  # a Features field whose length overruns the record
    with pytest.raises(_native.CodecError, match="^length-delimited field overruns its parent message$") as info:
        _native.decode(truncated.buffer, truncated.positions, truncated.lengths, RecordTypeCode.EXAMPLE, spec)
    assert is_malformed(info.value.status) and (info.value.record, info.value.offset) == (0, 0)
    assert info.value.column is None


def test_inspect_names_the_record_that_set_the_kind():
    chunk = chunk_of(example(entry(b"x", ints(1))), example(), example(entry(b"x", ld(2, ld(1, b"\0\0\0\0")))))
    with pytest.raises(_native.CodecError) as info:
        _native.inspect(chunk.buffer, chunk.positions, chunk.lengths, RecordTypeCode.EXAMPLE)
    e = info.value
    assert (e.status, e.record, e.other_record, e.actual, e.expected) == (Status.KIND_MISMATCH, 2, 0, Kind.FLOAT,
                                                                          Kind.INT64)
    (col,) = _native.inspect(chunk.buffer, chunk.positions[:2], chunk.lengths[:2], RecordTypeCode.EXAMPLE)
    assert (col.name, col.section, col.kind, col.present, col.min_count, col.max_count, col.kind_record) == (
        b"x", Section.CONTEXT, Kind.INT64, 1, 1, 1, 0)


def test_encode_reads_its_columns_by_name():
    col = EncodeColumn(name=b"v", kind=Kind.INT64, shape=Shape.SCALAR, validity=None, validity_offset=0,
                       row_offsets=None, inner_offsets=None, values=np.array([7, 8], np.int64), data=None)
    enc = _native.encode(RecordTypeCode.EXAMPLE, 2, [col])
    assert np.frombuffer(enc.offsets, np.int64).tolist() == [0, len(enc.data) // 2]
    found = _native.scan(bytes(enc.data))
    assert (found.error_count, found.consumed, found.need, found.resyncing) == (0, len(enc.data), 0, False)
    with pytest.raises(ValueError, match=r"^column b'v': fewer values than rows$"):
        _native.encode(RecordTypeCode.EXAMPLE, 3, [col])
    with pytest.raises(AttributeError):
        _native.encode(RecordTypeCode.EXAMPLE, 2, [tuple(col)])
