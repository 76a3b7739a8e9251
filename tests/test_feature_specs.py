"""schema= in TensorFlow's dialects (feature-spec dicts, the SequenceExample pair, TFMD Schema, schema.pbtxt,
Ray's tf_schema=) against tf.io.parse_example / parse_sequence_example on files tf.io.TFRecordWriter wrote,
and the inverse, feature_spec."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow_metadata.proto.v0 import schema_pb2

import ray_tfrecord
from ray_tfrecord import DecodeError, SchemaError
from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.feature_specs import arrow_schema, ray_tf_schema
from ray_tfrecord._src.core.framing import iter_chunks
from ray_tfrecord.tf import feature_spec
from tests import reference


def _write(path, payloads: list[bytes]) -> str:
    with tf.io.TFRecordWriter(str(path)) as w:
        for p in payloads:
            w.write(p)
    return str(path)


def _read(path: str, schema, record_type="Example") -> list[dict]:
    table = pa.Table.from_batches([codec.decode(c, arrow_schema(schema, record_type), record_type)
                                   for c in iter_chunks(open(path, "rb"), path=path)])
    return table.to_pylist()


def _tf_rows(parsed: dict, n: int) -> list[dict]:
    """parse_example's output as rows of Python values (sparse tensors as their rows' values)."""
    out: list[dict] = [{} for _ in range(n)]
    for name, t in parsed.items():
        if isinstance(t, tf.SparseTensor):
            rows = tf.RaggedTensor.from_sparse(t).to_list()
        elif isinstance(t, tf.RaggedTensor):
            rows = t.to_list()
        else:
            rows = t.numpy().tolist()
        for i, v in enumerate(rows):
            out[i][name] = v
    return out


def _dense(rows: list[dict], spec: dict) -> list[dict]:
    """Our rows with tensor columns reshaped as TensorFlow's dense tensors are."""
    out = []
    for row in rows:
        r = dict(row)
        for name, s in spec.items():
            if type(s).__name__ == "FixedLenFeature" and len(s.shape) > 1:
                r[name] = np.asarray(r[name]).reshape(s.shape).tolist()
        out.append(r)
    return out


def _example(**features) -> bytes:
    return reference.encode_example(features)


SPEC = {
    "x": tf.io.FixedLenFeature([2], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    "name": tf.io.FixedLenFeature([], tf.string, default_value="none"),
    "grid": tf.io.FixedLenFeature([2, 2], tf.float32, default_value=[[0.0, 1.0], [2.0, 3.0]]),
    "tokens": tf.io.VarLenFeature(tf.int64),
    "words": tf.io.RaggedFeature(tf.string),
    "nested": tf.io.RaggedFeature(tf.int64, value_key="v", partitions=[tf.io.RaggedFeature.RowSplits("splits")]),
    "by_len": tf.io.RaggedFeature(tf.float32, value_key="f",
                                  partitions=[tf.io.RaggedFeature.RowLengths("lens"),
                                              tf.io.RaggedFeature.UniformRowLength(1)]),
}
ROWS = [
    _example(x=("float_list", [1.0, 2.0]), label=("int64_list", [7]), name=("bytes_list", [b"a"]),
             grid=("float_list", [9.0, 8.0, 7.0, 6.0]), tokens=("int64_list", [1, 2, 3]), words=("bytes_list", [b"w"]),
             v=("int64_list", [1, 2, 3]), splits=("int64_list", [0, 1, 1, 3]), f=("float_list", [0.5, 1.5, 2.5]),
             lens=("int64_list", [2, 0, 1])),
    _example(x=("float_list", [3.0, 4.0]), tokens=("int64_list", []), v=("int64_list", []),
             splits=("int64_list", [0])),
    _example(x=("float_list", [5.0, 6.0])),
]


def test_a_feature_spec_dict_reads_what_parse_example_parses_defaults_and_ragged_rows_included(tmp_path):
    path = _write(tmp_path / "a.tfrecord", ROWS)
    ours = _read(path, SPEC)
    theirs = _tf_rows(tf.io.parse_example(ROWS, SPEC), len(ROWS))
    assert _dense(ours, SPEC) == theirs
    assert ours[2]["label"] == -1 and ours[2]["name"] == b"none" and ours[2]["nested"] == []
    assert ours[0]["nested"] == [[1], [], [2, 3]] and ours[0]["by_len"] == [[[0.5], [1.5]], [], [[2.5]]]


def test_the_translation_types_each_spec_as_the_docs_table_says():
    schema = arrow_schema(SPEC)
    assert schema.field("x").type == pa.list_(pa.float32(), 2) and not schema.field("x").nullable
    assert schema.field("grid").type == pa.fixed_shape_tensor(pa.float32(), [2, 2])
    assert schema.field("tokens").type == pa.list_(pa.int64())
    assert schema.field("nested").type == pa.list_(pa.list_(pa.int64()))
    assert schema.field("by_len").type == pa.list_(pa.list_(pa.list_(pa.float32())))
    assert schema.field("name").type == pa.binary()


def test_a_required_feature_missing_is_refused_as_parse_example_refuses_it(tmp_path):
    path = _write(tmp_path / "a.tfrecord", [_example(a=("int64_list", [1])), _example()])
    spec = {"a": tf.io.FixedLenFeature([], tf.int64)}
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example([_example(a=("int64_list", [1])), _example()], spec)
    with pytest.raises(DecodeError, match="column 'a': the record lacks this feature") as info:
        _read(path, spec)
    assert info.value.offset is not None and info.value.offset > 0


def test_bad_row_splits_name_the_file_the_record_and_the_column(tmp_path):
    rows = [_example(v=("int64_list", [1, 2]), s=("int64_list", [0, 1])), _example(v=("int64_list", [1]),
                                                                                   s=("int64_list", [0, 2]))]
    path = _write(tmp_path / "a.tfrecord", rows)
    spec = {"r": tf.io.RaggedFeature(tf.int64, value_key="v", partitions=[tf.io.RaggedFeature.RowSplits("s")])}
    with pytest.raises(DecodeError) as info:
        _read(path, spec)
    assert str(info.value) == (f"{path}, offset 0, column 'r': row_splits feature 's' must start at 0, never "
                               "decrease and end at the row's 2 values; tf.io.RaggedFeature(validate=True) "
                               "refuses it too")
    strict = {"r": tf.io.RaggedFeature(tf.int64, value_key="v", partitions=[tf.io.RaggedFeature.RowSplits("s")],
                                       validate=True)}
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(rows, strict)


def test_unmappable_specs_are_refused_naming_the_feature():
    with pytest.raises(SchemaError) as info:
        arrow_schema({"sp": tf.io.SparseFeature("i", "v", tf.float32, 10)})
    assert str(info.value).startswith("column 'sp': a SparseFeature assembles a sparse tensor")
    with pytest.raises(SchemaError, match="column 'q': dtype int32 is not one tf.io.parse_example reads"):
        arrow_schema({"q": tf.io.FixedLenFeature([], tf.int32)})
    with pytest.raises(SchemaError, match="column 'd': default_value has 1 values but shape \\[3\\] holds 3"):
        arrow_schema({"d": tf.io.FixedLenFeature([3], tf.int64, default_value=0)})
    with pytest.raises(SchemaError, match="pass record_type='SequenceExample'"):
        arrow_schema(({}, {"s": tf.io.FixedLenSequenceFeature([], tf.int64)}))


def test_a_fixed_len_sequence_feature_in_an_example_spec_is_refused_for_the_ragged_spec_that_reads_its_steps(
        tmp_path):
    rows = [_example(s=("int64_list", list(range(12)))), _example(s=("int64_list", [7] * 6)), _example()]
    path = _write(tmp_path / "a.tfrecord", rows)
    padded = {"s": tf.io.FixedLenSequenceFeature([2, 3], tf.int64, allow_missing=True)}
    with pytest.raises(SchemaError) as info:
        arrow_schema(padded)
    assert str(info.value).startswith(
        "column 's': a FixedLenSequenceFeature in an Example spec (parse_example pads it to the longest row) is not "
        "read here; tf.io.RaggedFeature(tf.int64, partitions=[tf.io.RaggedFeature.UniformRowLength(2), "
        "tf.io.RaggedFeature.UniformRowLength(3)]) reads the same steps unpadded.")
    ragged = {"s": tf.io.RaggedFeature(tf.int64, partitions=[tf.io.RaggedFeature.UniformRowLength(2),
                                                             tf.io.RaggedFeature.UniformRowLength(3)])}
    steps = [r["s"] for r in _read(path, ragged)]
    full = tf.io.parse_example(rows, padded)["s"].numpy().tolist()
    assert steps == [f[:len(s)] for f, s in zip(full, steps)] == tf.io.parse_example(rows, ragged)["s"].to_list()
    assert [len(s) for s in steps] == [2, 1, 0]


def test_a_sequence_example_pair_reads_what_parse_sequence_example_parses(tmp_path):
    rows = [reference.encode_sequence_example({"id": ("int64_list", [1])},
                                              {"frames": ("float_list", [[1.0, 2.0], [3.0, 4.0]]),
                                               "words": ("bytes_list", [[b"a"], [b"b", b"c"]])}),
            reference.encode_sequence_example({"id": ("int64_list", [2])}, {"frames": ("float_list", [])})]
    path = _write(tmp_path / "s.tfrecord", rows)
    context = {"id": tf.io.FixedLenFeature([], tf.int64), "tags": tf.io.VarLenFeature(tf.string)}
    sequence = {"frames": tf.io.FixedLenSequenceFeature([2], tf.float32, allow_missing=True),
                "words": tf.io.VarLenFeature(tf.string)}
    ours = _read(path, (context, sequence), "SequenceExample")
    ctx, seq, lengths = tf.io.parse_sequence_example(rows, context_features=context, sequence_features=sequence)
    assert [r["id"] for r in ours] == ctx["id"].numpy().tolist()
    assert [r["tags"] for r in ours] == [[], []]
    frames = seq["frames"].numpy().tolist()
    assert [r["frames"] for r in ours] == [f[:n] for f, n in zip(frames, lengths["frames"].numpy().tolist())]
    words: list[list[list]] = [[] for _ in rows]  # the sparse tensor's values by (row, step); no empty steps here
    for (b, t, _), v in zip(seq["words"].indices.numpy().tolist(), seq["words"].values.numpy().tolist()):
        words[b] += [[] for _ in range(t + 1 - len(words[b]))]
        words[b][t].append(v)
    assert [r["words"] for r in ours] == words == [[[b"a"], [b"b", b"c"]], []]
    bad = _write(tmp_path / "bad.tfrecord", [reference.encode_sequence_example(
        {"id": ("int64_list", [1])}, {"frames": ("float_list", [[1.0]])})])
    with pytest.raises(DecodeError, match="column 'frames': step 0 holds 1 values but the FixedLenSequenceFeature"):
        _read(bad, (context, sequence), "SequenceExample")


TFMD = """
feature { name: "x" type: FLOAT shape { dim { size: 2 } } }
feature { name: "label" type: INT shape { } }
feature { name: "tokens" type: INT }
feature { name: "raw" type: BYTES value_count { min: 1 max: 1 } }
"""


def _tfmd_rows() -> list[bytes]:
    return [_example(x=("float_list", [1.0, 2.0]), label=("int64_list", [1]), tokens=("int64_list", [4, 5]),
                     raw=("bytes_list", [b"r"])),
            _example(x=("float_list", [3.0, 4.0]), label=("int64_list", [0]))]


def test_a_tfmd_schema_and_its_pbtxt_read_as_tfx_bsl_turns_them_into_feature_specs(tmp_path):
    rows = _tfmd_rows()
    path = _write(tmp_path / "t.tfrecord", rows)
    schema = text_format.Parse(TFMD, schema_pb2.Schema())
    (tmp_path / "schema.pbtxt").write_text(TFMD)
    # tfx_bsl's schema_as_feature_spec: shape -> FixedLenFeature, otherwise VarLenFeature.
    spec = {"x": tf.io.FixedLenFeature([2], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64),
            "tokens": tf.io.VarLenFeature(tf.int64), "raw": tf.io.VarLenFeature(tf.string)}
    theirs = _tf_rows(tf.io.parse_example(rows, spec), len(rows))
    assert _read(path, schema) == theirs
    assert _read(path, str(tmp_path / "schema.pbtxt")) == theirs
    (tmp_path / "broken.pbtxt").write_text("feature { nme: 1 }")
    with pytest.raises(SchemaError, match="broken.pbtxt: not a TFMD Schema in text format"):
        arrow_schema(str(tmp_path / "broken.pbtxt"))
    schema.sparse_feature.add(name="sp")
    with pytest.raises(SchemaError, match="column 'sp': a TFMD sparse_feature"):
        arrow_schema(schema)


def test_ray_tf_schema_reads_every_feature_as_a_list_as_ray_does():
    schema = text_format.Parse(TFMD, schema_pb2.Schema())
    assert ray_tf_schema(schema) == pa.schema([("x", pa.list_(pa.float32())), ("label", pa.list_(pa.int64())),
                                               ("tokens", pa.list_(pa.int64())), ("raw", pa.list_(pa.binary()))])
    with pytest.raises(TypeError, match="tf_schema= takes a tensorflow_metadata Schema proto"):
        ray_tf_schema({"x": tf.io.VarLenFeature(tf.int64)})


def test_feature_spec_gives_back_the_spec_a_schema_was_read_with():
    back = feature_spec(arrow_schema(SPEC))
    assert back["label"] == tf.io.FixedLenFeature([], tf.int64, default_value=-1)
    assert back["name"] == tf.io.FixedLenFeature([], tf.string, default_value=b"none")
    assert back["grid"] == tf.io.FixedLenFeature([2, 2], tf.float32, default_value=[[0.0, 1.0], [2.0, 3.0]])
    assert back["tokens"] == tf.io.VarLenFeature(tf.int64)
    # TensorFlow before 2.21 keeps partitions as given (the spec says a list); feature_spec gives a tuple.
    nested = SPEC["nested"]
    assert back["nested"] == nested._replace(row_splits_dtype=tf.int64, partitions=tuple(nested.partitions))
    plain = feature_spec(pa.schema([("a", pa.int32()), ("b", pa.list_(pa.string())), ("c", pa.list_(pa.int8(), 3)),
                                    ("d", pa.fixed_shape_tensor(pa.float32(), [2, 3]))]))
    assert plain == {"a": tf.io.FixedLenFeature([], tf.int64),
                     "b": tf.io.RaggedFeature(tf.string, row_splits_dtype=tf.int64),
                     "c": tf.io.FixedLenFeature([3], tf.int64), "d": tf.io.FixedLenFeature([2, 3], tf.float32)}
    with pytest.raises(SchemaError, match="column 'n': a list<null> column"):
        feature_spec(pa.schema([("n", pa.list_(pa.null()))]))


def test_feature_spec_of_a_written_dataset_parses_it_with_plain_tf_data(tmp_path):
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int16()),
                             "v": pa.array([[1.5], [2.5, 3.5]], pa.list_(pa.float32())), "s": pa.array(["a", "b"])})
    data = tmp_path / "part-0.tfrecord"
    data.write_bytes(bytes(codec.encode(batch).data))
    spec = feature_spec(batch.schema)
    parsed = tf.io.parse_example([r.numpy() for r in tf.data.TFRecordDataset(str(data))], spec)
    assert parsed["id"].numpy().tolist() == [1, 2]
    assert parsed["v"].to_list() == [[1.5], [2.5, 3.5]] and parsed["s"].numpy().tolist() == [b"a", b"b"]


_values = {"int64": st.integers(-(2**63), 2**63 - 1), "float32": st.floats(width=32, allow_nan=False),
           "string": st.binary(max_size=6)}
_KINDS = {"int64": "int64_list", "float32": "float_list", "string": "bytes_list"}


@st.composite
def _spec_and_rows(draw):
    spec, rows = {}, [{} for _ in range(draw(st.integers(1, 6)))]
    for i in range(draw(st.integers(1, 4))):
        name, dtype = f"f{i}", draw(st.sampled_from(sorted(_values)))
        form = draw(st.sampled_from(["fixed", "default", "varlen", "ragged", "splits"]))
        values = _values[dtype]
        if form in ("fixed", "default"):
            n = draw(st.integers(1, 3))
            shape = [n] if draw(st.booleans()) or n != 1 else []
            default = draw(st.lists(values, min_size=n, max_size=n)) if form == "default" else None
            spec[name] = tf.io.FixedLenFeature(shape, getattr(tf, dtype),
                                               default_value=default[0] if default and not shape else default)
            for row in rows:
                if form == "fixed" or draw(st.booleans()):
                    row[name] = (_KINDS[dtype], draw(st.lists(values, min_size=n, max_size=n)))
        elif form in ("varlen", "ragged"):
            spec[name] = (tf.io.VarLenFeature(getattr(tf, dtype)) if form == "varlen"
                          else tf.io.RaggedFeature(getattr(tf, dtype)))
            for row in rows:
                if draw(st.booleans()):
                    row[name] = (_KINDS[dtype], draw(st.lists(values, max_size=4)))
        else:
            spec[name] = tf.io.RaggedFeature(getattr(tf, dtype), value_key=f"{name}_v",
                                             partitions=[tf.io.RaggedFeature.RowSplits(f"{name}_s")])
            for row in rows:
                if draw(st.booleans()):
                    lengths = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
                    row[f"{name}_v"] = (_KINDS[dtype], draw(st.lists(values, min_size=sum(lengths),
                                                                     max_size=sum(lengths))))
                    row[f"{name}_s"] = ("int64_list", np.concatenate([[0], np.cumsum(lengths)]).tolist())
    return spec, [reference.encode_example(r) for r in rows]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_spec_and_rows())
def test_property_any_spec_reads_what_parse_example_parses(tmp_path, spec_rows):
    spec, rows = spec_rows
    path = _write(tmp_path / "p.tfrecord", rows)
    ours = _read(path, spec)
    theirs = _tf_rows(tf.io.parse_example(rows, spec), len(rows))
    assert _dense(ours, spec) == theirs
    assert feature_spec(arrow_schema(spec)).keys() == spec.keys()


@pytest.mark.slow
def test_read_tfrecords_and_plan_splits_take_each_dialect_and_rays_tf_schema(ray_local, tmp_path):
    import ray_tfrecord
    from ray_tfrecord.tf import plan_splits

    rows = _tfmd_rows()
    _write(tmp_path / "t.tfrecord", rows)
    spec = {"x": tf.io.FixedLenFeature([2], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64),
            "tokens": tf.io.VarLenFeature(tf.int64)}
    theirs = _tf_rows(tf.io.parse_example(rows, spec), len(rows))
    ds = ray_tfrecord.read_tfrecords(str(tmp_path), schema=spec)
    assert ds.take_all() == theirs
    tfmd = text_format.Parse(TFMD, schema_pb2.Schema())
    assert ray_tfrecord.read_tfrecords(str(tmp_path), tf_schema=tfmd).take_all()[1] == {
        "x": [3.0, 4.0], "label": [0], "tokens": None, "raw": None}
    with pytest.raises(ValueError, match="pass schema= or tf_schema="):
        ray_tfrecord.read_tfrecords(str(tmp_path), schema=spec, tf_schema=tfmd)
    plan = plan_splits(str(tmp_path), schema=spec)
    assert plan.schema == arrow_schema(spec)


def _tft_spec(schema) -> dict:
    """TensorFlow Transform's schema_as_feature_spec (tfx-bsl cannot share Ray's environment): a feature with a
    shape (and presence.min_fraction 1, which it requires) a FixedLenFeature, any other a VarLenFeature."""
    dtypes = {schema_pb2.INT: tf.int64, schema_pb2.FLOAT: tf.float32, schema_pb2.BYTES: tf.string}
    spec = {}
    for f in schema.feature:
        if f.HasField("shape"):
            assert f.presence.min_fraction == 1
            spec[f.name] = tf.io.FixedLenFeature([d.size for d in f.shape.dim], dtypes[f.type])
        else:
            spec[f.name] = tf.io.VarLenFeature(dtypes[f.type])
    return spec


def _storage(t: pa.DataType) -> pa.DataType:
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else t


def _storage_of(arr: pa.Array) -> pa.Array:
    return arr.storage if isinstance(arr, pa.ExtensionArray) else arr


_TFMD_COLUMNS = {  # Arrow type, a value; each column's TFMD type is what its values are written as
    "i8": (pa.int8(), -3), "u32": (pa.uint32(), 7), "flag": (pa.bool_(), True), "f16": (pa.float16(), np.float16(0.5)),
    "f64": (pa.float64(), 2.25), "s": (pa.string(), "é\"\\"), "b": (pa.binary(), b"\x00\xff"),
    "xy": (pa.list_(pa.float32(), 2), [1.5, -1.0]), "img": (pa.fixed_shape_tensor(pa.int64(), [2, 2]), [1, 2, 3, 4]),
    "tokens": (pa.list_(pa.int32()), [1, 2]), "tags": (pa.large_list(pa.string()), ["a"]),
    "名 \n": (pa.int64(), 5),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(sorted(_TFMD_COLUMNS)), min_size=1, max_size=6, unique=True),
       st.lists(st.booleans(), min_size=1, max_size=5))
def test_property_tfmd_schema_reads_back_the_same_values_and_parses_as_tensorflow_transform_would(
        tmp_path, names, empty):
    schema = pa.schema([(n, _TFMD_COLUMNS[n][0]) for n in names])
    columns = {}
    for n in names:
        t, v = _TFMD_COLUMNS[n]
        listed = pa.types.is_list(t) or pa.types.is_large_list(t)
        arr = pa.array([[] if e and listed else v for e in empty], _storage(t))
        columns[n] = pa.ExtensionArray.from_storage(t, arr) if isinstance(t, pa.BaseExtensionType) else arr
    batch = pa.record_batch(list(columns.values()), schema=schema)
    path = tmp_path / "p.tfrecord"
    path.write_bytes(bytes(codec.encode(batch).data))
    tfmd = ray_tfrecord.tfmd_schema(schema)
    assert text_format.Parse(text_format.MessageToString(tfmd), schema_pb2.Schema()) == tfmd
    # schema= reads it back to the values written, widened to the three TFRecord kinds.
    wide = arrow_schema(tfmd)
    assert wide.names == names
    ours = _read(str(path), tfmd)
    for n in names:
        want = _storage_of(columns[n]).cast(_storage(wide.field(n).type)).to_pylist()
        assert [r[n] for r in ours] == want, n
    # TFMD -> feature spec (ours, and TensorFlow Transform's rule) parses as tf.io.parse_example does.
    spec = feature_spec(tfmd)
    assert spec == _tft_spec(tfmd)
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    theirs = _tf_rows(tf.io.parse_example(records, _tft_spec(tfmd)), len(records))
    assert _dense(ours, spec) == theirs


def test_tfmd_schema_refuses_what_a_tfmd_feature_cannot_say_naming_the_column(tmp_path):
    for name, match in [("label", "a FixedLenFeature's default_value has no TFMD form"),
                        ("nested", "a RaggedFeature built from other features"),
                        ("by_len", "a RaggedFeature built from other features")]:
        with pytest.raises(SchemaError, match=f"column '{name}': {match}"):
            ray_tfrecord.tfmd_schema(arrow_schema({name: SPEC[name]}))
    with pytest.raises(SchemaError, match="column 'n': a list<null> column"):
        ray_tfrecord.tfmd_schema(pa.schema([("n", pa.list_(pa.null()))]))
    with pytest.raises(SchemaError, match="column 'seq': a list<list<T>> column is a SequenceExample feature list"):
        ray_tfrecord.tfmd_schema(pa.schema([("seq", pa.list_(pa.list_(pa.int64())))]))
    # Those a VarLenFeature or a plain RaggedFeature parses map: the same rows of values.
    assert [f.name for f in ray_tfrecord.tfmd_schema(arrow_schema({k: SPEC[k] for k in ("tokens", "words", "x")}))
            .feature] == ["tokens", "words", "x"]


@pytest.mark.slow
def test_a_write_records_its_schema_for_plain_tf_data_and_tfx(ray_local, tmp_path):
    """write_tfrecords leaves the TFMD text of what it wrote beside the Arrow schema: loaded by text_format
    alone (as TFX's ImportSchemaGen or TFDV's load_schema_text load it), its features parse the files with
    tf.io.parse_example to the written values; feature_spec(dataset) gives the specs (as Arrow types them)."""
    import ray

    import ray_tfrecord

    table = pa.table({"id": pa.array([1, 2, 3], pa.int16()), "x": pa.array([[1.5, 2.0]] * 3, pa.list_(pa.float32(), 2)),
                      "tokens": pa.array([[1], [], [2, 3]], pa.list_(pa.int64())), "s": pa.array(["a", "b", "c"])})
    out = str(tmp_path / "out")
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), out)
    with open(f"{out}/_tfrecord_schema.pbtxt") as f:
        recorded = text_format.Parse(f.read(), schema_pb2.Schema())
    assert recorded == ray_tfrecord.tfmd_schema(out)
    files = tf.io.gfile.glob(f"{out}/part-*")
    for spec in (_tft_spec(recorded), feature_spec(out)):
        parsed = tf.data.TFRecordDataset(files).batch(10).map(lambda s, spec=spec: tf.io.parse_example(s, spec))
        rows = sorted((r for batch in parsed for r in _tf_rows(batch, len(batch["id"]))), key=lambda r: r["id"])
        assert rows == [{**r, "s": r["s"].encode()} for r in table.to_pylist()]
    assert ray_tfrecord.read_tfrecords(out, schema=f"{out}/_tfrecord_schema.pbtxt").count() == 3
