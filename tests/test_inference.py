"""Batch inference: saved models over Ray datasets, one keyed output row per input row."""

import logging
import warnings
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import tensorflow as tf
import tf_keras

import ray_tfrecord
from ray_tfrecord._src.tf.inference import inference, predict

pytestmark = pytest.mark.timeout(300)

ROWS = 103  # not a multiple of the batch size: the last batch is partial


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, 5)).astype(np.float32)
    return pa.table(
        {
            "id": pa.array(np.arange(ROWS) * 10),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 5),
            "tokens": pa.array([list(range(i % 4)) for i in range(ROWS)], pa.list_(pa.int64())),
        }
    )


def _dense_model() -> tf_keras.Model:
    tf_keras.utils.set_random_seed(0)
    inputs = tf_keras.Input((5,), name="x")
    return tf_keras.Model(inputs, tf_keras.layers.Dense(3)(inputs))


def _keras3_dense_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,), name="x")
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


def _expected(model, table: pa.Table) -> np.ndarray:
    x = np.asarray(table.column("x").combine_chunks().flatten()).reshape(-1, 5)
    return model.predict(x, verbose=0)


@pytest.mark.parametrize("kind", ["keras", "keras3", "savedmodel"])
def test_predictions_match_the_model_row_for_row(ray_local, tmp_path, kind):
    model, table = (_keras3_dense_model() if kind == "keras3" else _dense_model()), _table()
    if kind == "keras":
        path = str(tmp_path / "model.keras")
        model.save(path)
    elif kind == "keras3":
        # tf-keras cannot load a Keras 3 file: this passes only if predict picks Keras 3. A path-like path.
        path = tmp_path / "model.keras"
        model.save(path)
        with pytest.raises(TypeError):
            tf_keras.models.load_model(path, compile=False)
    else:
        path = str(tmp_path / "saved")
        tf.saved_model.save(model, path)
    ds = ray.data.from_arrow([table.slice(0, 50), table.slice(50)])
    out = predict(ds, path, feature_columns="x", key_columns=["id"], batch_size=16, concurrency=2, num_cpus=0.5)
    got = out.to_arrow_refs()
    got = pa.concat_tables(ray.get(got)).sort_by("id")
    assert got.column_names == ["id", "prediction"]
    assert got.column("id").to_pylist() == table.column("id").to_pylist()
    assert got.schema.field("prediction").type == pa.list_(pa.float32(), 3)
    preds = np.asarray(got.column("prediction").combine_chunks().flatten()).reshape(-1, 3)
    np.testing.assert_allclose(preds, _expected(model, table), rtol=1e-5, atol=1e-6)


def test_ragged_inputs_and_scalar_outputs(ray_local, tmp_path):
    tokens = tf_keras.Input((None,), dtype=tf.int64, ragged=True, name="tokens")
    x = tf_keras.Input((5,), name="x")
    summed = tf_keras.layers.Lambda(lambda t: tf.cast(tf.reduce_sum(t, axis=1, keepdims=True), tf.float32))(tokens)
    model = tf_keras.Model(
        {"tokens": tokens, "x": x}, tf_keras.layers.Flatten()(summed + tf.reduce_sum(x, axis=1, keepdims=True))
    )
    # A Keras SavedModel directory: the third format predict() loads.
    model.save(str(tmp_path / "ragged_tf"), save_format="tf")
    table = _table()
    out = predict(
        ray.data.from_arrow(table),
        str(tmp_path / "ragged_tf"),
        feature_columns=["tokens", "x"],
        key_columns=["id", "tokens"],
        batch_size=32,
        num_cpus=0.5,
    ).to_arrow_refs()
    got = pa.concat_tables(ray.get(out)).sort_by("id")
    x = np.asarray(table.column("x").combine_chunks().flatten()).reshape(-1, 5)
    want = np.array([sum(t) for t in table.column("tokens").to_pylist()]) + x.sum(axis=1)
    assert got.schema.field("prediction").type == pa.float32()
    np.testing.assert_allclose(got.column("prediction").to_numpy(), want, rtol=1e-5)
    assert got.column("tokens").to_pylist() == table.column("tokens").to_pylist()


@pytest.mark.parametrize("output_format", ["tfrecord", "parquet"])
def test_inference_writes_one_row_per_input(ray_local, tmp_path, output_format):
    model, table = _dense_model(), _table()
    path = str(tmp_path / "model.keras")
    model.save(path)
    src = tmp_path / "input"
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), str(src))
    schema = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32(), 5)), ("tokens", pa.list_(pa.int64()))])
    ds = ray_tfrecord.read_tfrecords(str(src), schema=schema)
    out = tmp_path / "out"
    inference(  # path-like paths
        ds, Path(path), out, feature_columns="x", key_columns=["id"], output_format=output_format, batch_size=20, num_cpus=0.5
    )
    if output_format == "tfrecord":
        # Cross-check with TensorFlow's own reader, not ours.
        files = sorted(str(p) for p in out.rglob("*.tfrecord"))
        spec = {"id": tf.io.FixedLenFeature([], tf.int64), "prediction": tf.io.FixedLenFeature([3], tf.float32)}
        parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]
        ids = np.array([int(p["id"]) for p in parsed])
        preds = np.stack([p["prediction"].numpy() for p in parsed])
    else:
        got = pq.read_table(str(out))
        ids = got.column("id").to_numpy()
        preds = np.asarray(got.column("prediction").combine_chunks().flatten()).reshape(-1, 3)
    order = np.argsort(ids)
    assert ids[order].tolist() == table.column("id").to_pylist()
    np.testing.assert_allclose(preds[order], _expected(model, table), rtol=1e-5, atol=1e-6)


def test_key_columns_are_required(ray_local):
    with pytest.raises(ValueError, match="key_columns"):
        predict(ray.data.range(3), "unused.keras", feature_columns="id", key_columns=[])


def test_no_deprecation_warnings_from_the_package_under_ray(ray_local, tmp_path):
    """The user's call, with its actor count, triggers none of Ray's deprecation notices."""
    model, table = _dense_model(), _table()
    model.save(tmp_path / "model.keras")
    notices: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if "deprecated" in record.getMessage():
                notices.append(record.getMessage())

    handler = Collect()
    ray_data_logger = logging.getLogger("ray.data")
    ray_data_logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            inference(ray.data.from_arrow(table), str(tmp_path / "model.keras"), str(tmp_path / "out"),
                      feature_columns="x", key_columns=["id"], output_format="parquet", concurrency=2, num_cpus=0.5)
    finally:
        ray_data_logger.removeHandler(handler)
    assert pq.read_table(tmp_path / "out").num_rows == ROWS
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, DeprecationWarning) and "ray_tfrecord" in w.filename]
    assert ours == [] and notices == []


def test_defaults_fill_absent_features_as_tensorflow_parses_them(ray_local, tmp_path):
    """TF-written records missing the model's input in some rows: predictions as on FixedLenFeature's default."""
    model = _dense_model()
    path = str(tmp_path / "model.keras")
    model.save(path)
    rng = np.random.default_rng(5)
    records = str(tmp_path / "sparse.tfrecord")
    with tf.io.TFRecordWriter(records) as w:
        for k in range(40):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[k]))}
            if k % 3:
                feature["x"] = tf.train.Feature(float_list=tf.train.FloatList(value=rng.standard_normal(5)))
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    default = [0.5, -1.0, 2.0, 0.0, 1.0]
    schema = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32(), 5))])
    ds = ray_tfrecord.read_tfrecords(records, schema=schema)
    out = predict(ds, path, feature_columns="x", key_columns=["id"], defaults={"x": default}, batch_size=16, num_cpus=0.5)
    got = pa.concat_tables(ray.get(out.to_arrow_refs())).sort_by("id")
    spec = {"id": tf.io.FixedLenFeature([], tf.int64),
            "x": tf.io.FixedLenFeature([5], tf.float32, default_value=default)}
    parsed = tf.io.parse_example(next(iter(tf.data.TFRecordDataset(records).batch(40))), spec)
    assert got.column("id").to_pylist() == parsed["id"].numpy().tolist()
    preds = np.asarray(got.column("prediction").combine_chunks().flatten()).reshape(-1, 3)
    np.testing.assert_allclose(preds, model.predict(parsed["x"].numpy(), verbose=0), rtol=1e-5, atol=1e-6)
    # A default of the wrong shape is refused on the driver, before any actor loads the model.
    with pytest.raises(ray_tfrecord.SchemaError, match=r"column 'x': defaults=\{'x': \[0.0\]\}: it has shape \(1,\)"):
        predict(ds, path, feature_columns="x", key_columns=["id"], defaults={"x": [0.0]})


def test_each_keras_file_names_the_keras_that_wrote_it(tmp_path):
    from ray_tfrecord._src.tf.inference import _keras_generation

    _dense_model().save(tmp_path / "tf_keras.keras")
    _keras3_dense_model().save(tmp_path / "keras3.keras")
    # tf-keras saves model.keras as HDF5 under MultiWorkerMirroredStrategy (ReportCheckpoint's file).
    _dense_model().save(tmp_path / "h5.h5")
    (tmp_path / "h5.h5").rename(tmp_path / "h5.keras")
    (tmp_path / "text.keras").write_text("not a zip")
    tf.saved_model.save(_dense_model(), str(tmp_path / "saved"))
    names = ("tf_keras.keras", "keras3.keras", "h5.keras", "saved")
    assert [_keras_generation(str(tmp_path / name)) for name in names] == [2, 3, 2, None]
    with pytest.raises(ValueError, match=r"text.keras: not a Keras .keras file \(File is not a zip file\)"):
        _keras_generation(str(tmp_path / "text.keras"))


# -- resumable inference (Ray 2.60's job checkpointing) ---------------------------------------------


def test_a_checkpointed_inference_needs_one_key_column(ray_local):
    with pytest.raises(ValueError, match="exactly one key column"):
        inference(ray.data.range(3), "unused.keras", "/nonexistent", feature_columns="id", key_columns=["id", "id2"],
                  checkpoint_path="/nonexistent-checkpoint")


@pytest.mark.skipif(not ray_tfrecord._src.data.compat.CHECKPOINTS, reason="Ray without job checkpointing")
def test_a_checkpointed_rerun_works_out_its_facts_once(ray_local, tmp_path, monkeypatch):
    """A rerun of a checkpointed inference asks whether the checkpoint holds records once (a listing of
    its directory, a round trip on S3), checks the cluster once and runs one watchdog, however many
    layers (predict, the sink, the commit) need the answer. The rerun is told so by the one listing: the
    answer is True here, as a killed run would leave it, and the job still writes every key."""
    from ray_tfrecord._src.data import compat, progress

    model, table = _dense_model(), _table()
    path = str(tmp_path / "model.keras")
    model.save(path)
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), str(tmp_path / "input"))
    ds = ray_tfrecord.read_tfrecords(str(tmp_path / "input"))  # its own check of the cluster, before counting
    calls = {"listings": 0, "preflights": 0, "watchdogs": 0}

    def rerun(config):
        calls["listings"] += 1
        compat_listing(config)
        return True

    compat_listing = compat.checkpoint_started
    monkeypatch.setattr(compat, "checkpoint_started", rerun)
    for name, real in (("preflights", progress.preflight), ("watchdogs", progress.Watchdog)):
        def counted(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(progress, "preflight" if name == "preflights" else "Watchdog", counted)
    inference(ds, path, tmp_path / "out", feature_columns="x", key_columns=["id"], output_format="parquet",
              checkpoint_path=str(tmp_path / "checkpoint"))  # num_cpus: what fits beside the filter
    assert calls == {"listings": 1, "preflights": 1, "watchdogs": 1}
    assert sorted(pq.read_table(str(tmp_path / "out")).column("id").to_pylist()) == table.column("id").to_pylist()
