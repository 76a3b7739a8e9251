"""Keras 3 (TensorFlow backend) with the feed and the trainer, and the check that keeps each worker's
``tf.keras`` the Keras ``tensorflow_trainer(keras=)`` asked for."""

import json
import os
import subprocess
import sys
import tempfile
import warnings

import keras
import numpy as np
import pyarrow as pa
import pytest
import ray
import tensorflow as tf

from ray_tfrecord._src.data import compat
from ray_tfrecord._src.tf.feed import tf_dataset
from ray_tfrecord._src.tf.inference import predict
from ray_tfrecord._src.tf.train import KerasVersionError, _check_worker_keras, tensorflow_trainer

pytestmark = pytest.mark.timeout(400)

ROWS, BATCH = 1000, 100


def _table() -> pa.Table:
    pixels = np.random.default_rng(0).random((ROWS, 16), dtype=np.float32)
    return pa.table({"id": np.arange(ROWS), "pixels": pa.FixedSizeListArray.from_arrays(pixels.ravel(), 16),
                     "label": (pixels[:, 0] > 0.5).astype(np.int64)})


def _model():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_this_process_runs_keras_3():
    # The tests below would prove nothing about Keras 3 under tf-keras.
    assert keras.__version__.startswith("3.") and tf.keras.__name__.startswith("keras.")


def test_fit_on_the_driver_learns_without_warnings(ray_local):
    keras.utils.set_random_seed(0)
    model = _model()
    feed = tf_dataset(ray.data.from_arrow(_table()), feature_columns="pixels", label_columns="label", batch_size=BATCH,
                      steps_per_epoch=ROWS // BATCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(feed, epochs=5, shuffle=False, verbose=0)
    assert len(history.history["accuracy"]) == 5 and history.history["accuracy"][-1] > 0.8
    # Without steps_per_epoch Keras 3 warns "Your input ran out of data" at every epoch's end.
    assert [str(w.message) for w in caught if "keras" in w.filename] == []


_MIRRORED = """
import numpy as np, pyarrow as pa, ray, tensorflow as tf, keras
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from ray_tfrecord._src.tf.feed import tf_dataset
from tests.test_keras3 import _model, _table, ROWS, BATCH
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
keras.utils.set_random_seed(0)
with strategy.scope():
    model = _model()
steps = ROWS // BATCH
feed = tf_dataset(ray.data.from_arrow(_table()), feature_columns="pixels", label_columns="label", batch_size=BATCH,
                  steps_per_epoch=steps, strategy=strategy)
x, y = next(iter(feed))
sizes = [int(t.shape[0]) for t in strategy.experimental_local_results(y)]
history = model.fit(feed, epochs=5, steps_per_epoch=steps, shuffle=False, verbose=0)
print("RESULT", {"replicas": strategy.num_replicas_in_sync, "sizes": sizes, "accuracy": history.history["accuracy"]})
"""


@pytest.mark.slow
def test_fit_under_mirrored_strategy_on_one_host():
    # Two logical CPUs make two replicas; they must be set before TensorFlow starts, so in a fresh process.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "RAY_ADDRESS": "local"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    run = subprocess.run([sys.executable, "-c", _MIRRORED], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    result = eval(run.stdout.split("RESULT", 1)[1])
    assert result["replicas"] == 2 and result["sizes"] == [BATCH // 2] * 2
    assert len(result["accuracy"]) == 5 and result["accuracy"][-1] > 0.8


def _custom_loop(config):
    import keras
    import tensorflow as tf

    from ray_tfrecord._src.tf.feed import tf_dataset

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = _model()
        accuracy = keras.metrics.SparseCategoricalAccuracy()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="sum")
    world = ray.train.get_context().get_world_size()
    steps = (ROWS // world) // (BATCH // world)
    feed = iter(tf_dataset(ray.train.get_dataset_shard("train"), feature_columns="pixels", label_columns="label",
                           batch_size=BATCH, steps_per_epoch=steps, strategy=strategy))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            loss = loss_fn(y, probs) / BATCH
        model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        accuracy.update_state(y, probs)
        return loss

    for epoch in range(config["epochs"]):
        accuracy.reset_state()
        loss = sum(float(strategy.reduce("SUM", strategy.run(step, args=next(feed)), axis=None))
                   for _ in range(steps)) / steps
        metrics = {"epoch": epoch, "loss": loss, "accuracy": float(accuracy.result()), "tf_keras": tf.keras.__name__,
                   "weights": float(sum(np.sum(w) for w in model.get_weights()))}
        rank = ray.train.get_context().get_world_rank()
        with open(os.path.join(config["log_dir"], f"rank{rank}.json"), "w") as f:
            json.dump(metrics, f)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                model.save(os.path.join(tmp, "model.keras"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)


@pytest.mark.slow
def test_custom_loop_across_workers_and_its_keras_file_serves_inference(ray_local, tmp_path):
    table = _table()
    result = tensorflow_trainer(
        _custom_loop, datasets={"train": ray.data.from_arrow(table)}, num_workers=2, cpus_per_worker=0.5,
        train_loop_config={"epochs": 5, "log_dir": str(tmp_path)}, storage_path=str(tmp_path / "runs"), keras=3,
    ).fit()
    assert result.error is None
    assert result.metrics["epoch"] == 4 and result.metrics["accuracy"] > 0.8
    assert result.metrics["tf_keras"].startswith("keras.")  # Keras 3 on the worker, not tf_keras
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"])  # gradients were all-reduced
    # The Keras 3 file the loop saved serves batch inference, loaded by Keras 3.
    path = tmp_path / "model.keras"
    with result.checkpoint.as_directory() as checkpoint:
        path.write_bytes(open(os.path.join(checkpoint, "model.keras"), "rb").read())
    got = predict(ray.data.from_arrow(table), path, feature_columns="pixels", key_columns=["id"], num_cpus=0.5).take_all()
    want = keras.saving.load_model(path).predict(np.stack(table.column("pixels").to_numpy(zero_copy_only=False)),
                                                 verbose=0)
    got = sorted(got, key=lambda row: row["id"])
    np.testing.assert_allclose(np.stack([row["prediction"] for row in got]), want, rtol=1e-5, atol=1e-6)


def _marks_its_start(config):
    open(config["marker"], "w").close()


@pytest.mark.slow
def test_keras2_worker_with_keras3_fails_fast_naming_the_fix(ray_local, tmp_path):
    marker = tmp_path / "loop_ran"
    with pytest.raises(Exception) as failed:
        tensorflow_trainer(
            _marks_its_start, datasets={"train": ray.data.range(8)}, num_workers=2, cpus_per_worker=0.5,
            train_loop_config={"marker": str(marker)}, storage_path=str(tmp_path / "runs"),
            env_vars={"TF_USE_LEGACY_KERAS": "0"},
        ).fit()
    assert (
        f"KerasVersionError: tensorflow_trainer(keras=2): tf.keras on this worker is Keras {keras.__version__}, "
        "not tf-keras (TF_USE_LEGACY_KERAS was not 1 when TensorFlow was imported), and Keras 3 model.fit fails "
        "under MultiWorkerMirroredStrategy (keras-team/keras#20585); drop TF_USE_LEGACY_KERAS from env_vars=, or "
        "pass keras=3 and train with a custom loop"
    ) in str(failed.value)
    assert not marker.exists(), "the training function must not start"


def test_check_names_the_fix_for_each_mismatch(monkeypatch):
    _check_worker_keras(3)
    with pytest.raises(KerasVersionError, match=r"tf.keras on this worker is Keras 3\.\d+\.\d+, not tf-keras"):
        _check_worker_keras(2)
    monkeypatch.setitem(sys.modules, "tf_keras", None)  # what `import tf_keras` does without the package
    with pytest.raises(KerasVersionError) as missing:
        _check_worker_keras(2)
    assert str(missing.value) == (
        "tensorflow_trainer(keras=2): tf_keras is not installed on this worker, so tf.keras would be Keras 3, and "
        "Keras 3 model.fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585); pip install tf-keras "
        "on every node, or pass keras=3 and train with a custom loop"
    )


def test_the_trainer_imports_without_tf_keras():
    # A worker without tf_keras unpickles the checked training function, so it can raise KerasVersionError.
    code = "import sys; sys.modules['tf_keras'] = None; import ray_tfrecord._src.tf.train"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": root},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_keras_keyword_sets_the_worker_switch_and_is_checked(ray_local, monkeypatch):
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    ds = {"train": ray.data.range(4)}
    envs = [tensorflow_trainer(_marks_its_start, datasets=ds, num_workers=2, keras=k).run_config.worker_runtime_env
            for k in (2, 3)]
    assert [env["env_vars"]["TF_USE_LEGACY_KERAS"] for env in envs] == ["1", "0"]
    with pytest.raises(ValueError, match=r"keras=1; pass keras=2 \(tf-keras\) or keras=3 \(Keras 3\)"):
        tensorflow_trainer(_marks_its_start, datasets=ds, num_workers=2, keras=1)


def test_training_datasets_get_ray_trains_default_options_without_its_deprecation_warning(ray_local):
    trainer = tensorflow_trainer(_marks_its_start, datasets={"train": ray.data.range(4)}, num_workers=1,
                                 cpus_per_worker=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Ray Train resolves a dataset's options with this method from 2.51; 2.50 keeps one set for all.
        resolve = getattr(trainer.data_config, "_resolve_execution_options", None)
        ours = resolve("train") if resolve else trainer.data_config._execution_options
        assert [str(w.message) for w in caught] == []
        # What Ray Train would have used: equal, but built through the deprecated property.
        rays = type(trainer.data_config).default_ingest_options()
    assert repr(ours) == repr(rays)  # Ray 2.50's ExecutionOptions has no __eq__
    if compat.RAY_VERSION >= (2, 60):  # the release that deprecates it
        assert any("exclude_resources" in str(w.message) for w in caught), "Ray no longer warns: drop _ingest_options"
