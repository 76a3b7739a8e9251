"""The tf.data feed: specs from Arrow, values against TensorFlow's own parser, equal steps."""

import threading
import warnings
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import ray
import ray.train
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.tf.feed import tf_dataset
from ray_tfrecord._src.tf.tensors import tensors_from_arrow, type_spec

pytestmark = pytest.mark.timeout(300)


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        seq_len = int(rng.integers(0, 4))
        rows.append(
            {
                "id": i,
                "pixels": rng.integers(0, 256, 6).tolist(),
                "emb": rng.standard_normal(3).astype(np.float32).tolist(),
                "tokens": rng.integers(0, 100, int(rng.integers(0, 5))).tolist(),
                "frames": [
                    rng.standard_normal(int(rng.integers(0, 3))).astype(np.float32).tolist() for _ in range(seq_len)
                ],
                "word": f"w{i}".encode() * int(rng.integers(0, 3)),
                "label": float(i % 7),
            }
        )
    return rows


def _arrow(rows: list[dict]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.int64()),
            "pixels": pa.array([r["pixels"] for r in rows], pa.list_(pa.int64(), 6)),
            "emb": pa.array([r["emb"] for r in rows], pa.list_(pa.float32(), 3)),
            "tokens": pa.array([r["tokens"] for r in rows], pa.list_(pa.int64())),
            "frames": pa.array([r["frames"] for r in rows], pa.list_(pa.list_(pa.float32()))),
            "word": pa.array([r["word"] for r in rows], pa.binary()),
            "label": pa.array([r["label"] for r in rows], pa.float32()),
        }
    )


def _tf_parsed(rows: list[dict], tmp_path, batch_size: int) -> list[dict]:
    """Serialize with TensorFlow's protos, parse back with tf.io.parse_sequence_example."""
    path = str(tmp_path / "rows.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in rows:
            ctx = tf.train.Features(
                feature={
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[r["id"]])),
                    "pixels": tf.train.Feature(int64_list=tf.train.Int64List(value=r["pixels"])),
                    "emb": tf.train.Feature(float_list=tf.train.FloatList(value=r["emb"])),
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=r["tokens"])),
                    "word": tf.train.Feature(bytes_list=tf.train.BytesList(value=[r["word"]])),
                    "label": tf.train.Feature(float_list=tf.train.FloatList(value=[r["label"]])),
                }
            )
            frames = tf.train.FeatureList(
                feature=[tf.train.Feature(float_list=tf.train.FloatList(value=f)) for f in r["frames"]]
            )
            ex = tf.train.SequenceExample(
                context=ctx, feature_lists=tf.train.FeatureLists(feature_list={"frames": frames})
            )
            w.write(ex.SerializeToString())
    context_spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "pixels": tf.io.FixedLenFeature([6], tf.int64),
        "emb": tf.io.FixedLenFeature([3], tf.float32),
        "tokens": tf.io.RaggedFeature(tf.int64),
        "word": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.float32),
    }
    out = []
    for serialized in tf.data.TFRecordDataset(path).batch(batch_size):
        ctx, seq, _ = tf.io.parse_sequence_example(
            serialized, context_features=context_spec, sequence_features={"frames": tf.io.RaggedFeature(tf.float32)}
        )
        out.append({**ctx, **seq})
    return out


def _assert_same(ours, theirs) -> None:
    if isinstance(theirs, tf.RaggedTensor):
        assert isinstance(ours, tf.RaggedTensor)
        assert ours.ragged_rank == theirs.ragged_rank
        assert ours.to_list() == theirs.to_list()
    else:
        assert isinstance(ours, tf.Tensor)
        assert ours.dtype == theirs.dtype
        assert ours.shape == theirs.shape
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("batch_size", [7, 16])
def test_batches_match_tensorflow_parser(ray_local, tmp_path, batch_size):
    rows = _rows(101)
    # Several blocks, so batches straddle block boundaries and arrive as sliced arrays.
    ds = ray.data.from_arrow([_arrow(rows[:40]), _arrow(rows[40:77]), _arrow(rows[77:])])
    columns = ["id", "pixels", "emb", "tokens", "frames", "word"]
    feed = tf_dataset(ds, feature_columns=columns, label_columns="label", batch_size=batch_size, drop_last=False)
    expected = _tf_parsed(rows, tmp_path, batch_size)
    got = list(feed)
    assert len(got) == len(expected) == -(-101 // batch_size)
    for (features, label), want in zip(got, expected, strict=True):
        for name in columns:
            _assert_same(features[name], want[name])
        _assert_same(label, want["label"])


def test_element_spec_follows_arrow_schema(ray_local):
    table = _arrow(_rows(4)).append_column("u8", pa.array([1, 2, 3, 4], pa.uint8()))
    table = table.append_column("flag", pa.array([True, False, True, True]))
    table = table.append_column("text", pa.array(["a", "b", "c", "d"], pa.large_string()))
    table = table.append_column("grid", pa.array([[[1.0, 2.0]] * 3] * 4, pa.list_(pa.list_(pa.float64(), 2), 3)))
    table = table.append_column("big", pa.array([[1], [], [2], [3, 4]], pa.large_list(pa.int32())))
    spec = tf_dataset(ray.data.from_arrow(table), feature_columns=table.column_names, batch_size=2).element_spec
    assert spec["id"] == tf.TensorSpec((None,), tf.int64)
    assert spec["pixels"] == tf.TensorSpec((None, 6), tf.int64)
    assert spec["emb"] == tf.TensorSpec((None, 3), tf.float32)
    assert spec["tokens"] == tf.RaggedTensorSpec((None, None), tf.int64, 1, tf.int64)
    assert spec["frames"] == tf.RaggedTensorSpec((None, None, None), tf.float32, 2, tf.int64)
    assert spec["word"] == tf.TensorSpec((None,), tf.string)
    assert spec["text"] == tf.TensorSpec((None,), tf.string)
    assert spec["u8"] == tf.TensorSpec((None,), tf.uint8)
    assert spec["flag"] == tf.TensorSpec((None,), tf.bool)
    assert spec["grid"] == tf.TensorSpec((None, 3, 2), tf.float64)
    assert spec["big"] == tf.RaggedTensorSpec((None, None), tf.int32, 1, tf.int64)
    batch = next(iter(tf_dataset(ray.data.from_arrow(table), feature_columns=["grid", "flag", "big"], batch_size=4)))
    assert batch["grid"].shape == (4, 3, 2)
    assert batch["flag"].numpy().tolist() == [True, False, True, True]
    assert batch["big"].to_list() == [[1], [], [2], [3, 4]]


def test_ray_tensor_columns_are_dense(ray_local):
    images = np.arange(10 * 4 * 3, dtype=np.float32).reshape(10, 4, 3)
    ds = ray.data.from_numpy(images)
    feed = tf_dataset(ds, feature_columns="data", batch_size=4)
    assert feed.element_spec == tf.TensorSpec((None, 4, 3), tf.float32)
    got = np.concatenate([b.numpy() for b in feed])
    np.testing.assert_array_equal(got, images[:8])


def test_null_lists_are_empty_and_null_scalars_are_refused(ray_local):
    table = pa.table({"tokens": pa.array([[1, 2], None, [3]], pa.list_(pa.int64())), "x": pa.array([1.0, None, 2.0])})
    tokens = next(iter(tf_dataset(ray.data.from_arrow(table), feature_columns="tokens", batch_size=3)))
    assert tokens.to_list() == [[1, 2], [], [3]]
    # tf.data's generator op turns the SchemaError (a ValueError) into InvalidArgumentError.
    with pytest.raises(tf.errors.InvalidArgumentError, match="SchemaError: column 'x': 1 of the 3 rows .* are null"):
        list(tf_dataset(ray.data.from_arrow(table), feature_columns="x", batch_size=3))


def test_pandas_blocks_are_refused_with_the_conversion_that_works(ray_local):
    import pandas as pd

    ds = ray.data.from_pandas(pd.DataFrame({"a": [1, 2, 3, 4]}))
    with pytest.raises(SchemaError, match=r"the dataset's blocks are pandas .* batch_format='pyarrow'\)$"):
        tf_dataset(ds, feature_columns="a", batch_size=2)
    converted = ds.map_batches(lambda batch: batch, batch_format="pyarrow")
    assert [b.numpy().tolist() for b in tf_dataset(converted, feature_columns="a", batch_size=2)] == [[1, 2], [3, 4]]


def test_single_or_dict_features_and_no_label(ray_local):
    ds = ray.data.from_arrow(
        pa.table({"a": pa.array([1, 2, 3, 4]), "b": pa.array([5, 6, 7, 8]), "y": pa.array([0, 1, 0, 1])})
    )
    x, y = next(iter(tf_dataset(ds, feature_columns="a", label_columns=["y"], batch_size=4)))
    assert x.numpy().tolist() == [1, 2, 3, 4] and y["y"].numpy().tolist() == [0, 1, 0, 1]
    only = next(iter(tf_dataset(ds, feature_columns=["a", "b"], batch_size=4)))
    assert set(only) == {"a", "b"} and only["b"].numpy().tolist() == [5, 6, 7, 8]


def test_drop_last_and_steps_per_epoch(ray_local):
    ds = ray.data.range(103)
    sizes = [int(b.shape[0]) for b in tf_dataset(ds, feature_columns="id", batch_size=10)]
    assert sizes == [10] * 10
    sizes = [int(b.shape[0]) for b in tf_dataset(ds, feature_columns="id", batch_size=10, drop_last=False)]
    assert sizes == [10] * 10 + [3]
    short = tf_dataset(ds, feature_columns="id", batch_size=10, steps_per_epoch=4)
    assert short.cardinality().numpy() == 4
    assert [b.numpy()[0] for b in short] == [0, 10, 20, 30]
    # tf.data's generator op turns the RuntimeError into UnknownError.
    with pytest.raises(tf.errors.UnknownError, match="RuntimeError: this shard gave only 10 full batches"):
        list(tf_dataset(ds, feature_columns="id", batch_size=10, steps_per_epoch=11))


def _run_ranks(feeds: list, epochs: int) -> list[list[list[int]]]:
    """Consume every rank's feed concurrently, as training workers would: each rank's batches of ids."""
    batches = [[] for _ in feeds]

    def consume(rank):
        for _ in range(epochs):
            batches[rank].extend(b.numpy().tolist() for b in feeds[rank])

    threads = [threading.Thread(target=consume, args=(r,)) for r in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return batches


def test_every_rank_gets_the_same_number_of_batches(ray_local):
    """streaming_split(equal=True) + drop-the-remainder: equal steps for awkward row counts.

    Plain split iterators on the driver, outside Ray Train: the rule must not
    depend on Ray Train's world size (here 1) nor on the iterator knowing it.
    """
    batch_size = 8
    for rows, workers in [(1001, 3), (50, 3), (97, 2), (24, 3)]:
        shards = ray.data.range(rows, override_num_blocks=7).streaming_split(workers, equal=True)
        batches = _run_ranks([tf_dataset(s, feature_columns="id", batch_size=batch_size) for s in shards], epochs=2)
        counts = [len(b) for b in batches]
        expected = 2 * ((rows // workers) // batch_size)
        assert counts == [expected] * workers, (rows, workers, counts)
        assert {len(b) for rank in batches for b in rank} <= {batch_size}
        flat = [i for rank in batches for b in rank for i in b]
        assert len(flat) == workers * expected * batch_size
        # Two epochs: every row at most twice, i.e. the shards are disjoint.
        assert set(flat) <= set(range(rows)) and max(np.bincount(flat)) <= 2


def test_unequal_shards_refuse_partial_batches(ray_local, monkeypatch):
    # The world size is Ray Train's (its public context, stubbed here; test_train.py
    # checks a real run): there, ranks train in lockstep and unequal shards would hang.
    monkeypatch.setattr(ray.train, "get_context", lambda: SimpleNamespace(get_world_rank=lambda: 0, get_world_size=lambda: 2))
    shard = ray.data.range(10).streaming_split(2, equal=False)[0]
    with pytest.raises(ValueError, match=r"tf_dataset\(drop_last=False\) on one of 2 workers.*keep drop_last=True or pass steps_per_epoch="):
        tf_dataset(shard, feature_columns="id", batch_size=4, drop_last=False)
    # A whole dataset per rank (each reading its own files) is no safer.
    with pytest.raises(ValueError, match=r"tf_dataset\(drop_last=False\) on one of 2 workers.*keep drop_last=True or pass steps_per_epoch="):
        tf_dataset(ray.data.range(10), feature_columns="id", batch_size=4, drop_last=False)
    fixed = tf_dataset(shard, feature_columns="id", batch_size=4, drop_last=False, steps_per_epoch=1)
    assert fixed.cardinality().numpy() == 1


def test_strategy_gives_per_replica_batches_one_pass_per_epoch(ray_local):
    """strategy=: a distributed dataset that repeats; each epoch of steps_per_epoch is one pass."""
    strategy = tf.distribute.get_strategy()
    ds = ray.data.from_arrow(
        pa.table({"id": pa.array(range(40)), "tokens": pa.array([[i] * (i % 4) for i in range(40)])})
    )
    feed = tf_dataset(ds, feature_columns=["id", "tokens"], batch_size=8, steps_per_epoch=5, strategy=strategy)
    # The default strategy distributes to itself: the repeating dataset comes back as is.
    assert feed.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    it = iter(feed)
    for _ in range(3):
        epoch = [next(it) for _ in range(5)]
        assert [len(b["id"]) for b in epoch] == [8] * 5
        ids = np.concatenate([b["id"].numpy() for b in epoch])
        assert sorted(ids) == list(range(40))
        tokens = [row for b in epoch for row in b["tokens"].to_list()]
        assert tokens == [[i] * (i % 4) for i in ids]


def test_strategy_refuses_what_would_unbalance_replicas(ray_local):
    ds = ray.data.range(40)
    with pytest.raises(ValueError, match=r"pass the same steps_per_epoch to tf_dataset and to model\.fit"):
        tf_dataset(ds, feature_columns="id", batch_size=8, strategy=tf.distribute.get_strategy())
    # Only the replica count is read before refusing; a real 3-replica strategy needs 3 devices.
    three = SimpleNamespace(num_replicas_in_sync=3)
    with pytest.raises(ValueError, match=r"batch_size=8 is the global batch.*e\.g\. batch_size=6"):
        tf_dataset(ds, feature_columns="id", batch_size=8, steps_per_epoch=1, strategy=three)


def test_partial_batches_are_kept_outside_ray_train(ray_local):
    """On the driver no rank waits for another, so even unequal split shards keep their tails."""
    shards = ray.data.range(10).streaming_split(2, equal=False)
    feeds = [tf_dataset(s, feature_columns="id", batch_size=4, drop_last=False) for s in shards]
    batches = _run_ranks(feeds, epochs=1)
    assert sorted(i for rank in batches for b in rank for i in b) == list(range(10))


def test_epochs_reread_unless_cached(ray_local, tmp_path):
    calls = tmp_path / "calls"
    calls.mkdir()

    def mark(batch):
        # A side effect visible from the driver: one file per block Ray reads.
        (calls / f"{batch['id'][0]}-{np.random.randint(1 << 30)}").touch()
        return batch

    ds = ray.data.range(40, override_num_blocks=4).map_batches(mark, batch_size=None)

    def blocks_read_per_epoch(feed):
        before = len(list(calls.iterdir()))
        epochs = []
        for _ in range(2):
            epochs.append([b.numpy().tolist() for b in feed])
            epochs.append(len(list(calls.iterdir())) - before)
            before += epochs[-1]
        return epochs

    first, reads1, second, reads2 = blocks_read_per_epoch(tf_dataset(ds, feature_columns="id", batch_size=10))
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(40))
    assert (reads1, reads2) == (4, 4)
    first, reads1, second, reads2 = blocks_read_per_epoch(tf_dataset(ds, feature_columns="id", batch_size=10, cache=True))
    assert first == second and sorted(sum(first, [])) == list(range(40))
    assert (reads1, reads2) == (4, 0)


def test_bad_requests_fail_early(ray_local):
    ds = ray.data.from_arrow(
        pa.table({"a": pa.array([1]), "nested": pa.array([[[1]]], pa.list_(pa.list_(pa.int64()), 1))})
    )
    with pytest.raises(ValueError, match="not in the dataset"):
        tf_dataset(ds, feature_columns="missing", batch_size=1)
    with pytest.raises(ValueError, match="batch_size"):
        tf_dataset(ds, feature_columns="a", batch_size=0)
    with pytest.raises(TypeError, match="fixed-size list of variable-length lists"):
        tf_dataset(ds, feature_columns="nested", batch_size=1)
    with pytest.raises(TypeError, match="no TensorFlow equivalent"):
        type_spec(pa.timestamp("s"))


_list_of_lists = st.lists(
    st.one_of(st.none(), st.lists(st.lists(st.integers(-5, 5), max_size=3), max_size=3)), max_size=12
)


@settings(max_examples=60, deadline=None)
@given(rows=_list_of_lists, start=st.integers(0, 12), length=st.integers(0, 12))
def test_sliced_nested_lists_round_trip(rows, start, length):
    arr = pa.array(rows, pa.list_(pa.list_(pa.int64())))
    sliced = arr.slice(min(start, len(arr)), length)
    got = tensors_from_arrow(pa.table({"x": sliced}))["x"]
    assert isinstance(got, tf.RaggedTensor) and got.ragged_rank == 2
    assert got.to_list() == [r if r is not None else [] for r in sliced.to_pylist()]


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.binary(max_size=4), min_size=2, max_size=2), max_size=10), start=st.integers(0, 10))
def test_sliced_fixed_size_binary_lists(rows, start):
    arr = pa.array(rows, pa.list_(pa.binary(), 2)).slice(min(start, len(rows)))
    got = tensors_from_arrow(pa.table({"x": arr}))["x"]
    assert got.shape == (len(arr), 2)
    assert got.numpy().tolist() == arr.to_pylist()


def test_local_shuffle_keeps_every_row_once(ray_local):
    ds = ray.data.range(200, override_num_blocks=4)
    # A shuffle buffer smaller than the feed's usual fetch: fetches shrink to fit it.
    feed = tf_dataset(ds, feature_columns="id", batch_size=16, local_shuffle_buffer_size=40, local_shuffle_seed=1)
    got = [b.numpy() for b in feed]
    assert [len(b) for b in got] == [16] * 12
    flat = np.concatenate(got)
    assert len(set(flat.tolist())) == 192 and set(flat.tolist()) <= set(range(200))
    assert flat.tolist() != sorted(flat.tolist())


def test_constant_length_vector_warns_then_trains_dense_when_read_as_told(ray_local, tmp_path):
    """A TensorFlow-written fixed-length float feature fed to Keras Dense: the user's steps."""
    import tf_keras

    import ray_tfrecord

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((64, 8)).astype(np.float32)
    path = str(tmp_path / "vectors.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for v in vectors:
            feature = {
                "embedding": tf.train.Feature(float_list=tf.train.FloatList(value=v)),
                "label": tf.train.Feature(float_list=tf.train.FloatList(value=[v.sum()])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    def fit(ds):
        model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model.fit(tf_dataset(ds, feature_columns="embedding", label_columns="label", batch_size=16), verbose=0)

    inferred = ray_tfrecord.read_tfrecords(path)
    assert inferred.schema().base_schema.field("embedding").type == pa.list_(pa.float32())
    with pytest.warns(UserWarning) as warned, pytest.raises(ValueError, match="Dense layer"):
        fit(inferred)
    hint = (
        "column 'embedding' is list<item: float> with 8 values in every sampled row; the feed makes it a "
        "tf.RaggedTensor, which Keras Dense refuses. For a dense (batch, 8) tensor, read with "
        "read_tfrecords(..., fixed_size_lists=True) or give it the type pa.list_(pa.float32(), 8) in schema="
    )
    assert [str(w.message) for w in warned if w.filename == __file__] == [hint]

    # Both fixes the warning names train a dense model.
    schema = pa.schema([("embedding", pa.list_(pa.float32(), 8)), ("label", pa.float32())])
    for ds in [ray_tfrecord.read_tfrecords(path, fixed_size_lists=True), ray_tfrecord.read_tfrecords(path, schema=schema)]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            history = fit(ds)
        assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"][0])


def test_variable_length_lists_do_not_warn(ray_local):
    table = pa.table({"tokens": pa.array([[1], [2, 3], [], [4, 5, 6]], pa.list_(pa.int64()))})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        batch = next(iter(tf_dataset(ray.data.from_arrow(table), feature_columns="tokens", batch_size=4)))
    assert batch.to_list() == [[1], [2, 3], [], [4, 5, 6]]


def test_autotuning_is_off_unless_turned_back_on(ray_local):
    # An epoch's end would often wait for the autotuner's next wake-up (see tf_dataset).
    table = pa.table({"x": pa.array(np.arange(20, dtype=np.int64))})
    ds = tf_dataset(ray.data.from_arrow(table), feature_columns="x", batch_size=4)
    assert ds.options().autotune.enabled is False
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert [b.numpy().tolist() for b in ds] == [list(range(k, k + 4)) for k in range(0, 20, 4)]
    on = tf.data.Options()
    on.autotune.enabled = True
    assert ds.with_options(on).options().autotune.enabled is True


_SPARSE_SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("f", pa.float32()),
        ("b", pa.binary()),
        ("v", pa.list_(pa.float32(), 3)),
        ("id", pa.int64()),
    ]
)
_SPARSE_DEFAULTS = {"i": -1, "f": 0.5, "b": b"none", "v": [1.0, 2.0, 3.0]}


def _write_sparse_with_tensorflow(path: str, n: int) -> None:
    """Records where each of i, f, b and v is absent from some records (a different pattern each)."""
    with tf.io.TFRecordWriter(path) as w:
        for k in range(n):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[k]))}
            if k % 2:
                feature["i"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[k * 10]))
            if k % 3:
                feature["f"] = tf.train.Feature(float_list=tf.train.FloatList(value=[k / 4]))
            if k % 5:
                feature["b"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * (k % 4)]))
            if k % 4:
                feature["v"] = tf.train.Feature(float_list=tf.train.FloatList(value=[k, -k, k / 2]))
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_defaults_fill_absent_features_as_fixed_len_feature_does(ray_local, tmp_path):
    import ray_tfrecord

    path = str(tmp_path / "sparse.tfrecord")
    _write_sparse_with_tensorflow(path, 37)
    ds = ray_tfrecord.read_tfrecords(path, schema=_SPARSE_SCHEMA)
    columns = ["i", "f", "b", "v"]
    feed = tf_dataset(ds, feature_columns=columns, label_columns="id", batch_size=8, drop_last=False, defaults=_SPARSE_DEFAULTS)
    spec = {
        "i": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "f": tf.io.FixedLenFeature([], tf.float32, default_value=0.5),
        "b": tf.io.FixedLenFeature([], tf.string, default_value=b"none"),
        "v": tf.io.FixedLenFeature([3], tf.float32, default_value=[1.0, 2.0, 3.0]),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    expected = [tf.io.parse_example(b, spec) for b in tf.data.TFRecordDataset(path).batch(8)]
    got = list(feed)
    assert len(got) == len(expected) == 5
    for (features, label), want in zip(got, expected, strict=True):
        for name in columns:
            _assert_same(features[name], want[name])
        _assert_same(label, want["id"])
    # The defaults really were used: row 0 lacks every optional feature.
    first = got[0][0]
    assert (first["i"][0].numpy(), first["b"][0].numpy(), first["v"][0].numpy().tolist()) == (-1, b"none", [1, 2, 3])


def test_nulls_without_a_default_name_the_column_count_and_fix(ray_local, tmp_path):
    import ray_tfrecord

    path = str(tmp_path / "sparse.tfrecord")
    _write_sparse_with_tensorflow(path, 12)
    ds = ray_tfrecord.read_tfrecords(path, schema=_SPARSE_SCHEMA)
    # 12 rows, i present only in odd records: 6 nulls.
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(tf_dataset(ds, feature_columns="i", batch_size=12))
    assert (
        "SchemaError: column 'i': 6 of the 12 rows in this batch are null (records without the feature), and a "
        "TensorFlow tensor cannot hold nulls; pass defaults={'i': 0} to fill them, as FixedLenFeature's "
        "default_value does"
    ) in str(raised.value)
    table = ds.to_arrow_refs()
    table = pa.concat_tables(ray.get(table))
    with pytest.raises(SchemaError, match=r"column 'v': 3 of the 12 rows .* defaults=\{'v': \[0\.0\] \* 3\}"):
        tensors_from_arrow(table, ["v"])
    with pytest.raises(SchemaError, match=r"column 'b': 3 of the 12 rows .* defaults=\{'b': b\"\"\}"):
        tensors_from_arrow(table, ["b"])
    # Partial defaults: the column without one still fails.
    with pytest.raises(SchemaError, match="column 'f'"):
        tensors_from_arrow(table, ["i", "f"], defaults={"i": 0})


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"nope": 1}, r"column 'nope': defaults= names \['nope'\], which the feed does not convert"),
        ({"tokens": 0}, r"column 'tokens': defaults=\{'tokens': ...\}: the column is list<item: int64>, a variable"),
        ({"i": 1.5}, r"column 'i': defaults=\{'i': 1.5\}: 1.5 is a float, not int; give one row of int64"),
        ({"i": True}, r"column 'i': defaults=\{'i': True\}: True is a bool, not int"),
        ({"f": "0"}, r"column 'f': defaults=\{'f': '0'\}: '0' is a str, not int or float"),
        ({"b": 0}, r"column 'b': defaults=\{'b': 0\}: 0 is a int, not bytes or str"),
        ({"small": 300}, r"column 'small': defaults=\{'small': 300\}: .*300"),
        ({"v": [1.0, 2.0]}, r"column 'v': defaults=\{'v': \[1.0, 2.0\]\}: it has shape \(2,\) but a row has shape \(3,\)"),
        ({"f": [1.0]}, r"column 'f': defaults=\{'f': \[1.0\]\}: it has shape \(1,\) but a row has shape \(\)"),
    ],
)
def test_bad_defaults_are_refused_before_reading(ray_local, defaults, message):
    table = pa.table(
        {
            "i": pa.array([1, None], pa.int64()),
            "f": pa.array([1.0, None], pa.float32()),
            "b": pa.array([b"a", None]),
            "v": pa.array([[1, 2, 3], None], pa.list_(pa.float32(), 3)),
            "small": pa.array([1, None], pa.int8()),
            "tokens": pa.array([[1], None]),
        }
    )
    with pytest.raises(SchemaError, match=message):
        tf_dataset(ray.data.from_arrow(table), feature_columns=table.column_names, batch_size=2, defaults=defaults)
    with pytest.raises(SchemaError, match=message):
        tensors_from_arrow(table, defaults=defaults)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=20),
    default=st.integers(-(2**63), 2**63 - 1),
    start=st.integers(0, 20),
)
def test_defaults_fill_exactly_the_null_rows(values, default, start):
    arr = pa.array(values, pa.int64()).slice(min(start, len(values)))
    got = tensors_from_arrow(pa.table({"x": arr}), defaults={"x": default})["x"]
    assert got.dtype == tf.int64
    assert got.numpy().tolist() == [default if v is None else v for v in arr.to_pylist()]


def test_serialized_records_decode_in_the_feed_as_tensorflow_parses_them(ray_local, tmp_path):
    import ray_tfrecord

    path = str(tmp_path / "sparse.tfrecord")
    _write_sparse_with_tensorflow(path, 37)
    # Several blocks, so fetches straddle them and arrive as sliced binary arrays.
    records = ray_tfrecord.read_tfrecords(path, record_type="ByteArray").repartition(3)
    columns = ["i", "f", "b", "v"]
    feed = tf_dataset(
        records,
        feature_columns=columns,
        label_columns="id",
        batch_size=8,
        drop_last=False,
        defaults=_SPARSE_DEFAULTS,
        record_schema=_SPARSE_SCHEMA,
    )
    decoded = ray_tfrecord.read_tfrecords(path, schema=_SPARSE_SCHEMA)
    expected = list(tf_dataset(decoded, feature_columns=columns, label_columns="id", batch_size=8, drop_last=False,
                               defaults=_SPARSE_DEFAULTS))
    got = list(feed)
    assert len(got) == len(expected) == 5
    for (features, label), (want, want_label) in zip(got, expected, strict=True):
        for name in columns:
            _assert_same(features[name], want[name])
        _assert_same(label, want_label)
    spec = {"v": tf.io.FixedLenFeature([3], tf.float32, default_value=_SPARSE_DEFAULTS["v"])}
    parsed = tf.io.parse_example(next(iter(tf.data.TFRecordDataset(path).batch(37))), spec)
    np.testing.assert_array_equal(np.concatenate([f["v"].numpy() for f, _ in got]), parsed["v"].numpy())


def test_record_schema_needs_serialized_records(ray_local):
    ds = ray.data.from_arrow(pa.table({"x": pa.array([1, 2])}))
    with pytest.raises(ValueError, match=r"record_type='ByteArray'"):
        tf_dataset(ds, feature_columns="x", batch_size=1, record_schema=pa.schema([("x", pa.int64())]))
    bad = ray.data.from_arrow(pa.table({"record": pa.array([b"\xff\xff"], pa.binary())}))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"DecodeError: .*record 0 of a 1-record batch: "):
        list(tf_dataset(bad, feature_columns="x", batch_size=1, record_schema=pa.schema([("x", pa.int64())])))


def test_wide_columns_travel_alone_and_arrive_intact(ray_local):
    """A wide int64 vector beside narrow int64 columns: unpacked exactly as converted directly."""
    rng = np.random.default_rng(11)
    n = 50
    table = pa.table(
        {
            "wide": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 1 << 40, n * 40)), 40),
            "tokens": pa.array([rng.integers(0, 9, int(k)).tolist() for k in rng.integers(0, 4, n)], pa.list_(pa.int64())),
            "label": pa.array(rng.integers(0, 5, n)),
        }
    )
    ds = ray.data.from_arrow([table.slice(0, 20), table.slice(20)])
    got = list(tf_dataset(ds, feature_columns=["wide", "tokens"], label_columns="label", batch_size=16, drop_last=False))
    assert [int(label.shape[0]) for _, label in got] == [16, 16, 16, 2]
    want = tensors_from_arrow(table)
    np.testing.assert_array_equal(np.concatenate([f["wide"].numpy() for f, _ in got]), want["wide"].numpy())
    assert sum((f["tokens"].to_list() for f, _ in got), []) == want["tokens"].to_list()
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in got]), want["label"].numpy())


def test_a_wide_column_never_shares_a_buffer_with_another_dtype(ray_local):
    """A wide int64 vector as the second component beside a float32 scalar: a packing group keyed by
    the bare component number 1 met tf.float32 (DType 1 == 1) and carried the int64s as float32."""
    rng = np.random.default_rng(5)
    n = 30
    table = pa.table({
        "weight": pa.array(rng.random(n, np.float32)),
        "ids": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(1 << 40, 1 << 50, n * 40)), 40),
        "label": pa.array(rng.integers(0, 5, n)),
    })
    got = list(tf_dataset(ray.data.from_arrow(table), feature_columns=["weight", "ids"], label_columns="label",
                          batch_size=n))
    ((features, _),) = got
    want = tensors_from_arrow(table)
    assert features["ids"].dtype == tf.int64
    np.testing.assert_array_equal(features["ids"].numpy(), want["ids"].numpy())
    np.testing.assert_array_equal(features["weight"].numpy(), want["weight"].numpy())


def test_nulls_inside_fixed_size_rows_are_not_offered_defaults():
    table = pa.table({"v": pa.array([[1.0, None], [2.0, 3.0]], pa.list_(pa.float32(), 2))})
    for defaults in (None, {"v": [0.0, 0.0]}):
        with pytest.raises(SchemaError, match=r"column 'v': 1 values inside the rows of this batch are null.*defaults= fills only whole null rows"):
            tensors_from_arrow(table, defaults=defaults)


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), st.lists(st.integers(0, 255), max_size=6)),
        min_size=1,
        max_size=12,
    ),
    start=st.integers(0, 12),
)
def test_serialized_records_decode_as_the_reader_does(rows, start):
    """Records sliced anywhere (zero-copy or copied path) decode to what codec.decode gives."""
    from ray_tfrecord._src.core import codec
    from ray_tfrecord._src.tf.feed import _Decoding

    schema = pa.schema([("n", pa.int64()), ("px", pa.list_(pa.int64()))])
    table = pa.table([pa.array([n for n, _ in rows], pa.int64()), pa.array([p for _, p in rows])], schema=schema)
    framed = codec.encode(table)
    ends = [*framed.offsets[1:], len(framed.data)]
    payloads = [bytes(framed.data[o + 12 : e - 4]) for o, e in zip(framed.offsets, ends, strict=True)]
    records = pa.array(payloads, pa.binary()).slice(min(start, len(payloads) - 1))
    got = _Decoding(schema)(pa.table({"record": records}))
    assert got.to_pylist() == table.slice(min(start, len(payloads) - 1)).to_pylist()
