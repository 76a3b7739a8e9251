"""The examples' output is a log a person can read: no TensorFlow banners (in the driver or in Ray
workers), no re-drawn progress bars, colour codes or warnings when it goes to a file."""

import os
import re
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
# The same hook in a driver alone: what the user's own log level does needs no Ray start.
DRIVER_ONLY = """
import _quiet_tf
_quiet_tf.install()
import tensorflow as tf
print("driver", int(tf.constant(1) + 1), flush=True)
"""


def _run(extra_env: dict[str, str], script: str = SCRIPT, printed: str = "driver 2 worker 21") -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(RAY_ADDRESS="local", PYTHONPATH=os.pathsep.join([str(EXAMPLES), env.get("PYTHONPATH", "")]), **extra_env)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert printed in run.stdout
    return run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_banners_hidden_unless_asked_for():
    quiet = _run({})
    assert [b for b in BANNERS if b in quiet] == []
    # A log level the user set is an explicit wish: TensorFlow's own lines come back.
    asked = _run({"TF_CPP_MIN_LOG_LEVEL": "0"}, DRIVER_ONLY, printed="driver 2")
    assert "oneDNN" in asked or "cuda" in asked


def readable_log_problems(log: str, max_lines: int) -> list[str]:
    """What makes ``log`` (an example's stdout and stderr, captured to a file) hard to read."""
    lines = log.splitlines()
    problems = [f"{len(lines)} lines, more than {max_lines}"] if len(lines) > max_lines else []
    problems += [f"ANSI escapes: {line!r}" for line in lines if "\x1b" in line][:3]
    # tqdm re-draws a bar with carriage returns, or line by line once it is not a terminal.
    problems += [f"progress bar: {line!r}" for line in lines if "\r" in line or re.search(r"\d%\|", line)][:3]
    problems += [f"blank lines: {n}" for n in [sum(not line.strip() for line in lines)] if n > 5]
    problems += [f"warning: {line!r}" for line in lines if re.search(r"\w+Warning: ", line)]
    problems += [f"TensorFlow banner: {line!r}" for line in lines if any(b in line for b in BANNERS)]
    return problems
