"""The TensorFlow-native reader (tfrecord_dataset): the rows and tensors read_tfrecords and tf_dataset give,
read by TensorFlow's own ops; each epoch's shards cover every row exactly once."""

import os

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import ray_tfrecord
from ray_tfrecord import SchemaError
from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.framing import RecordWriter
from ray_tfrecord._src.core.layout import SCHEMA_FILE
from ray_tfrecord._src.core.schema import stored_schema
from ray_tfrecord._src.data.feed.splits import plan_splits, read_pieces
from ray_tfrecord._src.tf.native_reader import shard_runs
from ray_tfrecord._src.tf.tensors import tensors_from_arrow
from ray_tfrecord.tf import tf_dataset, tfrecord_dataset

pytestmark = pytest.mark.timeout(300)

ROWS = 120
RNG = np.random.default_rng(7)
INTS = RNG.integers(-100, 100, ROWS)
BYTES = [bytes(RNG.integers(0, 256, int(n), dtype=np.uint8)) for n in RNG.integers(0, 9, ROWS)]
LENGTHS = RNG.integers(0, 4, ROWS)


def _list(values, t):
    """Rows of ``LENGTHS[i]`` values from ``values``; every 7th row null (a record without the feature)."""
    splits = np.concatenate([[0], np.cumsum(LENGTHS)])
    return pa.array([None if i % 7 == 3 else list(values[splits[i]:splits[i + 1]]) for i in range(ROWS)], t)


# Every Arrow type the codec reads and TensorFlow can hold: the widths and kinds of each TFRecord kind,
# scalars, fixed-size lists and lists, and a Ray-style tensor column.
TYPES = {
    "id": pa.array(np.arange(ROWS), pa.int64()),
    "i8": pa.array(INTS, pa.int8()), "i16": pa.array(INTS * 300, pa.int16()), "i32": pa.array(INTS * 10**7, pa.int32()),
    "u8": pa.array(INTS + 100, pa.uint8()), "u16": pa.array(INTS + 100, pa.uint16()),
    "u32": pa.array(INTS + 2**31, pa.uint32()), "u64": pa.array(INTS + 100, pa.uint64()),
    "i64": pa.array(INTS * 2**55, pa.int64()), "flag": pa.array(INTS > 0, pa.bool_()),
    "f16": pa.array((INTS / 8).astype(np.float16), pa.float16()), "f32": pa.array(INTS / 3, pa.float32()),
    "f64": pa.array((INTS / 4).astype(np.float64), pa.float64()),
    "word": pa.array([b.hex() for b in BYTES], pa.string()), "blob": pa.array(BYTES, pa.binary()),
    "lword": pa.array([b.hex() for b in BYTES], pa.large_string()),
    "pair": pa.array([[int(i), -int(i)] for i in INTS], pa.list_(pa.int64(), 2)),
    "xyz": pa.array([[float(i), 0.5, -float(i)] for i in INTS], pa.list_(pa.float32(), 3)),
    "names": pa.array([[b, b"z"] for b in BYTES], pa.list_(pa.binary(), 2)),
    "tokens": _list(RNG.integers(-5, 5, int(LENGTHS.sum())), pa.list_(pa.int32())),
    "scores": _list(RNG.random(int(LENGTHS.sum())), pa.large_list(pa.float32())),
    "tags": _list([f"t{n}" for n in RNG.integers(0, 99, int(LENGTHS.sum()))], pa.list_(pa.string())),
    "maybe": pa.array([None if i % 5 == 0 else int(i) for i in INTS], pa.int64()),
    "maybe_vec": pa.array([None if i % 6 == 0 else [float(i), 1.0] for i in INTS], pa.list_(pa.float32(), 2)),
}
DEFAULTS = {"maybe": -1, "maybe_vec": [0.0, 0.0]}


def _write(root, table: pa.Table, files: dict[str, slice], compression=None) -> str:
    """``table``'s rows into the files named (relative to ``root``, Hive directories allowed), with the
    schema recorded as write_tfrecords records it."""
    for name, rows in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with RecordWriter(open(path, "wb"), compression) as w:
            w.write(codec.encode(table.slice(rows.start, rows.stop - rows.start)).data)
    with open(os.path.join(root, SCHEMA_FILE), "wb") as f:
        f.write(stored_schema(table.schema, "Example").serialize())
    return str(root)


def _expected(plan, columns, defaults=None) -> dict:
    """What read_tfrecords decodes (the same native decoder, without Ray), as tf_dataset's tensors."""
    pieces = [((i, 0, s.rows), 1.0) for i, s in enumerate(plan.splits)]
    blocks = [(i,) for i in range(len(plan.splits))]
    tables = read_pieces(plan, pieces, blocks=blocks, epoch=0, seed=0, shuffle=False, columns=columns,
                         weight_column="w")
    return tensors_from_arrow(pa.concat_tables(tables), columns, defaults=defaults)


def _drain(dataset) -> dict:
    """Every batch's columns (a dict of features), concatenated."""
    batches = list(dataset)
    return {c: tf.concat([b[c] for b in batches], 0) for c in batches[0]}


def _values(t):
    return t.to_list() if isinstance(t, tf.RaggedTensor) else t.numpy().tolist()


def test_every_type_reads_as_read_tfrecords_gives_it(tmp_path):
    table = pa.table(TYPES)
    root = _write(tmp_path / "types", table, {"a.tfrecord": slice(0, 50), "b.tfrecord": slice(50, ROWS)})
    plan = plan_splits(root, split_bytes=1024)
    assert len(plan.splits) > 4  # several splits a file: the runs join them
    columns = list(TYPES)
    native = tfrecord_dataset(plan, feature_columns=columns, batch_size=32, drop_last=False, defaults=DEFAULTS)
    assert native.cardinality() == 4
    want = _expected(plan, columns, DEFAULTS)
    got = _drain(native)
    for c in columns:
        assert got[c].dtype == want[c].dtype, c
        assert _values(got[c]) == _values(want[c]), c
    # The same element_spec as tf_dataset's (its spec is the column plans', tensors.type_spec).
    for c, spec in native.element_spec.items():
        assert spec == tf.type_spec_from_value(want[c])._unbatch()._batch(None), c


def test_a_tensor_extension_column_is_dense_as_in_tf_dataset(tmp_path):
    from ray.data.extensions import ArrowTensorArray

    images = ArrowTensorArray.from_numpy(np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3))
    table = pa.table({"image": images, "label": pa.array(np.arange(6))})
    plan = plan_splits(_write(tmp_path / "t", table, {"part.tfrecord": slice(0, 6)}))
    (image, label), = tfrecord_dataset(plan, feature_columns="image", label_columns="label", batch_size=6)
    np.testing.assert_array_equal(image.numpy(), images.to_numpy())
    assert label.numpy().tolist() == list(range(6))


def test_partitioned_and_gzip_datasets_match_read_tfrecords_through_tf_dataset(ray_local, tmp_path):
    table = pa.table({k: TYPES[k] for k in ("id", "i32", "pair", "tokens", "word")})
    files = {"day=1/color=red/a.tfrecord": slice(0, 40), "day=1/color=blue/b.tfrecord": slice(40, 70),
             "day=2/color=red/c.tfrecord": slice(70, ROWS)}
    for compression in (None, "gzip"):
        root = _write(tmp_path / str(compression), table, files, compression)
        columns = ["id", "i32", "pair", "tokens", "word", "day", "color"]
        ray_feed = tf_dataset(ray_tfrecord.read_tfrecords(root), feature_columns=columns, batch_size=ROWS,
                              drop_last=False)
        native = tfrecord_dataset(root, feature_columns=columns, batch_size=ROWS, drop_last=False)
        assert native.element_spec == ray_feed.element_spec
        got, want = _drain(native), _drain(ray_feed)
        # Ray's read tasks may finish files in another order.
        mine, theirs = np.argsort(got["id"].numpy()), np.argsort(want["id"].numpy())
        for c in columns:
            assert [_values(got[c])[i] for i in mine] == [_values(want[c])[i] for i in theirs], (compression, c)


def test_each_epochs_shards_hold_every_row_once_in_equal_parts(tmp_path):
    table = pa.table({"id": TYPES["id"], "xyz": TYPES["xyz"]})
    root = _write(tmp_path / "d", table, {"a.tfrecord": slice(0, 50), "b.tfrecord": slice(50, 90)})
    _write(tmp_path / "d", table, {"c.tfrecord.gz": slice(90, ROWS)}, "gzip")
    plan = plan_splits(root, split_bytes=512)
    ids = TYPES["id"].to_pylist()
    for count in (1, 2, 3, 7):
        shards = []
        for index in range(count):
            feed = tfrecord_dataset(plan, feature_columns="id", batch_size=1, shard=(index, count))
            shards.append([int(x) for x in feed.unbatch()])
        # Shard i holds rows [i*N//n, (i+1)*N//n) of the plan's order: contiguous, at most one row apart.
        assert sum(shards, []) == ids
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        # A shard's splits of one file are one read, from the first one's byte offset.
        assert sum(len(shard_runs(plan, i, count)) for i in range(count)) <= 3 + count - 1
    shuffled = tfrecord_dataset(plan, feature_columns="id", batch_size=8, shard=(1, 2), local_shuffle_buffer_size=16,
                                local_shuffle_seed=1, drop_last=False)
    epochs = [[int(x) for x in shuffled.unbatch()] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == ids[60:]
    assert epochs[0] != epochs[1] != ids[60:]


def test_a_shard_index_known_at_run_time_reads_that_shard(tmp_path):
    """A parameter-server worker's index is a tensor filled in when its graph runs: the same graph serves
    every worker, each its own shard, each the smallest shard's full batches."""
    table = pa.table({"id": TYPES["id"], "xyz": TYPES["xyz"]})
    root = _write(tmp_path / "d", table, {"a.tfrecord": slice(0, 50), "b.tfrecord": slice(50, ROWS)})
    plan = plan_splits(root, split_bytes=512)

    @tf.function
    def shard_of(index):
        feed = tfrecord_dataset(plan, feature_columns="id", batch_size=6, shard=(index, 7))
        return feed.unbatch().batch(ROWS).get_single_element(), feed.cardinality()

    smallest = ROWS // 7 // 6 * 6  # 17 rows in the smallest shard: 2 full batches of 6
    for index in range(7):
        got, batches = shard_of(tf.constant(index, tf.int64))
        lo = index * ROWS // 7
        assert [int(x) for x in got] == list(range(lo, lo + smallest))
        assert int(batches) == smallest // 6


def test_the_reader_equals_plain_tf_data_and_parse_example(tmp_path):
    table = pa.table({"id": TYPES["id"], "xyz": TYPES["xyz"], "tokens": TYPES["tokens"]})
    root = _write(tmp_path / "d", table, {"a.tfrecord": slice(0, ROWS)})
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "xyz": tf.io.FixedLenFeature([3], tf.float32),
            "tokens": tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64)}
    plain = tf.data.TFRecordDataset(os.path.join(root, "a.tfrecord")).batch(ROWS).map(
        lambda s: tf.io.parse_example(s, spec))
    native = _drain(tfrecord_dataset(root, feature_columns=list(spec), batch_size=ROWS))
    for c, want in next(iter(plain)).items():
        assert _values(tf.cast(want, native[c].dtype)) == _values(native[c]), c


def test_refusals_name_the_column_and_the_fix(tmp_path):
    table = pa.table({"id": TYPES["id"], "seq": pa.array([[[1]]] * ROWS, pa.list_(pa.list_(pa.int64())))})
    root = _write(tmp_path / "d", table.select(["id"]), {"a.tfrecord": slice(0, ROWS)})
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the dataset"):
        tfrecord_dataset(root, feature_columns="nope", batch_size=4)
    with pytest.raises(ValueError, match=r"shard=\(2, 2\): the index must be at least 0 and below the count"):
        tfrecord_dataset(root, feature_columns="id", batch_size=4, shard=(2, 2))
    plan = plan_splits(root)
    nested = type(plan)(plan.splits, table.schema, plan.filesystem, plan.compression)
    with pytest.raises(SchemaError, match="column 'seq': a list<list<T>> column is a SequenceExample feature_list"):
        tfrecord_dataset(nested, feature_columns="seq", batch_size=4)
    hive = _write(tmp_path / "h", table.select(["id"]), {"k=__HIVE_DEFAULT_PARTITION__/a.tfrecord": slice(0, 5)})
    with pytest.raises(SchemaError, match=r"column 'k': the file's partition value is null .* pass defaults="):
        tfrecord_dataset(hive, feature_columns=["id", "k"], batch_size=4)


def test_a_spec_derived_schema_reads_what_parse_example_parses_defaults_and_partitions_included(tmp_path):
    """plan_splits(schema=) a feature-spec dict: tfrecord_dataset gives parse_example's values for it on files
    tf.io.TFRecordWriter wrote (defaults where a feature is missing, rows split by partition features), as
    tf_dataset's tensors (a uniform partition a ragged level, as its Arrow list is)."""
    from tests import reference

    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        features = {"x": ("float_list", [float(i), -float(i)])}
        if i % 3:  # the rest take the defaults
            features |= {"label": ("int64_list", [i]), "name": ("bytes_list", [b"n%d" % i]),
                         "grid": ("float_list", rng.random(4).astype(np.float32).tolist())}
        lengths = rng.integers(0, 3, rng.integers(0, 4)).tolist()
        if i % 4:
            features |= {"v": ("int64_list", rng.integers(0, 9, sum(lengths)).tolist()),
                         "splits": ("int64_list", np.concatenate([[0], np.cumsum(lengths)]).astype(int).tolist()),
                         "f": ("float_list", [float(k) for k in range(sum(lengths))]), "lens": ("int64_list", lengths)}
        rows.append(reference.encode_example(features))
    with tf.io.TFRecordWriter(str(tmp_path / "a.tfrecord")) as w:
        for r in rows:
            w.write(r)
    spec = {
        "x": tf.io.FixedLenFeature([2], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "name": tf.io.FixedLenFeature([], tf.string, default_value="none"),
        "grid": tf.io.FixedLenFeature([2, 2], tf.float32, default_value=[[0.0, 1.0], [2.0, 3.0]]),
        "nested": tf.io.RaggedFeature(tf.int64, value_key="v", partitions=[tf.io.RaggedFeature.RowSplits("splits")]),
        "by_len": tf.io.RaggedFeature(tf.float32, value_key="f", partitions=[
            tf.io.RaggedFeature.RowLengths("lens"), tf.io.RaggedFeature.UniformRowLength(1)]),
    }
    plan = plan_splits(str(tmp_path), schema=spec, split_bytes=256)
    native = tfrecord_dataset(plan, feature_columns=list(spec), batch_size=8, drop_last=False)
    got, want = _drain(native), tf.io.parse_example(rows, spec)
    for c in spec:
        assert _values(got[c]) == _values(want[c]), c
    assert _values(got["label"])[0] == -1 and _values(got["grid"])[3] == [[0.0, 1.0], [2.0, 3.0]]
    ours = _expected(plan, list(spec))
    for c, s in native.element_spec.items():
        assert s == tf.type_spec_from_value(ours[c])._unbatch()._batch(None), c
        assert _values(got[c]) == _values(ours[c]), c
