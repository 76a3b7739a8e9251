"""Every ```python block of the README runs as written.

The blocks run in order, as one script in a fresh Python process, the way a reader who pastes
the README into one session top to bottom would run them: a later block may use what an earlier
one defined (the batch-inference block uses the model the training block trained). Paths under
``/tmp/`` are moved under the test's ``tmp_path``; nothing else is changed. The process starts
its own local Ray, sized by the machine (2 CPUs on the project's), and a timeout turns a hang
into a failure.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_every_python_block_runs(tmp_path):
    blocks = _python_blocks(README.read_text())
    assert len(blocks) >= 3 and "write_tfrecords" in blocks[0] and "tensorflow_trainer" in "".join(blocks)
    script = "\n".join(f"# README.md, python block {i + 1}\n{block}" for i, block in enumerate(blocks))
    (tmp_path / "readme_blocks.py").write_text(script.replace("/tmp/", f"{tmp_path}/"))
    # RAY_ADDRESS=local: a cluster another test (or person) started must not be joined.
    env = {**os.environ, "RAY_ADDRESS": "local"}
    run = subprocess.run(
        [sys.executable, "readme_blocks.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert (tmp_path / "words" / "_SUCCESS").exists()
    assert sorted(p.name for p in (tmp_path / "words").iterdir() if p.is_dir()) == ["number=1", "number=2", "number=8"]
    # The steps rule the README states, as Keras printed it in the 2-worker run:
    # 2 * ((1000 // 2) // 100) = 10 steps per epoch on every rank.
    progress = re.findall(r"\b(\d+)/(\d+) - ", run.stdout + run.stderr)
    assert progress and set(progress) == {("10", "10")}, progress
