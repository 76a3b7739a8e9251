"""Tensor columns held as serialized tensors (tf.io.serialize_tensor's TensorProto in a bytes_list): decoded
natively into fixed-shape tensors, checked against TensorFlow's own writer and parse_tensor, Ray's
write_tfrecords, and hostile bytes."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_tfrecord import DecodeError
from ray_tfrecord._src.core import _native, codec
from ray_tfrecord._src.core._contract import TFDtype
from ray_tfrecord._src.core._tensors import DTYPE_KEY
from ray_tfrecord._src.core.framing import iter_chunks

tf = pytest.importorskip("tensorflow")
from tensorflow.core.framework import tensor_pb2  # noqa: E402

# Ray's own writer stores tensor columns as tf.io.serialize_tensor bytes from the release that added them.
_RAY_WRITES_TENSORS = "serialize_tensor" in Path(
    importlib.util.find_spec("ray.data._internal.datasource.tfrecords_datasink").origin).read_text()

# (TensorFlow dtype, Arrow value type) for every number and bool dtype serialize_tensor writes.
DTYPES = [(tf.int8, pa.int8()), (tf.int16, pa.int16()), (tf.int32, pa.int32()), (tf.int64, pa.int64()),
          (tf.uint8, pa.uint8()), (tf.uint16, pa.uint16()), (tf.uint32, pa.uint32()), (tf.uint64, pa.uint64()),
          (tf.float16, pa.float16()), (tf.float32, pa.float32()), (tf.float64, pa.float64()), (tf.bool, pa.bool_())]
BF16_BITS = pa.field("x", pa.fixed_shape_tensor(pa.uint16(), [2, 3]), metadata={DTYPE_KEY: b"bfloat16"})
BF16_WIDE = pa.field("x", pa.fixed_shape_tensor(pa.float32(), [2, 3]), metadata={DTYPE_KEY: b"bfloat16"})


def example(values: list[bytes] | None, name: str = "x") -> bytes:
    feature = {} if values is None else {name: tf.train.Feature(bytes_list=tf.train.BytesList(value=values))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def tf_file(tmp_path, records: list[bytes]) -> str:
    path = str(tmp_path / "t.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    return path


def read(path: str, field: pa.Field) -> pa.Array:
    with open(path, "rb") as f:
        (chunk,) = iter_chunks(f, path=path)
    return codec.decode(chunk, pa.schema([field])).column(0)


def decode_one(proto: bytes, field: pa.Field) -> pa.Array:
    """One record holding ``proto``, decoded without a file (decode_records)."""
    return codec.decode_records(pa.array([example([proto])], pa.binary()), pa.schema([field])).column(0)


def ndarray(col: pa.Array) -> np.ndarray:
    """A fixed-shape tensor column's rows as one array (to_numpy_ndarray refuses bool tensors)."""
    values = col.storage.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(col), *col.type.shape)


def tensor_field(value_type: pa.DataType, shape: list[int]) -> pa.Field:
    return pa.field("x", pa.fixed_shape_tensor(value_type, shape))


def sample(dtype, shape: tuple[int, ...]):
    n = int(np.prod(shape)) if shape else 1
    base = tf.range(n) - n // 2 if dtype.is_integer and not dtype.is_unsigned else tf.range(n)
    if dtype == tf.bool:
        return tf.reshape(tf.range(n) % 3 == 0, shape)
    if dtype.is_floating:
        return tf.cast(tf.reshape(tf.cast(base, tf.float32) / 4, shape), dtype)
    return tf.cast(tf.reshape(base, shape), dtype)


def test_dtypes_exported():
    assert {d.name: d.value for d in TFDtype} == _native.TF_DTYPES


@pytest.mark.parametrize("shape", [(2, 3), (), (0, 2), (5,), (1, 2, 1, 2)])
@pytest.mark.parametrize("dtype, value_type", DTYPES, ids=[d.name for d, _ in DTYPES])
def test_tensorflow_writer(tmp_path, dtype, value_type, shape):
    tensors = [sample(dtype, shape), tf.zeros(shape, dtype)]
    path = tf_file(tmp_path, [example([tf.io.serialize_tensor(t).numpy()]) for t in tensors] + [example(None)])
    col = read(path, tensor_field(value_type, list(shape)))
    assert col.type == pa.fixed_shape_tensor(value_type, list(shape))
    assert col.null_count == 1 and not col[2].is_valid
    got = ndarray(col.slice(0, 2))
    assert got.shape == (2, *shape) and got.dtype == dtype.as_numpy_dtype
    np.testing.assert_array_equal(got, np.stack([t.numpy() for t in tensors]))


def test_bfloat16_bits_or_widened(tmp_path):
    t = tf.constant([[1.5, -2.0, 3.25], [0.0, 1e30, -1e-30]], tf.bfloat16)
    path = tf_file(tmp_path, [example([tf.io.serialize_tensor(t).numpy()])])
    bits = ndarray(read(path, BF16_BITS))[0]
    np.testing.assert_array_equal(bits, tf.bitcast(t, tf.uint16).numpy())
    wide = ndarray(read(path, BF16_WIDE))[0]
    np.testing.assert_array_equal(wide, tf.cast(t, tf.float32).numpy())
    # Not declared as bfloat16: refused, naming what to declare; never reinterpreted as uint16 or float16.
    for value_type in (pa.uint16(), pa.float16()):
        with pytest.raises(DecodeError, match="is bfloat16 but the column holds .*metadata"):
            read(path, tensor_field(value_type, [2, 3]))


def test_empty_bytes_list_is_null_and_not_null_field_refuses(tmp_path):
    path = tf_file(tmp_path, [example([]), example([tf.io.serialize_tensor(tf.ones([2], tf.int64)).numpy()])])
    col = read(path, tensor_field(pa.int64(), [2]))
    assert col.is_null().to_pylist() == [True, False]
    with pytest.raises(DecodeError, match="lacks this feature"):
        read(path, pa.field("x", pa.fixed_shape_tensor(pa.int64(), [2]), nullable=False))


def test_flat_lists_still_read_and_files_may_differ(tmp_path):
    """A tensor column also reads numeric lists (this package's writes); the decoder switches per chunk."""
    field = tensor_field(pa.float32(), [2, 2])
    values = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    flat = pa.record_batch([pa.FixedShapeTensorArray.from_numpy_ndarray(values)], schema=pa.schema([field]))
    decoder = codec.Decoder(flat.schema)
    (flat_chunk,) = iter_chunks(__import__("io").BytesIO(bytes(codec.encode(flat).data)), path="flat")
    path = tf_file(tmp_path, [example([tf.io.serialize_tensor(tf.ones([2, 2])).numpy()])])
    with open(path, "rb") as f:
        (proto_chunk,) = iter_chunks(f, path=path)
    for chunk, want in [(flat_chunk, flat.column(0)), (proto_chunk, None), (flat_chunk, flat.column(0))]:
        got = decoder.decode(chunk).column(0)
        if want is not None:
            assert got.equals(want)
        else:
            np.testing.assert_array_equal(ndarray(got), np.ones((1, 2, 2), np.float32))


def test_encoder_writes_what_serialize_tensor_writes(tmp_path):
    for dtype, value_type in DTYPES:
        for shape in [(2, 3), (), (0, 4)]:
            t = sample(dtype, shape)
            rows = list(np.stack([t.numpy(), t.numpy()]).reshape(2, -1))
            storage = pa.array(rows, pa.list_(value_type, int(np.prod(shape))))
            arr = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(value_type, list(shape)), storage)
            batch = pa.record_batch([arr], names=["x"])
            enc = codec.encode(batch, serialize_tensors=True)
            first = bytes(enc.data[12: (enc.offsets[1] if len(enc) > 1 else len(enc.data)) - 4])
            parsed = tf.io.parse_single_example(first, {"x": tf.io.FixedLenFeature([], tf.string)})
            assert parsed["x"].numpy() == tf.io.serialize_tensor(t).numpy(), (dtype, shape)
            np.testing.assert_array_equal(tf.io.parse_tensor(parsed["x"], dtype).numpy(), t.numpy())
            (chunk,) = iter_chunks(__import__("io").BytesIO(bytes(enc.data)), path="enc")
            assert codec.decode(chunk, batch.schema).column(0).equals(arr)


def test_encoder_null_rows_have_no_feature():
    arr = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int32(), [2]),
                                         pa.array([[1, 2], None], pa.list_(pa.int32(), 2)))
    batch = pa.record_batch([arr], names=["x"])
    enc = codec.encode(batch, serialize_tensors=True)
    (chunk,) = iter_chunks(__import__("io").BytesIO(bytes(enc.data)), path="enc")
    assert codec.decode(chunk, batch.schema).column(0).to_pylist() == [[1, 2], None]


def test_ray_tensor_types_read():
    try:
        from ray.data._internal.tensor_extensions.arrow import ArrowTensorType, ArrowTensorTypeV2
    except ModuleNotFoundError:  # Ray before 2.5x kept them under ray.air
        from ray.air.util.tensor_extensions.arrow import ArrowTensorType, ArrowTensorTypeV2

    proto = tf.io.serialize_tensor(tf.reshape(tf.range(6, dtype=tf.int32), (2, 3))).numpy()
    for t in (ArrowTensorTypeV2((2, 3), pa.int32()), ArrowTensorType((2, 3), pa.int32())):
        col = decode_one(proto, pa.field("x", t))
        assert col.type == t
        np.testing.assert_array_equal(col.to_numpy(), np.arange(6, dtype=np.int32).reshape(1, 2, 3))


@pytest.mark.slow
@pytest.mark.skipif(not _RAY_WRITES_TENSORS, reason=f"Ray {ray.__version__}'s write_tfrecords has no tensor columns (they came with serialized tensors, ray PR #60859)")
def test_ray_write_tfrecords_round_trips(tmp_path, ray_local):
    """What Ray's own Dataset.write_tfrecords writes for tensor columns reads back with no hand work."""
    import ray

    from ray_tfrecord import read_tfrecords

    images = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    ids = np.arange(4 * 5, dtype=np.int16).reshape(4, 5)
    ds = ray.data.from_items([{"image": images[i], "ids": ids[i], "k": i} for i in range(4)])
    ds.write_tfrecords(str(tmp_path / "out"))
    schema = pa.schema([("image", pa.fixed_shape_tensor(pa.float32(), [2, 3])),
                        ("ids", pa.fixed_shape_tensor(pa.int16(), [5])), ("k", pa.int64())])
    table = read_tfrecords(str(tmp_path / "out"), schema=schema).to_arrow_refs()
    got = pa.concat_tables(ray.get(table)).sort_by("k")
    np.testing.assert_array_equal(np.stack(got.column("image").to_numpy()).reshape(4, 2, 3), images)
    np.testing.assert_array_equal(np.stack(got.column("ids").to_numpy()).reshape(4, 5), ids)


# ------------------------------------------------------------------------------------------------
# TensorProtos TensorFlow may write in other ways than serialize_tensor: typed repeated fields


_TYPED = {tf.int8: "int_val", tf.int16: "int_val", tf.int32: "int_val", tf.uint8: "int_val", tf.uint16: "int_val",
          tf.int64: "int64_val", tf.uint32: "uint32_val", tf.uint64: "uint64_val", tf.float32: "float_val",
          tf.float64: "double_val", tf.bool: "bool_val", tf.float16: "half_val"}


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 3), max_size=3), st.data())
def test_typed_fields_match_parse_tensor(dt, shape, data):
    dtype, value_type = dt
    n = int(np.prod(shape)) if shape else 1
    info = np.iinfo(dtype.as_numpy_dtype) if dtype.is_integer else None
    if dtype == tf.bool:
        values = data.draw(st.lists(st.booleans(), max_size=n))
    elif info is not None:
        values = data.draw(st.lists(st.integers(int(info.min), int(info.max)), max_size=n))
    else:
        values = data.draw(st.lists(st.floats(-1e4, 1e4, width=16 if dtype == tf.float16 else 32), max_size=n))
    proto = tensor_pb2.TensorProto(dtype=dtype.as_datatype_enum)
    for d in shape:
        proto.tensor_shape.dim.add(size=d)
    if dtype == tf.float16:
        proto.half_val.extend(int(b) for b in np.array(values, np.float16).view(np.uint16))
    else:
        getattr(proto, _TYPED[dtype]).extend(values)
    raw = proto.SerializeToString()
    want = tf.io.parse_tensor(raw, dtype).numpy()  # fewer values than the shape: the last repeats
    got = ndarray(decode_one(raw, tensor_field(value_type, shape)))[0]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=4), st.randoms(use_true_random=False))
def test_serialized_round_trip_property(dt, shape, rnd):
    dtype, value_type = dt
    np_dtype = dtype.as_numpy_dtype
    n = int(np.prod(shape)) if shape else 1
    raw = np.frombuffer(rnd.randbytes(n * np.dtype(np_dtype).itemsize), np.uint8)
    values = ((raw % 2).astype(np.bool_) if dtype == tf.bool else raw.view(np_dtype)).reshape(shape)
    proto = tf.io.serialize_tensor(tf.constant(values, dtype)).numpy()
    got = ndarray(decode_one(proto, tensor_field(value_type, shape)))[0]
    assert got.tobytes() == values.tobytes()  # bit for bit, NaNs included


# ------------------------------------------------------------------------------------------------
# hostile TensorProtos: each a named error, never a crash


F32 = tensor_field(pa.float32(), [2, 3])
GOOD = tf.io.serialize_tensor(tf.ones([2, 3])).numpy()


def test_wrong_dtype_message():
    raw = tf.io.serialize_tensor(tf.ones([2, 3], tf.float64)).numpy()
    with pytest.raises(DecodeError) as e:
        decode_one(raw, F32)
    assert e.value.reason == ("record 0 of a 1-record batch: the record's serialized tensor is float64 but the column "
                            "holds float32 (extension<arrow.fixed_shape_tensor[value_type=float, shape=[2,3]]>); to "
                            "read it, declare the tensor's value type as double; read the files with "
                            "read_tfrecords(..., schema=...) to locate it by file and offset")
    assert e.value.column == "x"


def test_truncated_message(tmp_path):
    path = tf_file(tmp_path, [example([GOOD]), example([GOOD[:-5]])])
    with pytest.raises(DecodeError) as e:
        read(path, F32)
    first = len(example([GOOD])) + 16
    assert e.value.offset == first and e.value.column == "x" and e.value.path == path
    assert e.value.reason == ("the record's serialized tensor is not a well-formed TensorProto "
                              "(tf.io.serialize_tensor's bytes): length-delimited field overruns its parent "
                              "message (at byte 25 of the record)")


@pytest.mark.parametrize("raw, match", [
    (tf.io.serialize_tensor(tf.ones([3, 2])).numpy(), "dimension 0 of size 3 but the column's shape \\(2, 3\\) has 2"),
    (tf.io.serialize_tensor(tf.ones([2])).numpy(), "has rank 1 but the column's shape \\(2, 3\\) has rank 2"),
    (tf.io.serialize_tensor(tf.ones([2, 3, 1])).numpy(), "has rank 3 but"),
    (tf.io.serialize_tensor(tf.constant("abc")).numpy(), "is string but the column holds float32"),
    (GOOD.replace(b"\x22\x18", b"\x22\x14")[:-4], "holds 20 bytes of tensor_content but its shape \\(2, 3\\) needs 24"),
    (tensor_pb2.TensorProto(dtype=1, tensor_shape={"dim": [{"size": 2}, {"size": 3}]}, float_val=[1.0] * 7)
     .SerializeToString(), "lists 7 or more values but its shape \\(2, 3\\) holds 6"),
    (tensor_pb2.TensorProto(dtype=1, tensor_shape={"unknown_rank": True}).SerializeToString(), "unknown rank"),
    (b"\x08\x01\x12", "not a well-formed TensorProto"),
    (b"\x08", "not a well-formed TensorProto.*varint runs past"),
    (b"\x08\x01\x12\xff\xff\xff\xff\x0f", "not a well-formed TensorProto"),
    (b"\x0b", "not a well-formed TensorProto.*wire type"),
    (b"", "is no dtype"),
])
def test_hostile(raw, match):
    with pytest.raises(DecodeError, match=match):
        decode_one(raw, F32)


def test_typed_values_outside_the_dtype():
    proto = tensor_pb2.TensorProto(dtype=tf.int8.as_datatype_enum, tensor_shape={"dim": [{"size": 2}]},
                                   int_val=[1, 300])
    with pytest.raises(DecodeError, match="holds the value 300, outside the range of int8"):
        decode_one(proto.SerializeToString(), tensor_field(pa.int8(), [2]))
    bools = tf.io.serialize_tensor(tf.constant([True, False])).numpy()[:-1] + b"\x02"
    with pytest.raises(DecodeError, match="holds the value 2, outside the range of bool"):
        decode_one(bools, tensor_field(pa.bool_(), [2]))


def test_two_values_in_one_row():
    with pytest.raises(DecodeError, match="needs exactly 1 value but the record holds 2"):
        codec.decode_records(pa.array([example([GOOD, GOOD])]), pa.schema([F32]))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80), st.integers(0, len(GOOD)))
def test_mutations_never_crash(tail, cut):
    for raw in (GOOD[:cut] + tail, tail, GOOD[:cut]):
        try:
            col = decode_one(raw, F32)
        except DecodeError:
            continue
        assert len(col) == 1 and len(col.storage.values) == 6


def test_lying_dims_do_not_allocate():
    huge = tensor_pb2.TensorProto(dtype=1, tensor_shape={"dim": [{"size": 2**62}, {"size": 2**62}]})
    with pytest.raises(DecodeError, match="dimension 0 of size 4611686018427387904"):
        decode_one(huge.SerializeToString(), F32)
    assert struct.calcsize("q") == 8


def test_tensor_describe_reads_what_a_serialized_tensor_declares():
    for tf_dtype, _ in DTYPES:
        proto = tf.io.serialize_tensor(tf.zeros([2, 3], tf_dtype)).numpy()
        assert _native.tensor_describe(proto) == (tf_dtype.as_datatype_enum, (2, 3))
    assert _native.tensor_describe(tf.io.serialize_tensor(tf.constant(1.5, tf.bfloat16)).numpy()) == (14, ())
    filled = tf.make_tensor_proto(7, dtype=tf.int32, shape=[4, 0]).SerializeToString()
    assert _native.tensor_describe(filled) == (TFDtype.INT32, (4, 0))
    strings = tf.io.serialize_tensor(tf.constant([b"a"])).numpy()
    short = tf.io.serialize_tensor(tf.ones([2, 3])).numpy()[:-1]
    huge = tensor_pb2.TensorProto(dtype=1, tensor_shape={"dim": [{"size": 2**40}]}).SerializeToString()
    unknown = tensor_pb2.TensorProto(dtype=1, tensor_shape={"unknown_rank": True}).SerializeToString()
    for raw in (strings, short, huge, unknown, b"", b"\x08", b"not a tensor"):
        assert _native.tensor_describe(raw) is None, raw


def test_inspect_says_which_bytes_columns_are_serialized_tensors(ray_local, tmp_path, capsys):
    """A file written as Ray's write_tfrecords writes tensor columns: inspect names the schema that reads them."""
    from ray_tfrecord._src.cli import main

    def f(value):
        raw = value if isinstance(value, bytes) else tf.io.serialize_tensor(value).numpy()
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw]))

    records = []
    for i in range(6):
        feature = {"image": f(tf.fill([2, 3], float(i))), "mask": f(tf.constant([i % 2 == 0])),
                   "half": f(tf.ones([4], tf.bfloat16)),
                   # Tensors of two shapes, and plain bytes, are no fixed-shape tensor column.
                   "ragged": f(tf.zeros([i % 2 + 1])), "label": f(b"cat")}
        if i == 3:
            del feature["image"]  # a missing tensor (null) does not vote
        records.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    path = tf_file(tmp_path, records)
    assert main(["inspect", path, "--rows", "1"]) == 0
    hints = [line for line in capsys.readouterr().out.splitlines() if "serialized tensors" in line]
    assert hints == [
        "column 'half': bytes that are serialized tensors (bfloat16, shape [4]); read them as tensors with schema= "
        "holding pa.field('half', pa.fixed_shape_tensor(pa.float32(), [4]), "
        "metadata={'ray_tfrecord.tensor_dtype': 'bfloat16'})",
        "column 'image': bytes that are serialized tensors (float32, shape [2, 3]); read them as tensors with "
        "schema= holding pa.field('image', pa.fixed_shape_tensor(pa.float32(), [2, 3]))",
        "column 'mask': bytes that are serialized tensors (bool, shape [1]); read them as tensors with schema= "
        "holding pa.field('mask', pa.fixed_shape_tensor(pa.bool_(), [1]))",
    ]
    # The fields the hints spell out read the file's tensors back.
    fields = [eval(line.split("holding ", 1)[1], {"pa": pa}) for line in hints]
    with open(path, "rb") as fh:
        (chunk,) = iter_chunks(fh, path=path)
    batch = codec.decode(chunk, pa.schema(fields))
    image = batch.column(1)
    assert image.is_null().to_pylist() == [i == 3 for i in range(6)]
    assert ndarray(image.filter(image.is_valid()))[:, 1, 2].tolist() == [0, 1, 2, 4, 5]
    assert batch.column(0).storage.flatten().to_pylist() == [1.0] * 24
    assert batch.column(2).storage.flatten().to_pylist() == [1, 0, 1, 0, 1, 0]
