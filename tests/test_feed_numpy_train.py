"""The framework-free feed under Ray Train's framework-free ``DataParallelTrainer`` (``TorchTrainer``'s
base): a worker lost mid-epoch, the run relaunched on the one worker left, every row of every epoch
trained exactly once, and no TensorFlow imported in the workers or on the driver.

The run is a driver of its own (a fresh process: this test session imports TensorFlow elsewhere).
Rank 1 of the first, 2-worker group SIGKILLs its own process at a step of epoch 0 that no checkpoint
ends, as a node's loss kills its processes; with ``max_failures=0`` the run fails, and the same
run (name and storage) is started again with 1 worker: Ray Train hands it the last checkpoint it
registered. Accounting by checkpoint, as tests/test_elastic.py does: each rank writes the ids it
trained since its last report into the checkpoint it reports, so rows trained after the last
registered checkpoint (lost with the weights) count only when trained again.
"""

import collections
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, EPOCHS = 300, 2

_DRIVER = """
import json, os, signal, sys, tempfile, time
import numpy as np, pyarrow as pa, ray, ray.train
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
# Ray Train v2's trainer (ray.train.data_parallel_trainer holds v1's): the base of its TorchTrainer.
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.train.v2.api.exceptions import WorkerGroupError  # ray.train.TrainingFailedError: a Union in 2.50
import ray_tfrecord

tmp, ROWS, EPOCHS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BATCH, EVERY, DIE_AT = 32, 3, 4  # 2 ranks: 5 steps an epoch, 1 rank: 10


def loop(config):
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    feed = ray_tfrecord.ResumableFeed(config["plan"], batch_size=BATCH, columns=["id", "x", "y"], seed=5)
    weights, start, checkpoint = np.zeros(2, np.float32), 0, ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = feed.load(directory)
            weights = np.load(os.path.join(directory, "weights.npy"))
    trained = []

    def report(epoch):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, f"ids-{rank}.txt"), "w") as f:
                f.writelines(trained)
            if rank == 0:
                feed.save(directory)  # the batches handed out: all trained by now
                np.save(os.path.join(directory, "weights.npy"), weights)
            ray.train.report({"epoch": epoch, "world": world, "tensorflow": "tensorflow" in sys.modules},
                             checkpoint=Checkpoint.from_directory(directory))
        trained.clear()

    for epoch in range(start, EPOCHS):
        for step, batch in enumerate(feed, 1):
            if (world, rank, epoch, step) == (2, 1, 0, DIE_AT):
                time.sleep(4)  # Ray Train takes the step-3 checkpoint at its next poll (2 s)
                os.kill(os.getpid(), signal.SIGKILL)
            w = batch[ray_tfrecord.WEIGHT_COLUMN]
            error = batch["x"] @ weights - batch["y"]
            weights -= 0.1 * (w * error) @ batch["x"] / BATCH  # padding rows (w = 0) do not train
            trained.extend(f"{epoch} {i} {world}\\n" for i in batch["id"][w > 0].tolist())
            if step % EVERY == 0:
                report(epoch)
        report(epoch)


began = time.monotonic()
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
ids = np.arange(ROWS)
x = np.stack([ids % 7 / 7, ids % 3 / 3], 1).astype(np.float32)
table = pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 2),
                  "y": (x @ np.array([2.0, -1.0], np.float32)).astype(np.float32)})
os.makedirs(os.path.join(tmp, "data"))
for f, part in enumerate((table.slice(0, 120), table.slice(120))):
    with open(os.path.join(tmp, "data", f"part-{f}.tfrecord"), "wb") as out:
        out.write(ray_tfrecord.encode(part).data)
plan = ray_tfrecord.plan_splits(os.path.join(tmp, "data"), schema=table.schema, split_bytes=2048)


def fit(workers):
    return DataParallelTrainer(
        loop, train_loop_config={"plan": plan},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name="numpy", storage_path=os.path.join(tmp, "runs"),
                             failure_config=FailureConfig(max_failures=0),
                             checkpoint_config=CheckpointConfig(num_to_keep=None))).fit()


planned = time.monotonic()
try:
    fit(2)
    raise SystemExit("the first run did not fail")
except WorkerGroupError:
    pass
failed = time.monotonic()
result = fit(1)  # the same run: Ray Train resumes it from its last checkpoint
print(f"ray and plan {planned - began:.0f} s, failed run {failed - planned:.0f} s, resumed run "
      f"{time.monotonic() - failed:.0f} s")
counts, metrics = {}, []
for checkpoint, reported in result.best_checkpoints:
    metrics.append(reported)
    with checkpoint.as_directory() as directory:
        for name in os.listdir(directory):
            if name.startswith("ids-"):
                for line in open(os.path.join(directory, name)):
                    counts[line.strip()] = counts.get(line.strip(), 0) + 1
json.dump({"counts": counts, "metrics": metrics, "driver_tensorflow": "tensorflow" in sys.modules},
          open(os.path.join(tmp, "out.json"), "w"))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_lost_mid_epoch_then_one_worker_trains_every_row_once_without_tensorflow(tmp_path):
    (tmp_path / "driver.py").write_text(_DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "RAY_ADDRESS": "local", "RAY_TRAIN_V2_ENABLED": "1"}
    run = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path), str(ROWS), str(EPOCHS)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=550)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    print(run.stdout.strip().splitlines()[-1])
    out = json.loads((tmp_path / "out.json").read_text())
    assert not out["driver_tensorflow"] and not any(m["tensorflow"] for m in out["metrics"])
    assert [m["world"] for m in out["metrics"]] == sorted((m["world"] for m in out["metrics"]), reverse=True)
    per_epoch = collections.defaultdict(collections.Counter)
    groups = collections.defaultdict(set)
    for key, n in out["counts"].items():
        epoch, i, world = map(int, key.split())
        per_epoch[epoch][i] += n
        groups[epoch].add(world)
    assert sorted(per_epoch) == list(range(EPOCHS))
    assert groups[0] == {1, 2} and groups[1] == {1}  # epoch 0: some rows by each group, resumed mid-epoch
    for epoch, rows in per_epoch.items():
        assert rows == collections.Counter(range(ROWS)), (epoch, {i: n for i, n in rows.items() if n != 1})
