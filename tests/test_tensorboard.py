"""TensorBoard: tensorflow_trainer(tensorboard=True) keeps the chief's Keras logs under the run's storage path
and says how to open them; the CLI starts TensorBoard there."""

import glob
import os
import re

import numpy as np
import pyarrow as pa
import pytest
import ray

from ray_tfrecord._src import cli
from ray_tfrecord._src.tf.tensorboard_logs import TENSORBOARD_DIR_ENV
from ray_tfrecord.tf import TensorBoard, tensorflow_trainer, tf_dataset


def _loop(config):
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    feed = tf_dataset(ray.train.get_dataset_shard("train"), feature_columns="x", label_columns="y", batch_size=16)
    model.fit(feed, epochs=2, callbacks=[TensorBoard()], verbose=0)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_keeps_the_chiefs_logs_under_its_storage_path_and_says_how_to_open_them(ray_local, tmp_path, capsys):
    x = np.random.default_rng(0).random((128, 2), dtype=np.float32)
    ds = ray.data.from_arrow(pa.table({"x": pa.FixedSizeListArray.from_arrays(x.ravel(), 2), "y": x[:, 0]}))
    trainer = tensorflow_trainer(_loop, datasets={"train": ds}, num_workers=2, cpus_per_worker=0.5,
                                 storage_path=str(tmp_path), name="run", tensorboard=True)
    log_dir = f"{tmp_path}/run/tensorboard"
    assert re.findall(r"TensorBoard logs: .*", capsys.readouterr().out) == [
        f"TensorBoard logs: {log_dir}; open them with: tensorboard --logdir {log_dir}"]
    trainer.fit()
    # Keras's layout: train/ and its events; the second worker's went to a temporary directory, now gone.
    assert glob.glob(f"{log_dir}/train/events.out.tfevents.*")
    assert sorted(os.listdir(log_dir)) == ["train"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(f"{log_dir}/train")
    events.Reload()
    assert [e.step for e in events.Tensors("epoch_loss")] == [0, 1]


def test_outside_a_run_the_callback_needs_a_log_dir(monkeypatch, tmp_path):
    monkeypatch.delenv(TENSORBOARD_DIR_ENV, raising=False)
    with pytest.raises(ValueError, match=r"TensorBoard\(\): no log_dir=, and this is not a worker of "
                                         r"tensorflow_trainer\(\.\.\., tensorboard=True\); pass one of them"):
        TensorBoard()
    assert TensorBoard(str(tmp_path)).log_dir == str(tmp_path)
    monkeypatch.setenv(TENSORBOARD_DIR_ENV, "/runs/r/tensorboard")
    assert TensorBoard().log_dir == "/runs/r/tensorboard"


def test_the_cli_starts_tensorboard_on_the_log_dir_or_says_how_to_get_it(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(cli.subprocess, "call", lambda command: started.append(command) or 0)
    assert cli.main(["tensorboard", "/runs/r/tensorboard", "--port", "7007"]) == 0
    assert started == [[cli.sys.executable, "-m", "tensorboard.main", "--logdir", "/runs/r/tensorboard",
                        "--port", "7007"]]
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["tensorboard", "/runs/r/tensorboard"]) == 2
    assert capsys.readouterr().err == (
        "ray-tfrecord tensorboard: TensorBoard is not installed here; pip install tensorboard, or open the logs "
        "where it is: tensorboard --logdir /runs/r/tensorboard\n")
