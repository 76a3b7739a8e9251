"""The native codec against protobuf (tests/reference.py) and TensorFlow, both directions."""

from __future__ import annotations

import io
import math
import struct

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.errors import DecodeError, SchemaError, TFRecordError
from ray_tfrecord._src.core.framing import RecordWriter, frame_records, iter_chunks

from . import reference as ref
from .strategies import column_specs, f32, rows_for, same_floats
from .wire import entry, example, ld, varint

ARROW_LEAF = {"int64_list": pa.int64(), "float_list": pa.float32(), "bytes_list": pa.binary()}
TF_DTYPE = {"int64_list": tf.int64, "float_list": tf.float32, "bytes_list": tf.string}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def arrow_type(kind: str, mode: str) -> pa.DataType:
    leaf = ARROW_LEAF[kind]
    if mode == "scalar":
        return leaf
    if mode.startswith("fixed"):
        return pa.list_(leaf, int(mode.split(":")[1]))
    return pa.list_(leaf)


def schema_of(specs: dict) -> pa.Schema:
    return pa.schema([(name, arrow_type(kind, mode)) for name, (kind, mode) in specs.items()])


def chunk_of(payloads: list[bytes], path: str = "mem.tfrecord"):
    chunks = list(iter_chunks(io.BytesIO(frame_records(payloads)), path=path))
    assert len(chunks) <= 1
    return chunks[0] if chunks else None


def decode_payloads(payloads, schema, record_type="Example", path="mem.tfrecord"):
    return codec.decode(chunk_of(payloads, path), schema, record_type)


def assert_column_equal(got: list, want: list, kind: str):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None or g is None:
            assert g is None and w is None, (g, w)
        elif kind == "float_list":
            if isinstance(w, list):
                assert same_floats(g, w), (g, w)
            else:
                assert same_floats([g], [w]), (g, w)
        else:
            assert g == w


def arrow_batch(specs: dict, rows: list[dict]) -> pa.RecordBatch:
    cols = {}
    for name, (kind, mode) in specs.items():
        vals = []
        for row in rows:
            if name not in row:
                vals.append(None)
            else:
                v = row[name][1]
                vals.append(v[0] if mode == "scalar" else v)
        cols[name] = pa.array(vals, arrow_type(kind, mode))
    return pa.record_batch(cols, schema=schema_of(specs))


# ------------------------------------------------------------------------------------------------
# decode == protobuf, encode == protobuf


@SETTINGS
@given(st.data())
def test_decode_matches_protobuf(data):
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1))
    payloads = [ref.encode_example(r) for r in rows]
    schema = schema_of(specs)
    batch = decode_payloads(payloads, schema)
    assert batch.schema == schema
    decoded = [ref.decode_example(p) for p in payloads]
    for name, (kind, _mode) in specs.items():
        expected = ref.expected_column(decoded, name, schema.field(name).type)
        assert_column_equal(batch.column(name).to_pylist(), expected, kind)


@SETTINGS
@given(st.data())
def test_encode_matches_protobuf(data):
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1))
    batch = arrow_batch(specs, rows)
    enc = codec.encode(batch)
    chunk = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="enc"))
    assert len(chunk) == len(rows) == len(enc)
    assert list(enc.offsets) == list(chunk.positions)
    for i, row in enumerate(rows):
        got = ref.decode_example(bytes(chunk.record(i)))
        assert set(got) == set(row)
        for name, (kind, values) in row.items():
            gkind, gvalues = got[name]
            assert gkind == kind
            if kind == "float_list":
                assert same_floats(gvalues, values)
            else:
                assert gvalues == values


@SETTINGS
@given(st.data())
def test_sequence_example_both_ways(data):
    ctx_specs = data.draw(column_specs(max_columns=3))
    list_names = data.draw(st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=3, unique=True))
    list_names = [f"fl_{n}" for n in list_names]
    list_kinds = {n: data.draw(st.sampled_from(sorted(ARROW_LEAF))) for n in list_names}
    ctx_rows = data.draw(rows_for(ctx_specs, min_rows=1, max_rows=6))
    from .strategies import KINDS
    records = []
    for ctx in ctx_rows:
        lists = {}
        for n, kind in list_kinds.items():
            if data.draw(st.integers(0, 4)) == 0:
                continue
            steps = data.draw(st.lists(st.lists(KINDS[kind], max_size=4), max_size=4))
            lists[n] = (kind, steps)
        records.append((ctx, lists))
    payloads = [ref.encode_sequence_example(c, lists) for c, lists in records]
    schema = pa.schema([*schema_of(ctx_specs),
                        *[(n, pa.list_(pa.list_(ARROW_LEAF[k]))) for n, k in list_kinds.items()]])
    batch = decode_payloads(payloads, schema, "SequenceExample")
    decoded = [ref.decode_sequence_example(p) for p in payloads]
    for name, (kind, _) in ctx_specs.items():
        want = ref.expected_column([d[0] for d in decoded], name, schema.field(name).type)
        assert_column_equal(batch.column(name).to_pylist(), want, kind)
    for n, kind in list_kinds.items():
        got = batch.column(n).to_pylist()
        for g, d in zip(got, decoded):
            if n not in d[1]:
                assert g is None
                continue
            assert len(g) == len(d[1][n])
            for gs, (_, ws) in zip(g, d[1][n]):
                assert same_floats(gs, ws) if kind == "float_list" else gs == ws
    # and back: encoding the decoded batch reproduces the same messages
    enc = codec.encode(batch, "SequenceExample")
    again = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="enc"))
    for i, (ctx, lists) in enumerate(decoded):
        c2, l2 = ref.decode_sequence_example(bytes(again.record(i)))
        assert set(c2) == set(ctx) and set(l2) == set(lists)
        for n in lists:
            assert [len(v) for _, v in l2[n]] == [len(v) for _, v in lists[n]]


# ------------------------------------------------------------------------------------------------
# TensorFlow both ways


def _tf_ragged(serialized: list[bytes], specs: dict) -> dict:
    feats = {name: tf.io.RaggedFeature(TF_DTYPE[kind]) for name, (kind, _) in specs.items()}
    parsed = tf.io.parse_example(tf.constant(serialized), feats)
    return {k: v.to_list() for k, v in parsed.items()}


def _as_list(v, mode):
    if v is None:
        return []
    return [v] if mode == "scalar" else v


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tf_written_files_read_as_parse_example_sees_them(tmp_path, compression, data):
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1, max_rows=30))
    payloads = [ref.encode_example(r) for r in rows]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression or "")) as w:
        for p in payloads:
            w.write(p)
    import pyarrow.fs as pafs

    from ray_tfrecord._src.core.framing import open_stream
    stream, found = open_stream(path, pafs.LocalFileSystem())
    assert found == (compression.lower() if compression else None)
    chunks = list(iter_chunks(stream, path=path, chunk_bytes=256))
    schema = schema_of(specs)
    batch = pa.Table.from_batches([codec.decode(c, schema) for c in chunks], schema=schema)
    want = _tf_ragged(payloads, specs)
    for name, (kind, mode) in specs.items():
        got = [_as_list(v, mode) for v in batch.column(name).to_pylist()]
        w = want[name]
        for g, x in zip(got, w):
            assert same_floats(g, x) if kind == "float_list" else g == x


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_our_files_parse_in_tensorflow(tmp_path, compression, data):
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1, max_rows=30))
    batch = arrow_batch(specs, rows)
    path = str(tmp_path / "ours.tfrecord")
    with RecordWriter(open(path, "wb"), compression) as w:
        w.write(codec.encode(batch).data)
    ds = tf.data.TFRecordDataset(path, compression_type=(compression or "").upper())
    serialized = [t.numpy() for t in ds]
    assert len(serialized) == len(rows)
    tf_values = _tf_ragged(serialized, specs)
    for name, (kind, mode) in specs.items():
        want = [_as_list(v, mode) for v in batch.column(name).to_pylist()]
        for g, x in zip(tf_values[name], want):
            assert same_floats(g, x) if kind == "float_list" else g == x


def test_tf_dense_and_sequence_parsing_of_our_records():
    batch = pa.record_batch({
        "label": pa.array([3, -7], pa.int64()),
        "weight": pa.array([0.5, -2.25], pa.float32()),
        "img": pa.array([[1, 2, 3, 4], [5, 6, 7, 8]], pa.list_(pa.int64(), 4)),
        "name": pa.array(["å", "b"], pa.string()),
        "tokens": pa.array([[[1, 2], [3]], [[], [4, 5, 6]]], pa.list_(pa.list_(pa.int64()))),
        "scores": pa.array([[[0.5]], []], pa.list_(pa.list_(pa.float32()))),
    })
    enc = codec.encode(batch, "SequenceExample")
    chunk = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="m"))
    for i in range(2):
        ctx, seq = tf.io.parse_single_sequence_example(
            bytes(chunk.record(i)),
            context_features={"label": tf.io.FixedLenFeature([], tf.int64),
                              "weight": tf.io.FixedLenFeature([], tf.float32),
                              "img": tf.io.FixedLenFeature([4], tf.int64),
                              "name": tf.io.FixedLenFeature([], tf.string)},
            sequence_features={"tokens": tf.io.RaggedFeature(tf.int64), "scores": tf.io.RaggedFeature(tf.float32)})
        assert ctx["label"].numpy() == batch["label"][i].as_py()
        assert ctx["weight"].numpy() == batch["weight"][i].as_py()
        assert ctx["img"].numpy().tolist() == batch["img"][i].as_py()
        assert ctx["name"].numpy().decode() == batch["name"][i].as_py()
        assert seq["tokens"].to_list() == batch["tokens"][i].as_py()
        assert seq["scores"].to_list() == batch["scores"][i].as_py()


def test_records_over_one_mebibyte_round_trip_through_tensorflow(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.bytes(1_600_000)
    ints = rng.integers(-(2**62), 2**62, 300_000)
    batch = pa.record_batch({"blob": pa.array([big, b"x"]), "ints": pa.array([ints, [1]], pa.list_(pa.int64()))})
    path = str(tmp_path / "big.tfrecord")
    with RecordWriter(open(path, "wb")) as w:
        w.write(codec.encode(batch).data)
    (serialized, small) = [t.numpy() for t in tf.data.TFRecordDataset(path)]
    assert len(serialized) > 1 << 20
    parsed = tf.io.parse_single_example(serialized, {"blob": tf.io.FixedLenFeature([], tf.string),
                                                     "ints": tf.io.VarLenFeature(tf.int64)})
    assert parsed["blob"].numpy() == big
    assert np.array_equal(parsed["ints"].values.numpy(), ints)
    with open(path, "rb") as f:
        chunks = list(iter_chunks(f, path=path, chunk_bytes=4096))
    back = pa.Table.from_batches([codec.decode(c, batch.schema) for c in chunks])
    assert back.equals(pa.Table.from_batches([batch]))


# ------------------------------------------------------------------------------------------------
# Wire-format rules, checked against protobuf's own parser


UNKNOWN = varint(15 << 3 | 0) + varint(300) + varint(14 << 3 | 1) + b"\x01" * 8 + ld(13, b"junk") + \
    varint(12 << 3 | 5) + b"\x02" * 4


@pytest.mark.parametrize("name,payload,schema", [
    ("unpacked int64",
     example(entry(b"a", ld(3, varint(1 << 3) + varint(5) + varint(1 << 3) + varint(-3) + ld(1, varint(7))))),
     pa.schema([("a", pa.list_(pa.int64()))])),
    ("unpacked float",
     example(entry(b"a", ld(2, b"\x0d" + struct.pack("<f", 1.5) + ld(1, struct.pack("<2f", 2, 3)) + b"\x0d" +
                         struct.pack("<f", -0.0)))),
     pa.schema([("a", pa.list_(pa.float32()))])),
    ("unknown fields everywhere",
     UNKNOWN + ld(1, UNKNOWN + ld(1, ld(1, b"a") + ld(2, UNKNOWN + ld(3, UNKNOWN + ld(1, varint(9))))) + UNKNOWN),
     pa.schema([("a", pa.list_(pa.int64()))])),
    ("entries out of order, value before key",
     example(ld(1, ld(2, ld(1, ld(1, b"v"))) + ld(1, b"b")), entry(b"a", ld(3, ld(1, varint(1))))),
     pa.schema([("a", pa.int64()), ("b", pa.binary())])),
    ("duplicate key: last wins",
     example(entry(b"a", ld(3, ld(1, varint(1) + varint(2)))), entry(b"b", ld(3, ld(1, varint(5)))),
             entry(b"a", ld(3, ld(1, varint(3))))),
     pa.schema([("a", pa.list_(pa.int64())), ("b", pa.int64())])),
    ("entry without key is the empty name",
     example(entry(None, ld(1, ld(1, b"anon")))),
     pa.schema([("", pa.binary())])),
    ("entry without value is present and empty",
     example(entry(b"a", None)),
     pa.schema([("a", pa.list_(pa.int64()))])),
    ("oneof: a later kind replaces an earlier one",
     example(entry(b"a", ld(1, ld(1, b"x")) + ld(3, ld(1, varint(4))))),
     pa.schema([("a", pa.list_(pa.int64()))])),
    ("oneof: a repeated kind merges",
     example(entry(b"a", ld(3, ld(1, varint(1))) + ld(1, ld(1, b"x")) + ld(3, ld(1, varint(2)))
                   + ld(3, ld(1, varint(3))))),
     pa.schema([("a", pa.list_(pa.int64()))])),
    ("features field repeated: maps merge",
     example(entry(b"a", ld(3, ld(1, varint(1))))) + example(entry(b"b", ld(2, ld(1, struct.pack("<f", 2)))))
     , pa.schema([("a", pa.int64()), ("b", pa.float32())])),
    ("negative int64 is a ten-byte varint",
     example(entry(b"a", ld(3, ld(1, varint(-1) + varint(-(2**63)))))),
     pa.schema([("a", pa.list_(pa.int64()))])),
])
def test_wire_rules_match_protobuf(name, payload, schema):
    decoded = [ref.decode_example(payload)]
    batch = decode_payloads([payload], schema)
    for f in schema:
        want = ref.expected_column(decoded, f.name, f.type)
        kind = decoded[0][f.name][0] if f.name in decoded[0] and decoded[0][f.name][0] else "int64_list"
        assert_column_equal(batch.column(f.name).to_pylist(), want, kind)


def test_unknown_fields_inside_a_map_entry_are_skipped():
    # C++ protobuf keeps such an entry and drops the unknown fields; upb (Python) instead moves the
    # whole entry into the parent's unknown fields. We follow C++ (and TensorFlow's protos).
    payload = example(ld(1, UNKNOWN + ld(1, b"a") + UNKNOWN + ld(2, ld(3, ld(1, varint(9)))) + UNKNOWN))
    assert decode_payloads([payload], pa.schema([("a", pa.int64())])).column(0).to_pylist() == [9]


def test_projection_materialises_only_requested_columns():
    payload = ref.encode_example({"a": ("int64_list", [1]), "b": ("bytes_list", [b"x" * 100]),
                                  "c": ("float_list", [1.0])})
    batch = decode_payloads([payload] * 3, pa.schema([("c", pa.float32())]))
    assert batch.schema.names == ["c"] and batch.column(0).to_pylist() == [1.0] * 3
    empty = decode_payloads([payload] * 3, pa.schema([]))
    assert empty.num_rows == 3 and empty.num_columns == 0


def test_missing_is_null_and_empty_is_empty_list():
    payloads = [ref.encode_example({"a": ("int64_list", [])}), ref.encode_example({})]
    batch = decode_payloads(payloads, pa.schema([("a", pa.list_(pa.int64())), ("s", pa.string())]))
    assert batch.column("a").to_pylist() == [[], None]
    assert batch.column("s").to_pylist() == [None, None]


def test_read_schema_may_widen_or_narrow_with_checks():
    payload = ref.encode_example({"a": ("int64_list", [300]), "f": ("float_list", [0.5])})
    batch = decode_payloads([payload], pa.schema([("a", pa.int32()), ("f", pa.float64())]))
    assert batch.to_pydict() == {"a": [300], "f": [0.5]}
    with pytest.raises(DecodeError, match=r"mem.tfrecord, offset 0, column 'a'.*int8"):
        decode_payloads([payload], pa.schema([("a", pa.int8())]))


def test_byte_array_round_trip():
    payloads = [b"", b"\x00\xff", b"abc" * 1000]
    batch = decode_payloads(payloads, codec.BYTE_ARRAY_SCHEMA, "ByteArray")
    assert batch.column("record").to_pylist() == payloads
    enc = codec.encode(batch, "ByteArray")
    assert bytes(enc.data) == frame_records(payloads)


def test_encode_converts_widths_and_bools():
    batch = pa.record_batch({
        "i8": pa.array([-1, 2], pa.int8()), "u32": pa.array([2**32 - 1, 0], pa.uint32()),
        "u64": pa.array([2**63 - 1, 0], pa.uint64()), "b": pa.array([True, False]),
        "h": pa.array([np.float16(0.5), np.float16(-1)], pa.float16()),
        "d": pa.array([0.25, 1e30 * 0 + 3.0], pa.float64()),
        "ls": pa.array([["x"], []], pa.large_list(pa.large_string())),
        "sv": pa.array(["view", "v"], pa.string_view()),
    })
    enc = codec.encode(batch)
    chunk = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="m"))
    got = ref.decode_example(bytes(chunk.record(0)))
    assert got == {"i8": ("int64_list", [-1]), "u32": ("int64_list", [2**32 - 1]), "u64": ("int64_list", [2**63 - 1]),
                   "b": ("int64_list", [1]), "h": ("float_list", [0.5]), "d": ("float_list", [0.25]),
                   "ls": ("bytes_list", [b"x"]), "sv": ("bytes_list", [b"view"])}


def test_ray_tensor_columns_encode_as_flat_lists_and_read_back_as_tensors():
    from ray.data.extensions import ArrowTensorArray

    images = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    tensors = ArrowTensorArray.from_numpy(images)
    batch = pa.RecordBatch.from_arrays([tensors], names=["img"])
    chunk = next(iter_chunks(io.BytesIO(bytes(codec.encode(batch.slice(1)).data)), path="m"))
    assert ref.decode_example(bytes(chunk.record(0)))["img"] == ("int64_list", images[1].ravel().tolist())
    back = codec.decode(chunk, batch.schema).column("img")
    assert back.type == tensors.type and np.array_equal(np.stack([np.asarray(x) for x in back.to_pylist()]), images[1:])


def test_sliced_batches_encode_their_own_rows():
    batch = pa.record_batch({"x": pa.array([[1], [2, 3], None, [4]], pa.list_(pa.int64())),
                             "s": pa.array(["a", None, "c", "d"]), "f": pa.array([[1, 2], [3, 4], [5, 6], [7, 8]],
                                                                                pa.list_(pa.int64(), 2))})
    part = batch.slice(1, 3)
    enc = codec.encode(part)
    chunk = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="m"))
    assert codec.decode(chunk, batch.schema).to_pylist() == part.to_pylist()


# ------------------------------------------------------------------------------------------------
# Errors name the place


def test_scalar_with_zero_or_two_values_names_file_offset_column():
    first = ref.encode_example({"a": ("int64_list", [1])})
    two = ref.encode_example({"a": ("int64_list", [1, 2])})
    with pytest.raises(DecodeError) as e:
        decode_payloads([first, two], pa.schema([("a", pa.int64())]), path="data/part-0.tfrecord")
    assert e.value.path == "data/part-0.tfrecord" and e.value.offset == 16 + len(first) and e.value.column == "a"
    assert "holds 2" in str(e.value) and "data/part-0.tfrecord" in str(e.value)
    assert f"offset {16 + len(first)}" in str(e.value)
    with pytest.raises(DecodeError, match="offset 0, column 'a'.*holds 0"):
        decode_payloads([ref.encode_example({"a": ("int64_list", [])})], pa.schema([("a", pa.int64())]))


def test_fixed_size_list_count_mismatch():
    with pytest.raises(DecodeError, match=r"column 'a'.*exactly 3 values.*holds 2"):
        decode_payloads([ref.encode_example({"a": ("float_list", [1.0, 2.0])})],
                        pa.schema([("a", pa.list_(pa.float32(), 3))]))


def test_kind_mismatch_is_an_error_not_a_reinterpretation():
    with pytest.raises(DecodeError, match=r"column 'a'.*float_list but the schema says int64_list"):
        decode_payloads([ref.encode_example({"a": ("float_list", [1.0])})], pa.schema([("a", pa.list_(pa.int64()))]))


@pytest.mark.parametrize("payload,what", [
    (example(entry(b"b", ld(3, ld(1, b"\xff\xff")))), "packed int64 varint runs past"),
    (ld(1, b"\x0a\x7f"), "overruns its parent"),
    (b"\x0a", "length varint runs past"),
    (example(entry(b"a", ld(2, ld(1, b"\x00\x00\x80")))), "not a multiple of 4"),
    (b"\x0b\x0c", "unsupported wire type"),
    (b"\x80" * 11, "tag varint runs past"),
])
def test_malformed_records_raise_decode_error(payload, what):
    good = ref.encode_example({"a": ("float_list", [1.0])})
    with pytest.raises(DecodeError, match=what) as e:
        decode_payloads([good, payload], pa.schema([("a", pa.list_(pa.float32())), ("b", pa.list_(pa.int64()))]))
    assert e.value.offset == 16 + len(good)


def test_invalid_utf8_for_string_column_names_record():
    good = ref.encode_example({"s": ("bytes_list", [b"ok"])})
    bad = ref.encode_example({"s": ("bytes_list", [b"\xff\xfe"])})
    with pytest.raises(DecodeError) as e:
        decode_payloads([good, bad], pa.schema([("s", pa.string())]))
    assert e.value.column == "s" and e.value.offset == 16 + len(good)


def test_encode_rejects_nulls_inside_lists():
    with pytest.raises(TFRecordError, match=r"column 'x'.*null list element"):
        codec.encode(pa.record_batch({"x": pa.array([[1, None]], pa.list_(pa.int64()))}))
    with pytest.raises(TFRecordError, match=r"column 'q'.*null inner list"):
        codec.encode(pa.record_batch({"q": pa.array([[[1], None]], pa.list_(pa.list_(pa.int64())))}), "SequenceExample")


def test_encode_rejects_uint64_overflow_and_inexact_float64():
    with pytest.raises(TFRecordError, match=r"column 'u'.*18446744073709551615.*int64"):
        codec.encode(pa.record_batch({"u": pa.array([1, 2**64 - 1], pa.uint64())}))
    with pytest.raises(TFRecordError) as e:
        codec.encode(pa.record_batch({"d": pa.array([[0.5], [0.25, 0.1]])}))
    assert e.value.column == "d" and str(e.value) == (
        "column 'd': float64 value 0.1 is not exactly representable as float32, TFRecord's only float type; "
        "pass allow_float64_narrowing=True to round it, or cast the column to float32")
    enc = codec.encode(pa.record_batch({"d": pa.array([0.5, 0.1, math.nan, math.inf])}), allow_float64_narrowing=True)
    chunk = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="m"))
    assert ref.decode_example(bytes(chunk.record(1)))["d"] == ("float_list", [f32(0.1)])


@pytest.mark.parametrize("t", [pa.struct([("a", pa.int64())]), pa.timestamp("s"),
                               pa.map_(pa.string(), pa.int64()), pa.dictionary(pa.int32(), pa.string()), pa.date32(),
                               pa.list_(pa.struct([("a", pa.int64())]))])
def test_unsupported_types_fail_up_front_naming_column(t):
    with pytest.raises(SchemaError, match=rf"column 'bad'.*{str(t)[:6]}"):
        codec.check_encodable(pa.schema([("ok", pa.int64()), ("bad", t)]))


def test_list_of_lists_needs_sequence_example():
    with pytest.raises(SchemaError, match="column 'q'.*SequenceExample"):
        codec.check_encodable(pa.schema([("q", pa.list_(pa.list_(pa.int64())))]))


def test_null_typed_column_round_trips_as_kindless_feature():
    batch = pa.record_batch({"n": pa.array([[], None], pa.list_(pa.null())), "k": pa.array([1, 2])})
    enc = codec.encode(batch)
    chunk = next(iter_chunks(io.BytesIO(bytes(enc.data)), path="m"))
    assert ref.decode_example(bytes(chunk.record(0)))["n"] == (None, [])
    assert "n" not in ref.decode_example(bytes(chunk.record(1)))
    assert codec.decode(chunk, batch.schema).equals(batch)


def test_recycled_buffers_hold_only_the_new_decode():
    # Column buffers over 256 KiB are recycled once Arrow lets go of them (native/pool.c): each
    # decode must overwrite all it hands out, on two threads at once, while earlier tables live on.
    from concurrent.futures import ThreadPoolExecutor

    schema = pa.schema([("v", pa.list_(pa.int64())), ("s", pa.binary()), ("f", pa.list_(pa.float32(), 64))])
    rng = np.random.default_rng(3)

    def batch(seed: int) -> tuple[list[bytes], dict]:
        rows = int(rng.integers(150, 200))
        v = [rng.integers(-(seed + 1) * 1000, 300, int(rng.integers(500, 1500))).tolist() for _ in range(rows)]
        s = [bytes([seed % 256]) * int(rng.integers(500, 1500)) for _ in range(rows)]
        f = rng.standard_normal((rows, 64)).astype(np.float32)
        payloads = [ref.encode_example({"v": ("int64_list", v[i]), "s": ("bytes_list", [s[i]]),
                                        "f": ("float_list", f[i].tolist())}) for i in range(rows)]
        return payloads, {"v": v, "s": s, "f": f.tolist()}

    batches = [batch(k) for k in range(8)]
    chunks = [chunk_of(p) for p, _ in batches]

    def decode_and_check(k: int) -> pa.Table:
        got = codec.decode(chunks[k], schema)
        assert got.to_pydict() == batches[k][1]
        return got

    kept = [decode_and_check(k) for k in range(8)]
    del kept[::2]  # half the buffers go back to the pool while the other half stay in use
    with ThreadPoolExecutor(2) as pool:
        later = list(pool.map(decode_and_check, [k % 8 for k in range(40)]))
    for k, table in zip([1, 3, 5, 7], kept):
        assert table.to_pydict() == batches[k][1]
    assert len(later) == 40


# ------------------------------------------------------------------------------------------------
# decode_records: serialized records (record_type="ByteArray") decoded where they are consumed


@SETTINGS
@given(data=st.data(), large=st.booleans(), skip=st.integers(0, 3), pieces=st.integers(1, 3))
def test_decode_records_matches_protobuf(data, large, skip, pieces):
    """Any slice of a binary or large_binary column, in one chunk or several, decodes as
    protobuf parses each record."""
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1))
    payloads = [ref.encode_example(r) for r in rows]
    schema = schema_of(specs)
    arr = pa.array([b"junk"] * skip + payloads, pa.large_binary() if large else pa.binary()).slice(skip)
    cut = sorted({0, len(arr), *data.draw(st.lists(st.integers(0, len(arr)), max_size=pieces - 1))})
    records = pa.chunked_array([arr.slice(a, b - a) for a, b in zip(cut, cut[1:])], arr.type)
    batch = codec.decode_records(pa.table({"path": ["f"] * len(arr), "record": records}), schema)
    assert batch.schema == schema
    decoded = [ref.decode_example(p) for p in payloads]
    for name, (kind, _) in specs.items():
        expected = ref.expected_column(decoded, name, schema.field(name).type)
        assert_column_equal(batch.column(name).to_pylist(), expected, kind)


def test_decode_records_reads_tensorflow_records_as_parse_example_does(tmp_path):
    path = str(tmp_path / "tf.tfrecord")
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (40, 784))
    with tf.io.TFRecordWriter(path) as w:
        for i, row in enumerate(pixels):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "pixels": tf.train.Feature(int64_list=tf.train.Int64List(value=row)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
            })).SerializeToString())
    with open(path, "rb") as f:
        (chunk,) = iter_chunks(f, path=path)
    records = codec.decode(chunk, codec.BYTE_ARRAY_SCHEMA, "ByteArray")
    schema = pa.schema([("pixels", pa.list_(pa.uint8(), 784)), ("label", pa.int64())])
    got = codec.decode_records(records, schema)
    spec = {"pixels": tf.io.FixedLenFeature([784], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    parsed = tf.io.parse_example([bytes(r) for r in records.column("record").to_pylist()], spec)
    pixels = np.stack(got.column("pixels").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(pixels, parsed["pixels"].numpy())
    np.testing.assert_array_equal(got.column("label").to_numpy(), parsed["label"].numpy())


def test_decode_records_names_the_row_and_column():
    good = ref.encode_example({"x": ("int64_list", [1])})
    bad = ref.encode_example({"x": ("float_list", [1.0])})
    schema = pa.schema([("x", pa.int64())])
    with pytest.raises(DecodeError, match=r"^column 'x': record 2 of a 3-record batch: feature is float_list .*"
                                          r"read_tfrecords\(\.\.\., schema=\.\.\.\)"):
        codec.decode_records(pa.array([good, good, bad], pa.binary()), schema)
    with pytest.raises(DecodeError, match=r"record 1 of a 2-record batch is null"):
        codec.decode_records(pa.array([good, None], pa.binary()), schema)
    with pytest.raises(ValueError, match=r"needs the column 'record'.*\['x'\]"):
        codec.decode_records(pa.table({"x": [1]}), schema)
    with pytest.raises(ValueError, match=r"not string"):
        codec.decode_records(pa.array(["a"]), schema)
    assert codec.decode_records(pa.array([], pa.binary()), schema).num_rows == 0
