"""No job waits forever: the check before each entry point, and the watchdog.

The watchdog and the 2-CPU entry points use the session's 2-CPU Ray, and the 1-CPU entry points a
driver of their own (:func:`tests.test_checkpoint_jobs.run_driver`). Each job is timed: it finishes,
or says what it waits for, well within 60 s. Issue 37's reproduction (a killed, checkpointed
``inference`` run again with its defaults on 2 CPUs) is test_inference_resume.py's test.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import ray
import ray.cloudpickle

import ray_tfrecord
from ray_tfrecord import StallError, read_tfrecords, write_tfrecords
from ray_tfrecord._src.data import progress
from tests.test_checkpoint_jobs import run_driver, start_ray

pytestmark = pytest.mark.timeout(300)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# What a job may take on a loaded 2-core machine (the bound is 60 s).
WITHIN_S = 60


# -- the watchdog --------------------------------------------------------------------------------


@ray.remote(num_cpus=2)
class _Hog:
    """An actor holding the session cluster's 2 CPUs."""

    def ready(self) -> bool:
        return True


@pytest.fixture
def stall_after_2s():
    progress.set_stall_timeout(2.0)
    yield
    progress.set_stall_timeout(120.0)


def test_watchdog_names_the_starved_tasks_and_the_holders(ray_local, stall_after_2s):
    hog = _Hog.remote()
    ray.get(hog.ready.remote())
    started = time.monotonic()
    try:
        with pytest.raises(StallError) as stalled:
            with progress.Watchdog("the job", [progress.Holder("hogs", 1, 2.0)], waiting="its read tasks"):
                ray.data.range(10).map_batches(lambda b: b).take_all()
    finally:
        ray.kill(hog)
    assert time.monotonic() - started < 15
    message = str(stalled.value)
    assert message.startswith("the job made no progress for 2 s: its read tasks wait for 1 CPU and 0 of the "
                              "cluster's 2 are free, the rest held by hogs 1 x 2 CPU (GPUs free: 0 of 0; object "
                              "store memory free: "), message
    assert message.endswith("GiB). Pass ray.init(num_cpus=3) (or a cluster with that many CPUs); for a cluster that "
                            "is autoscaling, set_stall_timeout(None)")
    # Ray Data stopped the execution: the cluster's CPUs are free again once the hog is gone.
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.data.range(4).map_batches(lambda b: b).count() == 4


def _sleepy(batch: dict) -> dict:
    time.sleep(4)
    return batch


def test_watchdog_leaves_a_slow_running_task_alone(ray_local, stall_after_2s):
    """A task that runs longer than the stall time holds a CPU no watched actor holds: progress."""
    hog = _Hog.options(num_cpus=1).remote()
    ray.get(hog.ready.remote())
    try:
        with progress.Watchdog("the job", [progress.Holder("hogs", 1, 1.0)]):
            assert ray.data.range(1).map_batches(_sleepy).count() == 1
    finally:
        ray.kill(hog)


def test_stall_timeout_is_set_in_one_place(monkeypatch):
    monkeypatch.setattr(progress, "_stall_s", progress._UNSET)
    monkeypatch.delenv(progress.STALL_TIMEOUT_ENV, raising=False)
    assert progress.stall_timeout() == 120
    monkeypatch.setenv(progress.STALL_TIMEOUT_ENV, "off")
    assert progress.stall_timeout() is None
    monkeypatch.setenv(progress.STALL_TIMEOUT_ENV, "30")
    assert progress.stall_timeout() == 30
    ray_tfrecord.set_stall_timeout(5)
    assert progress.stall_timeout() == 5
    with pytest.raises(ValueError, match=r"set_stall_timeout: seconds=0; pass a positive number"):
        ray_tfrecord.set_stall_timeout(0)


def test_autoscaling_jobs_are_warned_not_refused(ray_local, monkeypatch, caplog):
    monkeypatch.setattr(progress, "_stall_s", None)
    progress.preflight("inference", [progress.Holder("predictor actors", 4, 1.0)], fix="inference(num_cpus={cpus})")
    assert "inference would wait forever: it needs 5 CPUs at once" in caplog.text
    assert "set_stall_timeout(None) says the cluster is autoscaling" in caplog.text


# -- every entry point, defaults, on 1 and 2 CPUs -----------------------------------------------


def _rows() -> pa.Table:
    n = 64
    return pa.table({"id": np.arange(n, dtype=np.int64), "x": np.random.default_rng(0).random(n, np.float32)})


def entry_points(root: str, model: str) -> dict[str, str | None]:
    """Each entry point with its defaults on the current Ray: ``None`` when it finished, else the
    StallError's message; each within ``WITHIN_S``."""
    from ray_tfrecord.tf import ResumableFeed, inference, plan_splits, predict, tensorflow_trainer, tf_dataset

    def steps(dataset) -> int:
        return sum(1 for _ in dataset)

    jobs = {
        "write_tfrecords": lambda: write_tfrecords(ray.data.from_arrow(_rows()), f"{root}/src", mode="overwrite"),
        "read_tfrecords": lambda: read_tfrecords(f"{root}/src").take_all(),
        "predict": lambda: predict(read_tfrecords(f"{root}/src"), model, feature_columns="x",
                                   key_columns=["id"]).take_all(),
        "inference": lambda: inference(read_tfrecords(f"{root}/src"), model, f"{root}/out", feature_columns="x",
                                       key_columns=["id"], mode="overwrite"),
        "tf_dataset": lambda: steps(tf_dataset(read_tfrecords(f"{root}/src"), feature_columns="x",
                                               label_columns="id", batch_size=8)),
        "ResumableFeed": lambda: steps(ResumableFeed(plan_splits(f"{root}/src"), feature_columns="x",
                                                     label_columns="id", batch_size=8, rank=0,
                                                     world_size=1).dataset()),
        "tensorflow_trainer": lambda: tensorflow_trainer(lambda config: None, datasets={}, num_workers=1),
        "cli": lambda: _convert(root),
    }
    outcomes: dict[str, str | None] = {}
    for name, job in jobs.items():
        started = time.monotonic()
        try:
            job()
            outcomes[name] = None
        except StallError as e:
            outcomes[name] = str(e)
        assert time.monotonic() - started < WITHIN_S, f"{name} took {time.monotonic() - started:.0f} s"
    return outcomes


def _convert(root: str) -> None:
    """``ray-tfrecord convert``: Parquet to TFRecord on the Ray already started."""
    import pyarrow.parquet as pq

    from ray_tfrecord._src.cli import main

    Path(f"{root}/parquet").mkdir(exist_ok=True)
    pq.write_table(_rows(), f"{root}/parquet/rows.parquet")
    assert main(["convert", f"{root}/parquet", f"{root}/converted", "--format", "parquet", "--mode", "overwrite"]) == 0


def one_cpu_entry_points(root: str, model: str) -> None:
    start_ray(num_cpus=1)
    print("RESULT " + json.dumps(entry_points(root, model)))
    ray.shutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((), name="x")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Reshape((1,))(inputs)))
    path = tmp_path_factory.mktemp("stall_model") / "model.keras"
    model.save(path)
    return str(path)


@pytest.mark.slow
def test_entry_points_on_2_cpus_finish(ray_local, model, tmp_path):
    assert entry_points(str(tmp_path), model) == dict.fromkeys(
        ["write_tfrecords", "read_tfrecords", "predict", "inference", "tf_dataset", "ResumableFeed",
         "tensorflow_trainer", "cli"])


@pytest.mark.slow
def test_entry_points_on_1_cpu_finish_or_refuse(model, tmp_path):
    outcomes = run_driver("tests.test_stalls", "one_cpu_entry_points", [str(tmp_path), model], timeout=200)
    assert outcomes == {
        "write_tfrecords": None, "read_tfrecords": None,
        "predict": None, "inference": None,
        "tf_dataset": None, "ResumableFeed": None,
        "tensorflow_trainer": "tensorflow_trainer would wait forever: it needs 2 CPUs at once (training workers 1 "
                              "x 1 CPU, one task 1 CPU) and the cluster has 1; pass ray.init(num_cpus=2) (or a "
                              "cluster with that many CPUs)",
        "cli": None,
    }


# -- two feeds in one process -------------------------------------------------------------------


class _Scaled:
    """A class transform: Ray Data runs it on an actor pool, each actor holding a CPU."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        return batch.set_column(batch.schema.get_field_index("x"), "x", pa.compute.multiply(batch["x"], 2.0))


FEED_ROWS = 50_000  # of 4 KiB: a Ray Data execution of the feed is still reading after its first table


def three_feeds(root: str) -> None:
    """Three feeds with an actor each, on 2 CPUs, made first and then read in turns (Keras' training and
    validation feeds, and one more); each pass reports its rows and seconds."""
    from ray_tfrecord.tf import ResumableFeed, plan_splits

    start_ray(num_cpus=2)
    rng = np.random.default_rng(0)
    rows = pa.table({"id": np.arange(FEED_ROWS), "x": rng.random(FEED_ROWS, np.float32),
                     "big": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(FEED_ROWS * 1024, np.float32)),
                                                              1024)})
    write_tfrecords(ray.data.from_arrow(rows), f"{root}/src", max_rows_per_file=FEED_ROWS // 40)
    plan = plan_splits(f"{root}/src")
    feeds = [ResumableFeed(plan, feature_columns="x", label_columns="id", batch_size=500, rank=0, world_size=1,
                           transform=_Scaled, transform_options={"concurrency": 1}) for _ in range(3)]
    started = time.monotonic()
    datasets = [feed.dataset() for feed in feeds]
    passes = [[sum(int(weight.numpy().sum()) for _, _, weight in dataset) for dataset in datasets] for _ in range(2)]
    print("RESULT " + json.dumps({"passes": passes, "seconds": time.monotonic() - started}))
    ray.shutdown()


@pytest.mark.slow
def test_three_transformed_feeds_take_turns_on_2_cpus(tmp_path):
    """Before, the third feed's dataset() waited forever: the first two feeds' Ray Data executions,
    started for their first table and kept for their first pass, held their actors and both CPUs."""
    result = run_driver("tests.test_stalls", "three_feeds", [str(tmp_path)], timeout=200)
    # Every pass of every feed ran (a wait forever fails run_driver's timeout); not timed, as above.
    assert result["passes"] == [[FEED_ROWS] * 3] * 2
