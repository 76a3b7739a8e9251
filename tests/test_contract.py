"""The native codec's contract is named: its constants come from the extension, its results and
errors are read by field name, and its specs are passed as NamedTuples."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from ray_tfrecord._src.core import _native
from ray_tfrecord._src.core._contract import (
    DecodeSpec,
    EncodeColumn,
    EncodeSpec,
    Kind,
    RecordTypeCode,
    Section,
    Shape,
    Status,
    is_malformed,
)
from ray_tfrecord._src.core.framing import frame_records, iter_chunks

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
    spec = [DecodeSpec(b"x", Kind.INT64, Shape.LIST, 0, Section.CONTEXT, True)]
    decoder = _native.Decoder(spec, RecordTypeCode.EXAMPLE)
    out = decoder.decode(chunk.buffer, chunk.positions, chunk.lengths)
    assert out.null_column == -1
    batch = pa.record_batch(out)
    assert batch.schema == pa.schema([pa.field("x", pa.list_(pa.int64()))])
    assert batch.column(0).to_pylist() == [[1, 2], None]
    with pytest.raises(ValueError, match="^the batch was already imported$"):
        out.__arrow_c_array__()
    assert decoder.nogil_ns > 0

    bad = chunk_of(example(), example(entry(b"x", ld(1, ld(1, b"")))))  # bytes_list where int64 is expected
    with pytest.raises(_native.CodecError) as info:
        decoder.decode(bad.buffer, bad.positions, bad.lengths)
    e = info.value
    assert (e.status, e.record, e.column, e.actual, e.expected) == (Status.KIND_MISMATCH, 1, b"x", Kind.BYTES,
                                                                    Kind.INT64)

    truncated = chunk_of(b"\x0a\x05\x0a")  # a Features field whose length overruns the record
    with pytest.raises(_native.CodecError, match="^length-delimited field overruns its parent message$") as info:
        decoder.decode(truncated.buffer, truncated.positions, truncated.lengths)
    assert is_malformed(info.value.status) and (info.value.record, info.value.offset) == (0, 0)
    assert info.value.column is None

    not_null = _native.Decoder([spec[0]._replace(nullable=False)], RecordTypeCode.EXAMPLE)
    out = not_null.decode(chunk.buffer, chunk.positions, chunk.lengths)
    assert out.null_column == 0
    assert pa.record_batch(out).schema.field(0).nullable is False
    with pytest.raises(AttributeError):
        _native.Decoder([tuple(spec[0])], RecordTypeCode.EXAMPLE)
    with pytest.raises(ValueError, match="^invalid column spec$"):
        _native.Decoder([spec[0]._replace(shape=Shape.SCALAR, kind=Kind.NULL)], RecordTypeCode.EXAMPLE)


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
    with pytest.raises(_native.CodecError, match=r"^column b'v': fewer values than rows$") as info:
        _native.encode(RecordTypeCode.EXAMPLE, 3, [col])
    assert type(info.value) is _native.CodecError
    assert (info.value.status, info.value.column, info.value.record) == (Status.FEWER_VALUES_THAN_ROWS, b"v", -1)
    with pytest.raises(AttributeError):
        _native.encode(RecordTypeCode.EXAMPLE, 2, [tuple(col)])


def test_frame_sizes_come_from_the_extension():
    from ray_tfrecord._src.core import framing

    assert _native.FRAME == {"LENGTH_BYTES": 8, "HEADER_BYTES": 12, "FOOTER_BYTES": 4}
    assert (framing.LENGTH_BYTES, framing.HEADER_BYTES, framing.FOOTER_BYTES) == (8, 12, 4)
    assert framing.FRAME_OVERHEAD == 16


class _Export:
    """An object whose __arrow_c_array__ hands out one fixed pair of capsules."""

    def __init__(self, arr: pa.Array) -> None:
        self.capsules = arr.__arrow_c_array__()

    def __arrow_c_array__(self, requested_schema=None):
        return self.capsules


def test_the_native_encoder_refuses_struct_arrays_it_would_misread():
    encoder = _native.Encoder([EncodeSpec(b"x", Kind.INT64, Shape.SCALAR, 0)], RecordTypeCode.EXAMPLE)
    rows = pa.StructArray.from_arrays([pa.array([1, 2, 3])], ["x"])
    assert len(encoder.encode(rows, 3, [None]).offsets) == 3 * 8
    refusals = [
        (rows.slice(1), "offset 1 and null count 0; the encoder reads record batches"),
        (pa.StructArray.from_arrays([pa.array([1, 2, 3])], ["x"], mask=pa.array([False, True, False])),
         "offset 0 and null count 1; the encoder reads record batches"),
    ]
    for arr, message in refusals:
        with pytest.raises(ValueError, match=message):
            encoder.encode(arr, len(arr), [None])
    used = _Export(rows)
    pa.array(used)  # pyarrow moves the array out of the capsule: its release is NULL from then on
    with pytest.raises(ValueError, match="^the batch's Arrow export was already released"):
        encoder.encode(used, 3, [None])
    floats = pa.StructArray.from_arrays([pa.array([1.0], pa.float32())], ["x"])
    with pytest.raises(ValueError, match="^column 'x': invalid column spec: its Arrow array does not have the layout"):
        encoder.encode(floats, 1, [None])
