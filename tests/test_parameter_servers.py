"""ps_trainer: a parameter-server cluster of Ray actors on a local 2-CPU Ray, fed by tfrecord_dataset.

Tiny on purpose (a cluster start is four TensorFlow processes on 2 cores): a linearly separable
2-class dataset, a one-layer model, a few epochs. The failure test's cluster has one worker: its
function fails before any step."""

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import ray

import ray_tfrecord
from ray_tfrecord import StallError
from ray_tfrecord.tf import ClusterFailedError, plan_splits, ps_trainer

pytestmark = pytest.mark.timeout(600)

ROWS = 1024
FEATURES = 8
BATCH = 32
SMALL = {"num_workers": 2, "num_ps": 1, "cpus_per_worker": 0.25, "cpus_per_ps": 0.25}


@pytest.fixture(scope="module")
def data(ray_local, tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), FEATURES),
                      "y": pa.array((x[:, 0] + x[:, 1] > 0).astype(np.int64))})
    root = str(tmp_path_factory.mktemp("ps_data"))
    # Several files, so that the workers' shards are runs of different files.
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table).repartition(4), root, mode="overwrite")
    return plan_splits(root)


def _model(tf):
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def _accuracy(tf, model, plan):
    """The PS model's accuracy on every row, scored on the chief by a copy of its weights."""
    from ray_tfrecord.tf import tfrecord_dataset

    local = tf.keras.models.clone_model(model)
    local.set_weights(model.get_weights())
    local.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rows = tfrecord_dataset(plan, feature_columns="x", label_columns="y", batch_size=256, drop_last=False)
    return float(local.evaluate(rows, verbose=0)[1])


def _strategy(tf):
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.experimental.ParameterServerStrategy(cluster), cluster.cluster_spec().num_tasks("worker")


def _dataset_fn(tf, plan, workers):
    from ray_tfrecord.tf import tfrecord_dataset

    def dataset_fn(input_context):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return tfrecord_dataset(plan, feature_columns="x", label_columns="y", batch_size=BATCH,
                                shard=(worker, workers), local_shuffle_buffer_size=256, local_shuffle_seed=0).repeat()

    return dataset_fn


def fit_loop(config):
    """tf-keras fit, checkpointed every epoch; returns the accuracy and the epochs this run trained."""
    import tensorflow as tf

    from ray_tfrecord.tf import ps_checkpoint_dir

    strategy, workers = _strategy(tf)
    with strategy.scope():
        model = _model(tf)
    epochs = []
    seen = tf.keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs.append(epoch))
    model.fit(tf.keras.utils.experimental.DatasetCreator(_dataset_fn(tf, config["plan"], workers)),
              epochs=config["epochs"], steps_per_epoch=ROWS // BATCH,
              callbacks=[tf.keras.callbacks.BackupAndRestore(ps_checkpoint_dir()), seen], verbose=0)
    return {"accuracy": _accuracy(tf, model, config["plan"]), "epochs": epochs}


def custom_loop(config):
    """ClusterCoordinator.schedule over create_per_worker_dataset; returns the accuracy and the steps done."""
    import tensorflow as tf

    strategy, workers = _strategy(tf)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = _model(tf)
        optimizer = tf.keras.optimizers.Adam(0.05)
        steps = tf.Variable(0, dtype=tf.int64)
    dataset_fn = _dataset_fn(tf, config["plan"], workers)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            steps.assign_add(1)
            return loss

        return strategy.run(replica_fn, args=next(iterator))

    for _ in range(config["epochs"]):
        for _ in range(ROWS // BATCH):
            coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        open(config["marker"], "a").close()  # an epoch done: the test may kill a worker now
    return {"accuracy": _accuracy(tf, model, config["plan"]), "steps": int(steps.numpy())}


def _kill_when(path: str, actor: str, killed: list) -> None:
    while not os.path.exists(path):
        time.sleep(0.2)
    ray.kill(ray.get_actor(actor))
    killed.append(actor)


@pytest.mark.slow
def test_custom_coordinator_loop_converges_past_a_killed_worker(data, tmp_path):
    """Worker 0 is killed after the first epoch: TensorFlow's coordinator runs its steps on worker 1,
    ps_trainer starts worker 0 again at its address, and no scheduled step is lost (a step the worker
    was running may have run before it was lost: at least once)."""
    killed: list = []
    marker = str(tmp_path / "epoch_done")
    killer = threading.Thread(target=_kill_when, args=(marker, "custom:0:worker:0", killed), daemon=True)
    killer.start()
    result = ps_trainer(custom_loop, **SMALL, train_loop_config={"plan": data, "epochs": 3, "marker": marker},
                        storage_path=str(tmp_path), name="custom").fit()
    assert killed == ["custom:0:worker:0"]
    assert result.failures == 0
    assert 3 * (ROWS // BATCH) <= result.metrics["steps"] <= 3 * (ROWS // BATCH) + 2
    assert result.metrics["accuracy"] >= 0.9, result.metrics


def _kill_after_first_checkpoint(checkpoints: str, actor: str, killed: list) -> None:
    """Kill ``actor`` once BackupAndRestore has written its first epoch's checkpoint."""
    # The index file CheckpointManager writes after a save (the directory exists from the start of fit).
    while not os.path.exists(os.path.join(checkpoints, "chief", "checkpoint")):
        time.sleep(0.2)
    ray.kill(ray.get_actor(actor))
    killed.append(actor)


@pytest.mark.slow
def test_a_killed_parameter_server_restarts_the_cluster_from_its_checkpoint(data, tmp_path):
    killed: list = []
    killer = threading.Thread(target=_kill_after_first_checkpoint,
                              args=(f"{tmp_path}/kill/checkpoints", "kill:0:ps:0", killed), daemon=True)
    killer.start()
    result = ps_trainer(fit_loop, **SMALL, train_loop_config={"plan": data, "epochs": 6},
                        storage_path=str(tmp_path), name="kill", max_failures=1).fit()
    assert killed == ["kill:0:ps:0"]
    assert result.failures == 1
    # The second cluster's fit started after the checkpointed epoch, not at 0, and ran to the end.
    epochs = result.metrics["epochs"]
    assert epochs[0] >= 1 and epochs[-1] == 5, epochs
    assert result.metrics["accuracy"] >= 0.9, result.metrics
    assert result.checkpoint_dir == f"{tmp_path}/kill/checkpoints"


@pytest.mark.slow
def test_failures_beyond_max_failures_raise_naming_the_keyword(data, tmp_path):
    def broken(config):
        raise KeyError("no_such_column")

    with pytest.raises(ClusterFailedError, match=r"^ps_trainer: the training function raised KeyError: "
                                                 r"'no_such_column', and max_failures=0 allows no more restarts; "
                                                 r"pass a larger max_failures=") as e:
        ps_trainer(broken, **{**SMALL, "num_workers": 1}, storage_path=str(tmp_path), name="broken").fit()
    assert isinstance(e.value.__cause__, KeyError)


def test_a_cluster_too_big_for_the_cpus_is_refused_at_once(ray_local):
    with pytest.raises(StallError) as e:
        ps_trainer(fit_loop, num_workers=2, num_ps=1, cpus_per_ps=0.25)
    assert str(e.value) == (
        "ps_trainer would wait forever: it needs 4.25 CPUs at once (workers and the chief 3 x 1 CPU, parameter "
        "servers 1 x 0.25 CPU, one task 1 CPU) and the cluster has 2; pass ps_trainer(cpus_per_worker=0.25) or "
        "ray.init(num_cpus=5) (or a cluster with that many CPUs)")
    with pytest.raises(ValueError, match=r"ps_trainer: num_ps=0; pass a whole number of at least 1"):
        ps_trainer(fit_loop, num_workers=2, num_ps=0)
