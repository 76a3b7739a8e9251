"""``inference(..., checkpoint_path=...)`` killed part-way and run again: every key once, each with its
model's prediction, for TFRecord and Parquet output.

The job is a driver process of its own (:func:`tests.test_checkpoint_jobs.run_driver`): a Keras model
over keyed rows, written with ``min_rows_per_file`` so that Ray records its progress write task by
write task. The test SIGKILLs the driver's process group once Ray has committed some checkpoint files,
runs the same call again, and compares the output with ``model.predict``.
"""

from __future__ import annotations

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

from ray_tfrecord import read_tfrecords, write_tfrecords
from ray_tfrecord._src.core.layout import STAGING_DIR
from ray_tfrecord._src.io import compat
from tests.test_checkpoint_jobs import run_driver, start_job_ray
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


def inference_job(src: str, model: str, out: str, checkpoint: str, output_format: str) -> None:
    """The user's job: ``inference`` over ``src``, restartable through ``checkpoint``."""
    from ray_tfrecord.tf import inference

    start_job_ray(checkpoint, 2)
    # Start reading once the model is loaded, so that the pace is the reads' and not TensorFlow's import.
    DataContext.get_current().wait_for_min_actors_s = 300
    ds = read_tfrecords(src, override_num_blocks=READ_TASKS).map_batches(slow_read, batch_size=None,
                                                                         batch_format="pyarrow")
    inference(ds, model, out, feature_columns="x", key_columns=["key"], output_format=output_format, batch_size=125,
              num_cpus=0.5, checkpoint_path=checkpoint, min_rows_per_file=ROWS_PER_WRITE)
    print("RESULT {}")
    ray.shutdown()


def committed_checkpoints(checkpoint: Path) -> int:
    return len([p for p in checkpoint.glob("*.parquet") if ".pending" not in p.name]) if checkpoint.is_dir() else 0


def output_rows(out: Path, output_format: str) -> dict[str, list[dict]]:
    """The rows a reader sees under ``out``, by file name (every file must read whole)."""
    if not visible_files(out):
        return {}
    if output_format == "parquet":
        return {os.path.basename(f): pq.read_table(f).to_pylist() for f in visible_files(out)}
    files: dict[str, list[dict]] = {}
    for row in read_tfrecords(str(out), include_paths=True).take_all():
        files.setdefault(os.path.basename(row.pop("path")), []).append(row)
    return files


# TFRecord output: test_stalls.py's killed rerun (with the default num_cpus) and docs/restartable-batch-jobs.md.
@pytest.mark.parametrize("output_format", ["parquet"])
def test_killed_inference_resumes_with_every_key_once(source, tmp_path, output_format):
    root, expected = source
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = [str(root / "src"), str(root / "model.keras"), str(out), str(checkpoint), output_format]
    run_driver("tests.test_inference_resume", "inference_job", args,
               kill_when=lambda: committed_checkpoints(checkpoint) >= KILL_AFTER,
               what=f"{KILL_AFTER} committed checkpoint files")
    killed = output_rows(out, output_format)
    seen = [r["key"] for rows in killed.values() for r in rows]
    assert len(seen) == len(set(seen)) and set(seen) <= set(keys().tolist())
    assert len(seen) < ROWS, "the job had written everything when it was killed: nothing left to resume"

    run_driver("tests.test_inference_resume", "inference_job", args)
    final = output_rows(out, output_format)
    rows = [r for file_rows in final.values() for r in file_rows]
    by_key = {r["key"]: r["prediction"] for r in rows}
    assert len(rows) == ROWS and sorted(by_key) == keys().tolist()  # every key, none twice
    np.testing.assert_allclose([by_key[k] for k in keys().tolist()], expected, rtol=1e-5, atol=1e-6)
    assert not checkpoint.exists()  # Ray deletes it when the job succeeds
    assert not (out / STAGING_DIR).exists()
    removed = [f for f in killed if f not in final]  # files of tasks killed before Ray recorded them
    rerun = len(rows) - sum(len(final[f]) for f in killed if f in final)
    print(f"\nINFERENCE RESUME ({output_format}): keys expected {ROWS}; visible at the kill {len(seen)} in "
          f"{len(killed)} files ({len(removed)} removed by the rerun); written by the rerun {rerun} in "
          f"{len(set(final) - set(killed))} files; final {len(rows)}, distinct {len(by_key)}")
