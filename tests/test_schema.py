"""Schema inference rules."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.core.framing import frame_records, iter_chunks
from ray_tfrecord._src.core.schema import infer_schema, merge_recorded, stored_schema

from . import reference as ref
from .strategies import column_specs, rows_for, same_floats

TF_DTYPE = {pa.int64(): tf.int64, pa.float32(): tf.float32, pa.binary(): tf.string}
TF_DEFAULT = {pa.int64(): -7, pa.float32(): 0.25, pa.binary(): b"absent"}


def infer(payloads, record_type="Example", chunk_bytes=8 << 20, **kw):
    return infer_schema(iter_chunks(io.BytesIO(frame_records(payloads)), path="s.tfrecord", chunk_bytes=chunk_bytes),
                        record_type, **kw)


def test_absence_does_not_vote_a_scalar_is_one_value_in_every_record_that_holds_it():
    one = ref.encode_example({"a": ("int64_list", [1]), "b": ("float_list", [1.0]), "c": ("bytes_list", [b"x"])})
    two = ref.encode_example({"a": ("int64_list", [1, 2]), "b": ("float_list", [2.0]), "c": ("bytes_list", [b"y"])})
    missing = ref.encode_example({"a": ("int64_list", [1]), "b": ("float_list", [2.0])})
    schema = infer([one, two, missing])
    assert schema == pa.schema([("a", pa.list_(pa.int64())), ("b", pa.float32()), ("c", pa.binary())])
    assert all(f.nullable for f in schema)
    chunk = next(iter_chunks(io.BytesIO(frame_records([one, two, missing])), path="m"))
    assert codec.decode(chunk, schema).column("c").to_pylist() == [b"x", b"y", None]


def test_a_record_holding_the_feature_with_no_values_makes_it_a_list():
    one = ref.encode_example({"e": ("int64_list", [1]), "k": ("float_list", [1.0])})
    empty = ref.encode_example({"e": ("int64_list", []), "k": (None, [])})  # k: a Feature with no kind
    schema = infer([one, empty, ref.encode_example({})])
    assert schema == pa.schema([("e", pa.list_(pa.int64())), ("k", pa.list_(pa.float32()))])
    chunk = next(iter_chunks(io.BytesIO(frame_records([one, empty, ref.encode_example({})])), path="m"))
    assert codec.decode(chunk, schema).to_pydict() == {"e": [[1], [], None], "k": [[1.0], [], None]}


def test_fixed_size_lists_on_request():
    rows = [ref.encode_example({"img": ("int64_list", [i] * 4), "v": ("float_list", [1.0] * (i % 2 + 1))}) for i in range(5)]
    assert infer(rows) == pa.schema([("img", pa.list_(pa.int64())), ("v", pa.list_(pa.float32()))])
    assert infer(rows, fixed_size_lists=True) == pa.schema([("img", pa.list_(pa.int64(), 4)), ("v", pa.list_(pa.float32()))])
    # Absence does not vote here either: a record lacking img reads as null.
    rows.append(ref.encode_example({"v": ("float_list", [1.0])}))
    schema = infer(rows, fixed_size_lists=True)
    assert schema.field("img").type == pa.list_(pa.int64(), 4)
    chunk = next(iter_chunks(io.BytesIO(frame_records(rows)), path="m"))
    assert codec.decode(chunk, schema).column("img").to_pylist() == [[i] * 4 for i in range(5)] + [None]


def test_kinds_never_merge_and_the_error_names_both_records():
    a = ref.encode_example({"x": ("int64_list", [1])})
    b = ref.encode_example({"x": ("float_list", [1.0])})
    with pytest.raises(SchemaError, match=rf"column 'x'.*float_list.*int64_list in the record at offset 0"):
        infer([a, b])
    with pytest.raises(SchemaError, match=r"column 'x'.*float_list in s.tfrecord at offset .* int64_list in s.tfrecord at offset 0"):
        infer([a, b], chunk_bytes=len(a) + 16)  # across chunks


def test_empty_features_keep_their_kind_and_kindless_ones_are_null_lists():
    rows = [ref.encode_example({"e": ("int64_list", []), "n": (None, [])}), ref.encode_example({"e": ("int64_list", [])})]
    schema = infer(rows)
    assert schema == pa.schema([("e", pa.list_(pa.int64())), ("n", pa.list_(pa.null()))])
    chunk = next(iter_chunks(io.BytesIO(frame_records(rows)), path="m"))
    batch = codec.decode(chunk, schema)
    again = next(iter_chunks(io.BytesIO(bytes(codec.encode(batch).data)), path="m"))
    assert [ref.decode_example(bytes(again.record(i))) for i in range(2)] == [ref.decode_example(r) for r in rows]


def test_sequence_example_feature_lists_are_list_of_lists():
    rec = ref.encode_sequence_example({"len": ("int64_list", [2])}, {"tok": ("bytes_list", [[b"a"], [b"b", b"c"]])})
    assert infer([rec], "SequenceExample") == pa.schema([("len", pa.int64()), ("tok", pa.list_(pa.list_(pa.binary())))])
    clash = ref.encode_sequence_example({"x": ("int64_list", [2])}, {"x": ("int64_list", [[1]])})
    with pytest.raises(SchemaError, match="column 'x'.*both a context feature and a feature_list"):
        infer([clash], "SequenceExample")


def test_byte_array_schema():
    assert infer([b"anything"], "ByteArray") == codec.BYTE_ARRAY_SCHEMA


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_inferred_schema_decodes_every_sampled_record(data):
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1))
    payloads = [ref.encode_example(r) for r in rows]
    schema = infer(payloads)
    chunk = next(iter_chunks(io.BytesIO(frame_records(payloads)), path="m"))
    batch = codec.decode(chunk, schema)
    present = {n for r in rows for n in r}
    assert set(schema.names) == present
    for name in present:
        scalar = not pa.types.is_list(schema.field(name).type)
        assert scalar == all(len(r[name][1]) == 1 for r in rows if name in r)
        for got, r in zip(batch.column(name).to_pylist(), rows):
            if name not in r:
                assert got is None
                continue
            kind, want = r[name]
            got = [got] if scalar else got
            assert same_floats(got, want) if kind == "float_list" else got == want


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_tf_written_optional_features_read_as_parse_example_with_defaults_sees_them(tmp_path, data):
    """A feature some records lack infers as a nullable scalar (or fixed-size list); the nulls are
    where TensorFlow's FixedLenFeature puts its default_value, and every other value is TF's."""
    specs = data.draw(column_specs())
    rows = data.draw(rows_for(specs, min_rows=1, max_rows=20))
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in rows:
            w.write(ref.encode_example(r))
    with open(path, "rb") as f:
        chunks = list(iter_chunks(f, path=path))
        schema = infer_schema(chunks, fixed_size_lists=True)
    assert set(schema.names) == {n for r in rows for n in r}
    if not schema:
        return  # no record holds a feature: nothing for TensorFlow to parse
    batch = pa.Table.from_batches([codec.decode(c, schema) for c in chunks], schema=schema)
    features = {}
    for field in schema:
        t = field.type
        if pa.types.is_fixed_size_list(t):
            features[field.name] = tf.io.FixedLenFeature([t.list_size], TF_DTYPE[t.value_type],
                                                         default_value=[TF_DEFAULT[t.value_type]] * t.list_size)
        elif pa.types.is_list(t):
            features[field.name] = tf.io.RaggedFeature(TF_DTYPE[t.value_type])
        else:
            features[field.name] = tf.io.FixedLenFeature([], TF_DTYPE[t], default_value=TF_DEFAULT[t])
    parsed = tf.io.parse_example(tf.constant([ref.encode_example(r) for r in rows]), features)
    for field in schema:
        t, got = field.type, batch.column(field.name).to_pylist()
        tf_values = parsed[field.name]
        tf_values = tf_values.to_list() if isinstance(tf_values, tf.RaggedTensor) else tf_values.numpy().tolist()
        if pa.types.is_fixed_size_list(t):
            got = [[TF_DEFAULT[t.value_type]] * t.list_size if v is None else v for v in got]
        elif pa.types.is_list(t):
            got = [[] if v is None else v for v in got]
        else:
            got = [[TF_DEFAULT[t] if v is None else v] for v in got]
            tf_values = [[v] for v in tf_values]
        some_row_lacks_it = any(field.name not in r for r in rows)
        assert field.nullable and (not some_row_lacks_it or None in batch.column(field.name).to_pylist())
        for g, x in zip(got, tf_values, strict=True):
            assert same_floats(g, x) if pa.types.is_floating(getattr(t, "value_type", t)) else g == x


def test_merge_recorded_keeps_types_adds_nullable_columns_and_refuses_a_changed_type():
    recorded = stored_schema([pa.field("name", pa.string(), nullable=False), pa.field("n", pa.int32())], "Example")
    appended = stored_schema([pa.field("n", pa.int32(), nullable=False), pa.field("tag", pa.binary(), nullable=False)],
                             "Example")
    merged = merge_recorded(recorded, appended, path="/d")
    assert merged == stored_schema([pa.field("name", pa.string()), pa.field("n", pa.int32()),
                                    pa.field("tag", pa.binary())], "Example")
    assert all(f.nullable for f in merged) and merged.metadata == recorded.metadata

    with pytest.raises(SchemaError) as e:
        merge_recorded(recorded, stored_schema([pa.field("n", pa.int64())], "Example"), path="/d")
    assert (e.value.path, e.value.column) == ("/d", "n")
    assert str(e.value) == ("/d, column 'n': the dataset stores it as int32, the rows appended have int64; "
                            "cast the column to int32 before appending, or write with mode='overwrite'")
    with pytest.raises(SchemaError, match="holds Example records, not SequenceExample; pass record_type='Example'"):
        merge_recorded(recorded, stored_schema([], "SequenceExample"), path="/d")
