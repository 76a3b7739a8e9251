"""``inference(..., checkpoint_path=...)`` killed part-way and run again: every key once, each with its
model's prediction.

The job is issue 37's, a driver process of its own (:func:`tests.test_checkpoint_jobs.run_driver`):
a Keras model over keyed rows read and then mapped, on ``ray.init(num_cpus=2)``, written with
``min_rows_per_file`` so that Ray records its progress write task by write task. The test SIGKILLs the
driver's process group once Ray has committed some checkpoint files and runs it again: with
``num_cpus=1`` the rerun is refused at once (it used to wait forever), with the defaults it finishes.
The output is Parquet (Ray's sink); TFRecord output, our sink under the same checkpointing, is killed
and rerun in test_checkpoint_jobs.py and docs/restartable-batch-jobs.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.cloudpickle
from ray.data.context import DataContext

from ray_tfrecord import StallError, read_tfrecords, write_tfrecords
from ray_tfrecord._src.core.layout import STAGING_DIR
from ray_tfrecord._src.data import compat
from tests.test_checkpoint_jobs import run_driver, start_ray
from tests.test_faults import visible_files

pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(not compat.CHECKPOINTS,
                       reason=f"Ray {ray.__version__} has no job checkpointing (DataContext.checkpoint_config)"),
]
# Workers cannot import this module (tests/ is not installed); ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = 3000
READ_TASKS = 12
ROWS_PER_WRITE = 250  # inference(min_rows_per_file=): 12 write tasks, 12 checkpoint steps
KILL_AFTER = 2  # committed checkpoint files


def keys() -> np.ndarray:
    return np.arange(ROWS, dtype=np.int64) * 7 + 3  # keys that are not row numbers


def features() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((ROWS, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def source(ray_local, tmp_path_factory):
    """The keyed input rows as TFRecord, and a small Keras 3 model saved as ``.keras``."""
    import keras

    root = tmp_path_factory.mktemp("inference_resume")
    x = features()
    table = pa.table({"key": keys(), "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4)})
    write_tfrecords(ray.data.from_arrow(table), str(root / "src"), max_rows_per_file=ROWS // READ_TASKS)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.save(root / "model.keras")
    return root, model.predict(x, verbose=0).reshape(-1)


def slow_read(batch: pa.Table) -> pa.Table:
    """Pace the job (0.3 s per read task) so that it is killed part-way, not after its last write."""
    time.sleep(0.3)
    return batch


def inference_job(src: str, model: str, out: str, checkpoint: str, options: dict) -> None:
    """The user's job: ``inference`` over ``src``, restartable through ``checkpoint``, every other option at
    its default unless ``options`` sets it; prints the error a refusal raised and the library's log lines."""
    from ray_tfrecord.tf import inference

    start_ray(num_cpus=2)
    # Start reading once the model is loaded, so that the pace is the reads' and not TensorFlow's import.
    DataContext.get_current().wait_for_min_actors_s = 300
    ds = read_tfrecords(src, override_num_blocks=READ_TASKS).map_batches(slow_read, batch_size=None,
                                                                         batch_format="pyarrow")
    said = _Said()
    logging.getLogger("ray_tfrecord").addHandler(said)
    started = time.monotonic()
    try:
        inference(ds, model, out, feature_columns="x", key_columns=["key"], output_format="parquet",
                  checkpoint_path=checkpoint, min_rows_per_file=ROWS_PER_WRITE, **options)
        error = None
    except StallError as e:
        error = str(e)
    print("RESULT " + json.dumps({"error": error, "seconds": time.monotonic() - started, "said": said.lines}))
    ray.shutdown()


class _Said(logging.Handler):
    """The library's log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def committed_checkpoints(checkpoint: Path) -> int:
    return len([p for p in checkpoint.glob("*.parquet") if ".pending" not in p.name]) if checkpoint.is_dir() else 0


def output_rows(out: Path) -> dict[str, list[dict]]:
    """The rows a reader sees under ``out``, by file name (every file must read whole)."""
    return {os.path.basename(f): pq.read_table(f).to_pylist() for f in visible_files(out)}


@pytest.mark.slow
def test_killed_inference_resumes_with_every_key_once(source, tmp_path):
    """The rerun with 1 CPU for the predictor refuses at once, naming num_cpus=; with the defaults the
    predictor takes what Ray's checkpoint filter leaves, says so, and every key is written exactly once."""
    root, expected = source
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = [str(root / "src"), str(root / "model.keras"), str(out), str(checkpoint)]
    run_driver("tests.test_inference_resume", "inference_job", [*args, {}],
               kill_when=lambda: committed_checkpoints(checkpoint) >= KILL_AFTER,
               what=f"{KILL_AFTER} committed checkpoint files")
    killed = output_rows(out)
    seen = [r["key"] for rows in killed.values() for r in rows]
    assert len(seen) == len(set(seen)) and set(seen) <= set(keys().tolist())
    assert len(seen) < ROWS, "the job had written everything when it was killed: nothing left to resume"

    refused = run_driver("tests.test_inference_resume", "inference_job", [*args, {"num_cpus": 1.0}])
    assert refused["error"] == (
        "inference would wait forever: it needs 3 CPUs at once (predictor actors 1 x 1 CPU, Ray's checkpoint "
        "filter actor 1 x 1 CPU, one task 1 CPU) and the cluster has 2; pass inference(num_cpus=0) or "
        "ray.init(num_cpus=3) (or a cluster with that many CPUs)")
    assert refused["seconds"] < 5, "the refusal comes before any actor starts"
    assert output_rows(out) == killed

    finished = run_driver("tests.test_inference_resume", "inference_job", [*args, {}])
    # Finished, not timed: under CI's load the rerun's Ray start alone varies by tens of seconds; a hang
    # fails run_driver's own timeout, and the refusal above is the part the issue times.
    assert finished["error"] is None
    assert finished["said"] == [
        "inference: predictor actors 1 x 0 CPU instead of 1 x 1, so that Ray's checkpoint filter actor 1 x 1 CPU "
        "and one task 1 CPU fit on this 2-CPU cluster; pass inference(num_cpus=...) to choose"]
    final = output_rows(out)
    rows = [r for file_rows in final.values() for r in file_rows]
    by_key = {r["key"]: r["prediction"] for r in rows}
    assert len(rows) == ROWS and sorted(by_key) == keys().tolist()  # every key, none twice
    np.testing.assert_allclose([by_key[k] for k in keys().tolist()], expected, rtol=1e-5, atol=1e-6)
    assert not checkpoint.exists()  # Ray deletes it when the job succeeds
    assert not (out / STAGING_DIR).exists()
    removed = [f for f in killed if f not in final]  # files of tasks killed before Ray recorded them
    rerun = len(rows) - sum(len(final[f]) for f in killed if f in final)
    print(f"\nINFERENCE RESUME (parquet): keys expected {ROWS}; visible at the kill {len(seen)} in "
          f"{len(killed)} files ({len(removed)} removed by the rerun); written by the rerun {rerun} in "
          f"{len(set(final) - set(killed))} files; final {len(rows)}, distinct {len(by_key)}")
