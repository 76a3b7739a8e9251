"""The examples keep TensorFlow's start-up banners off the console, in the driver and in Ray workers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "train_examples"
BANNERS = ("oneDNN", "cuda", "cuInit", "absl::InitializeLog", "rebuild TensorFlow")

# What an example does: install the hook before TensorFlow is imported, start Ray with it,
# then import TensorFlow in the driver and in a Ray task.
SCRIPT = """
import _quiet_tf
_quiet_tf.install()
import ray
ray.init(num_cpus=1, include_dashboard=False, runtime_env=_quiet_tf.ray_runtime_env())

@ray.remote
def tf_in_worker():
    import tensorflow as tf
    return int(tf.constant(20) + 1)

import tensorflow as tf
print("driver", int(tf.constant(1) + 1), "worker", ray.get(tf_in_worker.remote()), flush=True)
"""


def _run(extra_env: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([str(EXAMPLES), env.get("PYTHONPATH", "")]), **extra_env)
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "driver 2 worker 21" in run.stdout
    return run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_banners_hidden_unless_asked_for():
    quiet = _run({})
    assert [b for b in BANNERS if b in quiet] == []
    # A log level the user set is an explicit wish: TensorFlow's own lines come back.
    asked = _run({"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert "oneDNN" in asked or "cuda" in asked
