"""`ray job submit --working-dir .` against a real local head, as the README shows it.

The head is this test's own (`ray start --head --block` in a fresh session, its
own ports and temp dir) and is stopped by process group, never with `ray stop`,
which would also stop every other Ray on the machine.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_examples_quiet import readable_log_problems

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
EXCLUDE_PACKAGE_COPY = json.dumps({"excludes": ["ray_tfrecord"]})
# Where the job's driver and a Ray worker task import ray_tfrecord and its compiled codec from.
PROBE = """
import glob, json, os, ray
def where():
    import ray_tfrecord, ray_tfrecord._src.core._native as native
    package = os.path.dirname(ray_tfrecord.__file__)
    has_native = bool(glob.glob(package + "/_src/core/_native*.so"))
    return {"package": package, "native": native.__file__, "package_has_native": has_native}
ray.init()
print("PROBE " + json.dumps({"driver": where(), "worker": ray.get(ray.remote(where).remote())}))
"""


def _probe(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("PROBE "))
    return json.loads(line[len("PROBE ") :])


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _processes_under(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def head():
    port, dashboard, client, agent, agent_grpc, metrics, env_agent, node_mgr, obj_mgr = _free_ports(9)
    # Short: Ray puts unix sockets under it.
    temp_dir = tempfile.mkdtemp(prefix="rtfj", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Token auth, explicitly: the head then requires the token (~/.ray/auth_token)
    # and the job CLI sends it; left unset, the CLI would not send it.
    env["RAY_AUTH_MODE"] = "token"
    # The job's `python` is looked up on the head's PATH: make it this environment's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [
        RAY,
        "start",
        "--head",
        "--block",
        "--num-cpus",
        "2",
        "--num-gpus",
        "0",
        "--port",
        str(port),
        "--dashboard-port",
        str(dashboard),
        "--dashboard-host",
        "127.0.0.1",
        "--ray-client-server-port",
        str(client),
        "--dashboard-agent-listen-port",
        str(agent),
        "--dashboard-agent-grpc-port",
        str(agent_grpc),
        "--metrics-export-port",
        str(metrics),
        "--runtime-env-agent-port",
        str(env_agent),
        "--node-manager-port",
        str(node_mgr),
        "--object-manager-port",
        str(obj_mgr),
        "--temp-dir",
        temp_dir,
        "--disable-usage-stats",
    ]
    log = open(os.path.join(temp_dir, "ray_start.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/version", timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # answering, if only to ask for the auth token the CLI sends
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray start failed: {Path(log.name).read_text()[-3000:]}") from None
                time.sleep(1)
        yield address, env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # Anything of this head that left the process group still names its temp dir.
        for pid in _processes_under(temp_dir):
            os.kill(pid, signal.SIGKILL)
        log.close()


def _submit(head, runtime_env: str | None, *entrypoint: str, timeout: int = 360) -> subprocess.CompletedProcess:
    address, env = head
    cmd = [RAY, "job", "submit", "--address", address, "--working-dir", "."]
    if runtime_env is not None:
        cmd += ["--runtime-env-json", runtime_env]
    return subprocess.run([*cmd, "--", *entrypoint], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_excludes_keeps_the_installed_package_in_use(head):
    """Why the README's command excludes ray_tfrecord from the upload.

    The upload honours .gitignore, which drops ``*.so``, and puts the copy first on the path of
    the driver and every worker: without the exclude, the job imports the uploaded sources, beside
    no compiled codec, and fails at ``import ray_tfrecord`` (the compiled codec lives in
    ``ray_tfrecord/_src/core/``, below where an editable install's finder still looks).
    """
    shadowed = _submit(head, None, "python", "-c", PROBE, timeout=180)
    output = shadowed.stdout + shadowed.stderr
    assert shadowed.returncode != 0, output[-3000:]
    assert re.search(r"working_dir_files/\S+/ray_tfrecord/_src/core/codec\.py", output), output[-3000:]
    assert "cannot import name '_native' from 'ray_tfrecord._src.core'" in output, output[-3000:]
    installed = _probe(_submit(head, EXCLUDE_PACKAGE_COPY, "python", "-c", PROBE, timeout=180))
    for side in ("driver", "worker"):
        assert installed[side]["package"] == str(REPO / "ray_tfrecord")
        assert installed[side]["package_has_native"]
        assert os.path.dirname(installed[side]["native"]) == os.path.join(installed[side]["package"], "_src", "core")


def test_digits_demo_runs_as_a_job(head):
    result = _submit(head, EXCLUDE_PACKAGE_COPY, "python", "train_examples/digits.py")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert re.search(r"Job '\S+' succeeded", output), output[-3000:]
    accuracy = float(re.search(r"test accuracy: ([0-9.]+) on (\d+) predictions", output).group(1))
    assert accuracy >= 0.95
    assert re.search(r"on 360 predictions", output)
    # The job's log (all fifteen epochs) as `ray job submit` tails it, between its own lines, which Ray's
    # job CLI colours whatever its output is: what `make demo` prints too, with Ray's job lines around it.
    tailed = output.split("Tailing logs until the job exits (disable with --no-wait):\n", 1)[1]
    job_log = re.split(r"^.*-{20,}.*\n.*Job '\S+' succeeded", tailed, maxsplit=1, flags=re.M)[0]
    assert "test accuracy: " in job_log and "model in " in job_log
    assert readable_log_problems(job_log, max_lines=120) == []


def test_digits_parameter_server_example_runs_as_a_job(head):
    """Issue 38's example as a user submits it: 2 workers and 1 parameter server, tf-keras ``fit`` fed by
    ``tfrecord_dataset``, TensorBoard on; it learns the digits."""
    result = _submit(head, EXCLUDE_PACKAGE_COPY, "python", "train_examples/digits_ps.py")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert re.search(r"Job '\S+' succeeded", output), output[-3000:]
    assert re.search(r"trained \d+ epochs on 2 workers and 1 parameter server", output), output[-3000:]
    accuracy = float(re.search(r"test accuracy: ([0-9.]+) on (\d+) test digits", output).group(1))
    assert accuracy >= 0.95
