"""write_tfrecords(serialize_tensors=, tf_schema=): checked against TensorFlow's own parsers."""

from __future__ import annotations

import glob

import numpy as np
import pyarrow as pa
import pytest
import ray

import ray_tfrecord
from ray_tfrecord import SchemaError

tf = pytest.importorskip("tensorflow")
schema_pb2 = pytest.importorskip("tensorflow_metadata.proto.v0.schema_pb2")


def tf_records(path) -> list[bytes]:
    files = sorted(glob.glob(f"{path}/*.tfrecord"))
    assert files
    return [r.numpy() for r in tf.data.TFRecordDataset(files)]


def parsed(path, spec: dict) -> dict[str, np.ndarray]:
    """Every record under ``path``, parsed by TensorFlow with ``spec``, ordered by ``id``."""
    out = tf.io.parse_example(tf.constant(tf_records(path)), spec)
    out = {k: (tf.sparse.to_dense(v) if isinstance(v, tf.sparse.SparseTensor) else v).numpy() for k, v in out.items()}
    order = np.argsort(out["id"])
    return {k: v[order] for k, v in out.items()}


def tensors() -> tuple[np.ndarray, pa.Table]:
    x = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3) / 7
    storage = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 6)
    col = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 3]), storage)
    return x, pa.table({"id": pa.array(range(5), pa.int64()), "x": col})


def tfmd(**kinds: str):
    schema = schema_pb2.Schema()
    for name, kind in kinds.items():
        f = schema.feature.add()
        f.name = name
        f.type = getattr(schema_pb2.FeatureType, kind)
    return schema


@pytest.mark.slow
def test_serialize_tensors_writes_what_parse_tensor_reads(ray_local, tmp_path):
    x, table = tensors()
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), tmp_path / "s", serialize_tensors=True)
    out = parsed(tmp_path / "s", {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([], tf.string)})
    got = np.stack([tf.io.parse_tensor(b, tf.float32).numpy() for b in out["x"]])
    np.testing.assert_array_equal(got, x)
    # The recorded schema reads them back as the tensors they were.
    back = ray_tfrecord.read_tfrecords(str(tmp_path / "s")).to_arrow_refs()
    rows = pa.concat_tables(ray.get(back)).sort_by("id")
    assert rows.schema.field("x").type == pa.fixed_shape_tensor(pa.float32(), [2, 3])
    np.testing.assert_array_equal(rows.column("x").combine_chunks().to_numpy_ndarray(), x)
    # The default is unchanged: the flat values, a FixedLenFeature of the tensor's shape.
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), tmp_path / "flat")
    flat = parsed(tmp_path / "flat", {"id": tf.io.FixedLenFeature([], tf.int64),
                                      "x": tf.io.FixedLenFeature([2, 3], tf.float32)})
    np.testing.assert_array_equal(flat["x"], x)


def test_serialize_tensors_writes_rays_tensor_columns_as_ray_does(ray_local, tmp_path):
    x = np.arange(4 * 3, dtype=np.int32).reshape(4, 3) - 5
    ds = ray.data.from_items([{"id": i, "x": x[i]} for i in range(4)])  # Ray's tensor extension type
    ray_tfrecord.write_tfrecords(ds, tmp_path / "r", serialize_tensors=True)
    out = parsed(tmp_path / "r", {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([], tf.string)})
    got = np.stack([tf.io.parse_tensor(b, tf.int32).numpy() for b in out["x"]])
    np.testing.assert_array_equal(got, x)


def test_a_call_in_rays_form_runs_and_tensorflow_parses_it_with_the_spec(ray_local, tmp_path):
    schema = tfmd(id="INT", score="FLOAT", word="BYTES", tags="INT")
    rows = [{"id": i, "score": i / 4, "word": f"w{i}", "tags": list(range(i))} for i in range(6)]
    ds = ray.data.from_arrow(pa.Table.from_pylist(rows, pa.schema(
        [("id", pa.int64()), ("score", pa.float32()), ("word", pa.string()), ("tags", pa.list_(pa.int64()))])))
    result = ray_tfrecord.write_tfrecords(ds, tmp_path / "t", tf_schema=schema)  # ds.write_tfrecords(path, tf_schema=)
    assert result.num_rows == 6
    out = parsed(tmp_path / "t", {"id": tf.io.FixedLenFeature([], tf.int64),
                                  "score": tf.io.FixedLenFeature([], tf.float32),
                                  "word": tf.io.FixedLenFeature([], tf.string),
                                  "tags": tf.io.VarLenFeature(tf.int64)})
    assert out["id"].tolist() == list(range(6))
    assert out["score"].tolist() == [i / 4 for i in range(6)]
    assert out["word"].tolist() == [f"w{i}".encode() for i in range(6)]
    assert out["tags"][5].tolist() == [0, 1, 2, 3, 4]
    # Ray's reader of the same schema reads it back.
    back = ray_tfrecord.read_tfrecords(str(tmp_path / "t"), tf_schema=schema).take_all()
    assert sorted(r["id"][0] for r in back) == list(range(6))


def test_tf_schema_types_an_all_empty_list_column(ray_local, tmp_path):
    table = pa.table({"id": pa.array([0, 1], pa.int64()), "tags": pa.array([[], []], pa.list_(pa.null()))})
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), tmp_path / "e", tf_schema=tfmd(id="INT", tags="FLOAT"))
    out = parsed(tmp_path / "e", {"id": tf.io.FixedLenFeature([], tf.int64), "tags": tf.io.VarLenFeature(tf.float32)})
    assert out["tags"].shape == (2, 0)
    assert ray_tfrecord.read_tfrecords(str(tmp_path / "e")).schema().base_schema.field("tags").type == \
        pa.list_(pa.float32())


def refused(tmp_path, table: pa.Table, **kwargs) -> str:
    with pytest.raises((SchemaError, ValueError, TypeError)) as e:
        ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), tmp_path / "no", **kwargs)
    assert not (tmp_path / "no").exists() or not list((tmp_path / "no").iterdir())
    return str(e.value)


def test_tf_schema_refuses_a_column_of_another_kind_naming_it_and_the_fix(ray_local, tmp_path):
    table = pa.table({"id": pa.array([1, 2**40], pa.int64()), "w": ["a", "b"]})
    message = refused(tmp_path, table, tf_schema=tfmd(id="FLOAT", w="BYTES"))
    assert "'id'" in message and "written as INT" in message and "Cast the column" in message
    message = refused(tmp_path, table, tf_schema=tfmd(id="INT", w="INT"))
    assert "'w'" in message and "written as BYTES" in message


def test_tf_schema_refuses_a_column_it_lacks_and_what_is_no_tfmd_schema(ray_local, tmp_path):
    table = pa.table({"id": pa.array([1], pa.int64()), "extra": [0.5]})
    message = refused(tmp_path, table, tf_schema=tfmd(id="INT"))
    assert "'extra'" in message and "not a feature of tf_schema" in message
    assert "tensorflow_metadata Schema" in refused(tmp_path, table, tf_schema={"id": "int"})
    binary = pa.table({"bytes": pa.array([b"x"])})
    assert "record_type='ByteArray' takes no tf_schema" in refused(
        tmp_path, binary, record_type="ByteArray", tf_schema=tfmd(bytes="BYTES"))


def test_tf_schema_bytes_for_a_tensor_column_needs_serialize_tensors(ray_local, tmp_path):
    _, table = tensors()
    message = refused(tmp_path, table, tf_schema=tfmd(id="INT", x="BYTES"))
    assert "'x'" in message and "serialize_tensors=True" in message
