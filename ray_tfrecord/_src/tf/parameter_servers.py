"""A parameter-server cluster on Ray: ``ps_trainer``, TensorFlowOnSpark's ``TFCluster.run(...,
num_ps=N)``.

Ray Train's ``TensorflowTrainer`` writes a ``TF_CONFIG`` with workers only
(``MultiWorkerMirroredStrategy``), so this is a sibling of
``tensorflow_trainer``, not an option of it: there is no Ray Train worker
group and no Ray dataset.  Every TensorFlow process is a Ray actor: ``num_ps`` parameter servers
(spread over the nodes) and ``num_workers`` workers, each reserving a free port and then running
``tf.distribute.Server`` until it is stopped, and a chief that runs the training function with a
``TF_CONFIG`` naming the ``chief``, ``worker`` and ``ps`` tasks.  The function builds
``ParameterServerStrategy`` from it (``TFConfigClusterResolver``) and trains with tf-keras ``fit`` or a
``ClusterCoordinator`` loop; the workers run the graphs the coordinator sends them, so they read data
with ``tfrecord_dataset``, not from Ray.

Failures: the driver waits on every actor.  A worker that stops is started again on its node at its
address, where TensorFlow's coordinator, which has put its steps back in the queue for the other
workers, finds it and builds its datasets again.  A parameter server or the chief that stops, or a
training function that raises, ends the cluster; it starts again, up to ``max_failures`` times, and the
function restores its last checkpoint (``BackupAndRestore(ps_checkpoint_dir())``).

Example (the chief's function)::

    def train(config):
        import tensorflow as tf

        strategy = tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())
        ...
"""

from __future__ import annotations

import errno
import inspect
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_tfrecord._src.core.errors import StallError
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat, progress
from ray_tfrecord._src.data.feed.splits import SplitPlan
from ray_tfrecord._src.tf.tf_filesystems import check_tf_opens

logger = logging.getLogger(__name__)

#: The chief's environment variable that holds the run's checkpoint directory.
CHECKPOINT_DIR_ENV = "RAY_TFRECORD_CHECKPOINT_DIR"
# tf-keras: Keras 3 has no ParameterServerStrategy. GRPC_FAIL_FAST: an RPC to a lost task fails at
# once instead of waiting for it, so that TensorFlow's coordinator sees the failure (its docs ask for it).
# TF_CPP_MIN_LOG_LEVEL: every server logs each session it serves, options and all (dozens of lines), at INFO.
_ENV = {"TF_USE_LEGACY_KERAS": "1", "GRPC_FAIL_FAST": "use_caller", "TF_CPP_MIN_LOG_LEVEL": "1"}
_DEFAULT_STORAGE = "~/ray_results"
# How long a replacement worker waits for its lost predecessor's port to come free.
_PORT_WAIT_S = 30.0


@public("ray_tfrecord.tf")
class ClusterFailedError(RuntimeError):
    """A ``ps_trainer`` run failed more times than ``max_failures`` allows: a parameter server or the chief
    stopped, or the training function raised (the ``__cause__``)."""


@public("ray_tfrecord.tf")
def ps_checkpoint_dir() -> str:
    """The run's checkpoint directory, ``<storage_path>/<name>/checkpoints``, inside the training function
    of [`ps_trainer`][ray_tfrecord.tf.ps_trainer]: where ``BackupAndRestore`` or a
    ``tf.train.CheckpointManager`` keeps what a restarted cluster resumes from."""
    path = os.environ.get(CHECKPOINT_DIR_ENV)
    if not path:
        raise ValueError("ps_checkpoint_dir(): this is not the training function of a ps_trainer run; call it "
                         "inside that function, or name a directory yourself")
    return path


@public("ray_tfrecord.tf")
@dataclass(frozen=True)
class PSResult:
    """What [`PSTrainer.fit`][ray_tfrecord.tf.PSTrainer.fit] returns.

    Attributes:
        metrics: The training function's return value (its last run's).
        path: The run's directory, ``<storage_path>/<name>``.
        checkpoint_dir: Where its checkpoints are ([`ps_checkpoint_dir`][ray_tfrecord.tf.ps_checkpoint_dir]
            inside the training function).
        failures: How many times the cluster was started again.
    """

    metrics: Any
    path: str
    checkpoint_dir: str
    failures: int


@public("ray_tfrecord.tf")
def ps_trainer(
    train_loop: Callable[..., Any],
    *,
    num_workers: int,
    num_ps: int = 1,
    train_loop_config: Mapping[str, Any] | None = None,
    cpus_per_worker: float = 1.0,
    cpus_per_ps: float = 1.0,
    storage_path: str | None = None,
    name: str | None = None,
    max_failures: int = 0,
    tensorboard: bool = False,
    env_vars: Mapping[str, str] | None = None,
) -> PSTrainer:
    """A parameter-server cluster of Ray actors that runs ``train_loop`` on its chief; ``.fit()`` runs it.

    Args:
        train_loop: Runs once, on the chief, with ``train_loop_config`` (if it takes an argument), its
            ``TF_CONFIG`` set: build ``tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())`` and train (tf-keras ``fit`` or a
            ``ClusterCoordinator`` loop), restoring from
            [`ps_checkpoint_dir`][ray_tfrecord.tf.ps_checkpoint_dir].  Its return value (picklable) is the
            result's ``metrics``.
        num_workers: Worker tasks: each runs the steps the coordinator sends it, on its own data.
        num_ps: Parameter servers, which hold the variables; spread over the nodes.
        train_loop_config: Passed to ``train_loop``.
        cpus_per_worker: CPUs each worker and the chief reserve.
        cpus_per_ps: CPUs each parameter server reserves.
        storage_path: Where the run's directory goes (``~/ray_results`` by default); shared storage on a
            multi-node cluster, since the chief may start on another node after a failure.
        name: The run's directory under ``storage_path`` (a timestamp by default); a run started again
            with the same name and path resumes from its checkpoints.
        max_failures: Times the cluster starts again after a parameter server or the chief stopped, or
            the training function raised (-1: without limit).  A lost worker does not count.
        tensorboard: Keep TensorBoard logs under the run's directory and print how to open them; the
            function adds ``TensorBoard()`` to ``fit``'s callbacks.
        env_vars: Extra environment variables for every task (they win over the defaults:
            ``TF_USE_LEGACY_KERAS=1``, ``GRPC_FAIL_FAST=use_caller`` and the thread pools sized to the
            CPUs).

    Raises:
        StallError: if the cluster cannot hold every task and a Ray task at once, naming the
            ``cpus_per_worker`` that fits.
        ValueError: for a ``num_workers`` or ``num_ps`` below 1.
    """
    for keyword, value in (("num_workers", num_workers), ("num_ps", num_ps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"ps_trainer: {keyword}={value!r}; pass a whole number of at least 1")
    for value in (train_loop_config or {}).values():
        # The workers read their plans with tfrecord_dataset: a plan TensorFlow cannot open fails here.
        if isinstance(value, SplitPlan) and value.splits:
            check_tf_opens("ps_trainer", compat.unpickled_filesystem(value.filesystem), value.splits[0].path)
    if not ray.is_initialized():
        ray.init()
    progress.preflight("ps_trainer", [progress.Holder("workers and the chief", num_workers + 1, cpus_per_worker),
                                      progress.Holder("parameter servers", num_ps, cpus_per_ps)],
                       fix="ps_trainer(cpus_per_worker={cpus})")
    run_dir = f"{os.path.expanduser(storage_path or _DEFAULT_STORAGE).rstrip('/')}/" \
              f"{name or time.strftime('ps_trainer_%Y-%m-%d_%H-%M-%S')}"
    # A log level the caller set in the driver's environment is an explicit wish: the tasks get it.
    env = {**_ENV, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"),
           CHECKPOINT_DIR_ENV: f"{run_dir}/checkpoints"}
    if tensorboard:
        # Here, not at the top: it imports tf_keras, which every task's process would then load.
        from ray_tfrecord._src.tf import tensorboard_logs

        log_dir = tensorboard_logs.run_log_dir(*run_dir.rsplit("/", 1))
        env[tensorboard_logs.TENSORBOARD_DIR_ENV] = log_dir
        tensorboard_logs.announce(log_dir)
    return PSTrainer(train_loop, dict(train_loop_config or {}), _Sizes(num_workers, num_ps, cpus_per_worker,
                                                                        cpus_per_ps),
                     run_dir, max_failures, {**env, **(env_vars or {})})


@dataclass(frozen=True)
class _Sizes:
    workers: int
    ps: int
    cpus_per_worker: float
    cpus_per_ps: float


@public("ray_tfrecord.tf")
class PSTrainer:
    """A parameter-server run that [`ps_trainer`][ray_tfrecord.tf.ps_trainer] set up; ``fit`` runs it.

    ```python
    result = ps_trainer(train, num_workers=2, num_ps=1, cpus_per_worker=0.5).fit()  # doctest: +SKIP
    print(result.metrics, result.checkpoint_dir, result.failures)
    ```
    """

    def __init__(self, train_loop: Callable[..., Any], config: dict[str, Any], sizes: _Sizes, run_dir: str,
                 max_failures: int, env: dict[str, str]) -> None:
        self._loop, self._config, self._sizes = train_loop, config, sizes
        self._run_dir, self._max_failures, self._env = run_dir, max_failures, env

    def fit(self) -> PSResult:
        """Start the cluster, run the training function on its chief, stop the cluster; start it again
        after a failure, up to ``max_failures`` times.

        Returns:
            A [`PSResult`][ray_tfrecord.tf.PSResult].

        Raises:
            ClusterFailedError: after one failure more than ``max_failures``.
            StallError: if the cluster's tasks did not all start within the stall timeout
                (``set_stall_timeout``: other jobs hold the CPUs).
        """
        failures = 0
        while True:
            cluster = _Cluster(self._sizes, self._env, f"{self._run_dir.rsplit('/', 1)[1]}:{failures}")
            try:
                metrics = cluster.run(self._loop, self._config)
            except _Lost as lost:
                failures += 1
                if 0 <= self._max_failures < failures:
                    raise ClusterFailedError(
                        f"ps_trainer: {lost.what}, and max_failures={self._max_failures} allows no more restarts; "
                        f"pass a larger max_failures= (-1: no limit) to start the cluster again from the "
                        f"checkpoints in {self._env[CHECKPOINT_DIR_ENV]}") from lost.cause
                logger.warning("ps_trainer: %s; starting the cluster again (restart %d of max_failures=%d), from "
                               "the checkpoints in %s", lost.what, failures, self._max_failures,
                               self._env[CHECKPOINT_DIR_ENV])
                continue
            finally:
                cluster.stop()
            return PSResult(metrics, self._run_dir, self._env[CHECKPOINT_DIR_ENV], failures)


class _Lost(Exception):
    """The cluster cannot go on: ``what`` stopped, because of ``cause``."""

    def __init__(self, what: str, cause: BaseException | None) -> None:
        super().__init__(what)
        self.what, self.cause = what, cause


def _threads(cpus: float) -> int:
    """TensorFlow's thread pools sized to the task's CPU share (it sizes them to the machine otherwise)."""
    return max(1, math.floor(cpus))


class _Task:
    """A TensorFlow task of the cluster in a Ray actor: a port reserved, then a ``tf.distribute.Server``
    (a parameter server or a worker) that runs until the actor is killed."""

    def __init__(self, port: int = 0) -> None:
        # Held until the server starts, so that no other process takes the port meanwhile.
        self._socket = _reserve(port)
        self._server: Any = None

    def address(self) -> tuple[str, str]:
        """(host:port, node id)."""
        ip = ray.util.get_node_ip_address()
        return f"{ip}:{self._socket.getsockname()[1]}", ray.get_runtime_context().get_node_id()

    def start(self, cluster: dict[str, list[str]], job: str, index: int, threads: int) -> None:
        import tensorflow as tf

        self._socket.close()
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads)
        self._server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                            protocol="grpc", config=config, start=True)

    def join(self) -> None:
        self._server.join()


class _Chief(_Task):
    """The chief: runs the training function, whose strategy starts the chief's server on the reserved port."""

    def run(self, loop: Callable[..., Any], config: dict[str, Any], tf_config: str) -> Any:
        self._socket.close()
        os.environ["TF_CONFIG"] = tf_config
        return loop(config) if inspect.signature(loop).parameters else loop()


class _Cluster:
    """One start of the cluster: its actors, what the driver waits on, and how it ends."""

    def __init__(self, sizes: _Sizes, env: dict[str, str], prefix: str) -> None:
        # Actors named "<run name>:<restarts>:<job>:<index>", as the dashboard lists them.
        self._sizes, self._prefix = sizes, prefix
        # Intra-op only: with one inter-op thread a worker deadlocks creating its iterator (tf.data's
        # multi-device iterator waits in that pool for work queued behind itself).
        worker_env = {**env, "TF_NUM_INTRAOP_THREADS": str(_threads(sizes.cpus_per_worker))}
        self._worker_options = {"num_cpus": sizes.cpus_per_worker, "runtime_env": {"env_vars": worker_env}}
        ps_options = {"num_cpus": sizes.cpus_per_ps, "runtime_env": {"env_vars": env}, "scheduling_strategy": "SPREAD"}
        self._chief = _actor(_Chief, **self._worker_options, name=f"{prefix}:chief:0").remote()
        self._ps = [_actor(_Task, **ps_options, name=f"{prefix}:ps:{i}").remote() for i in range(sizes.ps)]
        self._workers = [_actor(_Task, **self._worker_options, name=f"{prefix}:worker:{i}").remote()
                         for i in range(sizes.workers)]
        self._spares: list[Any] = []
        self._spec: dict[str, list[str]] = {}
        self._nodes: list[str] = []

    def _within_timeout(self, refs: list[Any], what: str) -> list[Any]:
        """``ray.get(refs)``, or ``StallError`` once, for the stall timeout, none of them came back
        and less than a task's CPUs were free: then other jobs hold the CPUs they wait for. Actors that
        were placed but start slowly (TensorFlow's import on a busy node) are waited for."""
        seconds = progress.stall_timeout()
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=seconds)
            free = ray.available_resources().get("CPU", 0.0)
            least = min(self._sizes.cpus_per_worker, self._sizes.cpus_per_ps)
            if pending and not ready and free < least:
                raise StallError(
                    f"ps_trainer: {what} did not start in {seconds:g} s with {free:g} of the cluster's "
                    f"{ray.cluster_resources().get('CPU', 0.0):g} CPUs free (other jobs hold them); pass a smaller "
                    "ps_trainer(cpus_per_worker=..., cpus_per_ps=...), or set_stall_timeout(None) for a cluster "
                    "that is autoscaling")
        return ray.get(refs)

    def run(self, loop: Callable[..., Any], config: dict[str, Any]) -> Any:
        tasks = [self._chief, *self._ps, *self._workers]
        found = self._within_timeout([t.address.remote() for t in tasks], "the cluster's tasks")
        addresses = [a for a, _ in found]
        self._nodes = [n for _, n in found[1 + len(self._ps):]]
        cluster = {"chief": addresses[:1], "ps": addresses[1:1 + len(self._ps)],
                   "worker": addresses[1 + len(self._ps):]}
        self._spec = cluster
        threads = {"ps": _threads(self._sizes.cpus_per_ps), "worker": _threads(self._sizes.cpus_per_worker)}
        roles = [("ps", i) for i in range(len(self._ps))] + [("worker", i) for i in range(len(self._workers))]
        self._within_timeout([t.start.remote(cluster, job, i, threads[job])
                              for t, (job, i) in zip(tasks[1:], roles, strict=True)], "the cluster's servers")
        waiting = {t.join.remote(): role for t, role in zip(tasks[1:], roles, strict=True)}
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        result = self._chief.run.remote(loop, config, tf_config)
        waiting[result] = ("chief", 0)
        while True:
            [ready], _ = ray.wait(list(waiting), num_returns=1)
            job, index = waiting.pop(ready)
            if job == "worker":
                waiting[self._replace_worker(index)] = (job, index)
                continue
            try:
                value = ray.get(ready)
            except RayTaskError as e:
                raise _Lost(f"the training function raised {type(e.cause).__name__}: {e.cause}", e.cause) from None
            except ray.exceptions.RayError as e:
                raise _Lost(f"{_role(job, index)} at {cluster[job][index]} stopped ({type(e).__name__})", e) from None
            if job == "chief":
                return value
            raise _Lost(f"{_role(job, index)} at {cluster[job][index]} stopped", None)

    def _replace_worker(self, index: int) -> Any:
        """A new worker ``index`` on the lost one's node, at its address, where TensorFlow's coordinator finds
        it again; the new server's ``join`` reference."""
        address = self._spec["worker"][index]
        logger.warning("ps_trainer: worker %d at %s stopped; starting it again there (TensorFlow's coordinator "
                       "runs its steps on the other workers meanwhile)", index, address)
        on_node = NodeAffinitySchedulingStrategy(self._nodes[index], soft=False)
        port = int(address.rsplit(":", 1)[1])
        task = _actor(_Task, **self._worker_options, scheduling_strategy=on_node,
                      name=f"{self._prefix}:worker:{index}:{len(self._spares) + 1}").remote(port)
        self._spares.append(task)
        threads = _threads(self._sizes.cpus_per_worker)
        try:
            self._within_timeout([task.start.remote(self._spec, "worker", index, threads)],
                                 f"worker {index}'s replacement")
        except (StallError, ray.exceptions.RayError) as e:
            raise _Lost(f"worker {index} at {address} stopped and could not start again there ({type(e).__name__})",
                        e) from None
        self._workers[index] = task
        return task.join.remote()

    def stop(self) -> None:
        for task in [self._chief, *self._ps, *self._workers, *self._spares]:
            ray.kill(task, no_restart=True)


def _reserve(port: int) -> socket.socket:
    """A socket bound to ``port`` (0: any free one). A replacement takes its lost worker's port: the lost
    server's connections linger in TIME_WAIT for a minute (SO_REUSEADDR binds past them, as gRPC's own
    servers do), and its process may still be exiting when Ray reports it dead (so a short wait)."""
    reserved = socket.socket()
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + _PORT_WAIT_S
    while True:
        try:
            reserved.bind(("", port))
            return reserved
        except OSError as e:
            if not port or e.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                reserved.close()
                raise
            time.sleep(0.5)


def _actor(cls: type, **options: Any) -> Any:
    """``cls`` as a Ray actor class with ``options`` (typed loosely: mypy does not follow ``.remote``)."""
    return ray.remote(cls).options(**options)


def _role(job: str, index: int) -> str:
    return {"ps": f"parameter server {index}", "chief": "the chief"}.get(job, f"{job} {index}")
