"""``ray_tfrecord.tf``: TensorFlow imported plainly (its crash messages reach the user), a missing
TensorFlow named with the extra that installs it, and one import for a training script."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FATAL = "FATAL: this TensorFlow binary needs AVX, which this CPU lacks"


def _python(code: str, *front: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``front`` ahead of everything on its path."""
    path = os.pathsep.join([*map(str, front), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "RAY_ADDRESS": "local"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_tensorflow_that_aborts_at_import_is_heard(tmp_path):
    """TensorFlow's own fatal CPU-feature check prints a line and aborts the process: the line
    must reach the user's stderr, as it does for ``import tensorflow`` alone."""
    stand_in = tmp_path / "tensorflow"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text(f"import os, sys\nsys.stderr.write({FATAL!r} + '\\n')\nos.abort()\n")
    for code in ("import tensorflow", "import ray_tfrecord.tf", "from ray_tfrecord.tf import tf_dataset"):
        run = _python(code, tmp_path)
        assert run.returncode == -6, (code, run.returncode, run.stderr[-2000:])
        assert FATAL in run.stderr, (code, run.stderr[-2000:])


@pytest.mark.parametrize("code", ["import ray_tfrecord.tf", "from ray_tfrecord.tf import tf_dataset",
                                  "from ray_tfrecord.tf import ResumableFeed"])
def test_without_tensorflow_the_error_names_the_extra(tmp_path, code):
    # A module that raises ModuleNotFoundError for itself: what Python does where nothing is installed.
    (tmp_path / "tensorflow.py").write_text("raise ModuleNotFoundError(\"No module named 'tensorflow'\", "
                                            "name='tensorflow')\n")
    run = _python(code, tmp_path)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last == ("ImportError: ray_tfrecord.tf needs TensorFlow, which is not installed: "
                    "pip install 'ray_tfrecord[tf]'"), run.stderr[-2000:]


def test_an_error_inside_tensorflow_is_not_renamed(tmp_path):
    """Only TensorFlow's absence is the extra's business: its own broken import stays as it is."""
    (tmp_path / "tensorflow.py").write_text("import a_module_tensorflow_needs\n")
    run = _python("import ray_tfrecord.tf", tmp_path)
    assert run.returncode == 1
    assert "No module named 'a_module_tensorflow_needs'" in run.stderr.strip().splitlines()[-1]
    assert "ray_tfrecord[tf]" not in run.stderr


def test_one_import_gives_the_training_api_and_loads_it_lazily():
    code = """
import sys
import ray_tfrecord.tf as rt
heavy = [m for m in ("ray.train", "tf_keras", "ray_tfrecord._src.tf.train", "ray_tfrecord._src.tf.checkpoint")
         if m in sys.modules]
from ray_tfrecord.tf import (KerasVersionError, ReportCheckpoint, ResumableFeed, SplitPlan, inference, plan_splits,
                             predict, restore, tensorflow_trainer, tf_dataset)
from ray_tfrecord._src.data.feed.splits import plan_splits as home
from ray_tfrecord._src.tf.train import KerasVersionError as home_error
assert plan_splits is home and KerasVersionError is home_error
assert sorted(rt.__all__) == sorted(["MODEL_FILE", "ClusterFailedError", "KerasVersionError", "PSResult", "PSTrainer",
                                     "ReportCheckpoint",
                                     "ResumableFeed", "SplitPlan", "TensorBoard", "feature_spec", "inference", "plan_splits", "predict",
                                     "ps_checkpoint_dir", "ps_trainer", "restore", "tensorflow_trainer", "tf_dataset",
                                     "tfrecord_dataset"])
assert all(callable(getattr(rt, n)) for n in rt.__all__ if n != "MODEL_FILE") and rt.MODEL_FILE == "model.keras"
print("heavy before use:", heavy)
"""
    run = _python(code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "heavy before use: []" in run.stdout


@pytest.mark.slow
def test_tensorflow_start_up_lines_are_those_of_a_plain_import():
    """Nothing filters TensorFlow's own start-up output: the lines of ``import tensorflow`` are there
    as often as without this package."""
    ours = _python("import ray_tfrecord.tf, tensorflow as tf; print(int(tf.constant([1, 2]).numpy().sum()))")
    bare = _python("import tensorflow as tf; print(int(tf.constant([1, 2]).numpy().sum()))")
    assert ours.returncode == bare.returncode == 0 and ours.stdout.strip() == bare.stdout.strip() == "3", ours.stderr
    for line in ("oneDNN custom operations", "Could not find cuda drivers", "before absl::InitializeLog"):
        assert ours.stderr.count(line) == bare.stderr.count(line), (line, ours.stderr, bare.stderr)
