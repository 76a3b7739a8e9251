"""Elastic worker groups: ``tensorflow_trainer(num_workers=(min, max))`` passes Ray Train's elastic
scaling through, and a ResumableFeed trains every row of every epoch once while the group shrinks
(a node lost mid-epoch) and grows (a node added)."""

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import ray
import tensorflow as tf

from ray_tfrecord import StallError
from ray_tfrecord._src.data import compat
from ray_tfrecord.tf import ResumableFeed, tensorflow_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _loop(config):
    pass


@pytest.mark.parametrize(("num_workers", "message"), [
    ((3, 2), "tensorflow_trainer: num_workers=(3, 2) is not a range of group sizes; pass (min, max) with "
             "1 <= min <= max, e.g. num_workers=(2, 3)"),
    ((0, 2), "tensorflow_trainer: num_workers=(0, 2) is not a range of group sizes; pass (min, max) with "
             "1 <= min <= max, e.g. num_workers=(1, 2)"),
    ((2, 3.0), "tensorflow_trainer: num_workers=(2, 3.0); pass a number of workers or an elastic range "
               "num_workers=(min, max) of two ints"),
    ([1, 2], "tensorflow_trainer: num_workers=[1, 2]; pass a number of workers or an elastic range "
             "num_workers=(min, max) of two ints"),
    (0, "tensorflow_trainer: num_workers=0; pass at least 1 worker, or a range num_workers=(min, max)"),
])
def test_a_bad_group_size_is_refused_before_anything_starts(monkeypatch, num_workers, message):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for a group size that cannot work")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(ValueError) as raised:
        tensorflow_trainer(_loop, datasets={}, num_workers=num_workers)
    assert str(raised.value) == message


def test_a_range_needs_a_ray_with_elastic_scaling(monkeypatch):
    monkeypatch.setattr(compat, "elastic_training", lambda: False)
    with pytest.raises(RuntimeError) as raised:
        tensorflow_trainer(_loop, datasets={}, num_workers=(1, 4))
    assert str(raised.value) == (
        f"tensorflow_trainer: num_workers=(1, 4) asks for an elastic group, and Ray {ray.__version__}'s Train has "
        "no elastic scaling; upgrade Ray (pip install -U 'ray[train]') or pass a fixed num_workers=4")


needs_elastic = pytest.mark.skipif(not compat.elastic_training(),
                                   reason=f"Ray {ray.__version__}'s Train has no elastic scaling")


@needs_elastic
def test_a_range_reaches_ray_train_and_the_cpu_check_counts_its_smallest_group(ray_local):
    trainer = tensorflow_trainer(_loop, datasets={}, num_workers=(1, 2), cpus_per_worker=0.5)
    assert trainer.scaling_config.num_workers == (1, 2)
    assert trainer.scaling_config.elasticity_enabled
    # Two CPUs: one worker of 1 CPU leaves one for reading, two would not; the check is of the smallest group.
    tensorflow_trainer(_loop, datasets={}, num_workers=(1, 2), cpus_per_worker=1)
    with pytest.raises(StallError, match=r"needs 3 CPUs at once \(training workers 2 x 1 CPU, one task 1 CPU\) and the cluster has 2"):
        tensorflow_trainer(_loop, datasets={}, num_workers=(2, 3), cpus_per_worker=1)


# --- a simulated cluster: the group shrinks, then grows ------------------------------------------------
# Accounting by checkpoint: each rank writes the ids it trained since its last report into the checkpoint
# it reports (Ray Train puts every rank's files in one directory). Rows trained after the last checkpoint
# Ray Train registered are lost with the model and fed again; only the registered checkpoints count.

EPOCHS, BATCH, EVERY = 2, 16, 4
SHRINK_AT, GROW_AT = 6, 6


def _marker(config, name: str) -> str:
    return os.path.join(config["log"], name)


def _choreography(config, rank: int, world: int, epoch: int, step: int) -> None:
    """Rank 1 of the first 2-worker group names its node at step SHRINK_AT of epoch 0 and waits there
    for the node's removal; the 1-worker group after it asks for a node at step GROW_AT and waits
    there for Ray Train to grow the group (which stops this one)."""
    shrink, grow = _marker(config, "shrink"), _marker(config, "grow")
    if world == 2 and rank == 1 and (epoch, step) == (0, SHRINK_AT) and not os.path.exists(shrink):
        with open(shrink, "w") as f:
            f.write(ray.get_runtime_context().get_node_id())
        time.sleep(600)
    if world == 1 and step == GROW_AT and os.path.exists(shrink) and not os.path.exists(grow):
        with open(grow, "w") as f:
            f.write("grow")
        time.sleep(600)


def _linear_training(strategy, feed):
    """A linear model under ``strategy`` and its weighted step, restored from Ray Train's checkpoint (the
    weights, and ``feed``'s position) when there is one: ``(dense, train_step, first epoch)``."""
    import ray.train

    with strategy.scope():
        dense = tf.keras.layers.Dense(1)
        dense.build((None, 2))
        optimizer = tf.keras.optimizers.SGD(0.1)
    start, checkpoint = 0, ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = feed.load(directory)
            dense.set_weights(np.load(os.path.join(directory, "weights.npy"), allow_pickle=True))

    @tf.function
    def train_step(x, y, w):
        def replica(x, y, w):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * (tf.squeeze(dense(x), 1) - y) ** 2) / feed.batch_size
            optimizer.apply_gradients(zip(tape.gradient(loss, dense.trainable_variables), dense.trainable_variables))

        strategy.run(replica, args=(x, y, w))

    return dense, train_step, start


def elastic_loop(config):
    import ray.train

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    feed = ResumableFeed(config["plan"], feature_columns=["id", "x"], label_columns="y", batch_size=BATCH, seed=5)
    dense, train_step, start = _linear_training(strategy, feed)
    if rank == 0:
        with open(_marker(config, "groups.txt"), "a") as f:
            f.write(f"{world}\n")

    trained: list[str] = []

    def report(epoch: int, steps: int | None) -> None:
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, f"ids-{rank}.txt"), "w") as f:
                f.writelines(trained)
            if rank == 0:
                feed.save(directory, steps)
                np.save(os.path.join(directory, "weights.npy"), np.array(dense.get_weights(), dtype=object))
            ray.train.report({"epoch": epoch}, checkpoint=ray.train.Checkpoint.from_directory(directory))
        trained.clear()

    for epoch in range(start, EPOCHS):
        for step, (x, y, w) in enumerate(feed.dataset(), 1):
            _choreography(config, rank, world, epoch, step)
            train_step(x["x"], y, w)
            trained.extend(f"{epoch} {i}\n" for i in x["id"].numpy()[w.numpy() > 0].tolist())
            if step % EVERY == 0:
                report(epoch, step)
        report(epoch, None)


_CLUSTER = """
import json, os, sys, threading, time
os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "20"  # a group placed on a node just lost: retry soon
import ray
from ray.cluster_utils import Cluster

from ray_tfrecord.tf import plan_splits, tensorflow_trainer
from tests.test_elastic import elastic_loop
from tests.test_resume import SCHEMA

tmp = sys.argv[1]
log = os.path.join(tmp, "log")
# One training worker per node ("slot"); the head keeps its CPUs for the feed's read tasks.
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
nodes = [cluster.add_node(num_cpus=1, resources={"slot": 1}) for _ in range(2)]
ray.init(address=cluster.address, log_to_driver=False)
plan = plan_splits(os.path.join(tmp, "tf"), schema=SCHEMA, split_bytes=2048)
trainer = tensorflow_trainer(elastic_loop, datasets={}, num_workers=(1, 2), cpus_per_worker=0.5,
                             train_loop_config={"plan": plan, "log": log}, storage_path=os.path.join(tmp, "runs"),
                             name="elastic", max_failures=6, checkpoints_to_keep=None)
# What tensorflow_trainer does not expose: a worker per node, and a resize looked at every 2 s, not 60.
# No CPU in the workers' bundle: Ray Train counts the room for a worker by what Ray's autoscaling
# coordinator reserves for it, and the feed's read executions reserve the nodes' CPUs there too.
trainer.scaling_config.resources_per_worker = {"slot": 1}
trainer.scaling_config.elastic_resize_monitor_interval_s = 2


# The node changes in this (the main) thread: Ray starts a node's processes with signal handlers,
# which only the main thread may set; fit() waits in another.
outcome = []
fit = threading.Thread(target=lambda: outcome.append(trainer.fit()), daemon=True)
fit.start()
shrink, grow = os.path.join(log, "shrink"), os.path.join(log, "grow")
while not os.path.exists(shrink) or not open(shrink).read():
    time.sleep(0.2)
time.sleep(3)
cluster.remove_node(next(n for n in nodes if n.node_id == open(shrink).read()), allow_graceful=False)
while not os.path.exists(grow):
    time.sleep(0.2)
cluster.add_node(num_cpus=1, resources={"slot": 1})
fit.join()
(result,) = outcome
counts = {}
for checkpoint, _ in result.best_checkpoints:
    with checkpoint.as_directory() as directory:
        for name in os.listdir(directory):
            if name.startswith("ids-"):
                for line in open(os.path.join(directory, name)):
                    counts[line.strip()] = counts.get(line.strip(), 0) + 1
json.dump(counts, open(os.path.join(tmp, "counts.json"), "w"))
ray.shutdown()
cluster.shutdown()
"""


@needs_elastic
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_group_that_shrinks_and_grows_trains_every_row_once(tmp_path):
    """A simulated cluster with two one-worker nodes: rank 1's node is removed mid-epoch (the group
    goes on with one worker), then a node is added mid-epoch (two again). Its own Ray cluster, so in
    a process of its own."""
    from tests.test_resume import ROWS, _write_tf

    _write_tf(tmp_path / "tf")
    (tmp_path / "log").mkdir()
    (tmp_path / "cluster.py").write_text(_CLUSTER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), "RAY_ADDRESS": ""}
    run = subprocess.run([sys.executable, str(tmp_path / "cluster.py"), str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=850)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    groups = [int(n) for n in (tmp_path / "log" / "groups.txt").read_text().split()]
    assert groups[0] == 2 and 1 in groups and 2 in groups[groups.index(1):], groups
    counts = json.loads((tmp_path / "counts.json").read_text())
    per_epoch = collections.defaultdict(collections.Counter)
    for key, n in counts.items():
        epoch, i = map(int, key.split())
        per_epoch[epoch][i] += n
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, rows in per_epoch.items():
        assert rows == collections.Counter(range(ROWS)), (epoch, {i: n for i, n in rows.items() if n != 1})
