"""Distributed TensorFlow training on Ray Train, fed by ``ray_tfrecord`` datasets.

``tensorflow_trainer`` builds a ``TensorflowTrainer`` with what TensorFlow
needs on the workers; inside the training function, ``restore`` and
``ReportCheckpoint`` make checkpointing and resuming after a worker
failure a two-line affair.

Ray's TensorFlow backend sets up ``MultiWorkerMirroredStrategy`` for legacy
Keras (``tf-keras``), but it sets ``TF_USE_LEGACY_KERAS`` only after the worker
process may already have imported TensorFlow, where Keras 3 then fails with a
``PerReplica`` ValueError.  The trainer built here puts the variable in the
workers' runtime environment instead, so it is there before any import, and
checks on every worker, before the training function runs, that ``tf.keras``
is the Keras asked for (``KerasVersionError`` otherwise).  Its backend
(``io/train_setup.py``) writes the workers' ``TF_CONFIG`` as Ray's does, leaves
the variable alone, and keeps TensorFlow out of Ray Train's controller and
dataset manager.  With
``keras=3`` the workers get Keras 3 instead, for custom training loops:
Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy`` fails
(keras-team/keras#20585).

Example (run with ``python example.py``)::

    import pyarrow as pa
    import ray
    from ray_tfrecord.tf import ReportCheckpoint, restore, tensorflow_trainer, tf_dataset

    def loop(config):
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        start = restore(model)
        feed = tf_dataset(ray.train.get_dataset_shard("train"),
                          feature_columns="x", label_columns="y", batch_size=8)
        model.fit(feed, epochs=config["epochs"], initial_epoch=start,
                  callbacks=[ReportCheckpoint()], verbose=0)

    ray.init(num_cpus=2)
    ds = ray.data.from_arrow(pa.table({
        "x": pa.FixedSizeListArray.from_arrays(pa.array([i / 64 for i in range(64)], pa.float32()), 1),
        "y": pa.array([2 * i / 64 for i in range(64)], pa.float32()),
    }))
    result = tensorflow_trainer(loop, datasets={"train": ds}, num_workers=2,
                                cpus_per_worker=0.5, train_loop_config={"epochs": 2},
                                storage_path="/tmp/ray_tfrecord_runs").fit()
    print(result.metrics)
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, Literal, cast

import ray
import ray.train
from ray.data import Dataset
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat, progress
from ray_tfrecord._src.tf.lint import warn_constant_length_lists
from ray_tfrecord._src.tf.train_setup import IngestConfig, TensorflowBackendConfig

#: Environment every tf-keras (``keras=2``) training worker needs before it imports TensorFlow.
WORKER_ENV_VARS: Mapping[str, str] = {"TF_USE_LEGACY_KERAS": "1"}

_KERAS_ISSUE = "Keras 3 model.fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585)"


@public("ray_tfrecord.tf")
class KerasVersionError(RuntimeError):
    """A training worker's ``tf.keras`` is not the Keras that ``tensorflow_trainer(keras=)`` asked for."""


@public("ray_tfrecord.tf")
def tensorflow_trainer(
    train_loop_per_worker: Callable[[dict[str, Any]], None],
    *,
    datasets: Mapping[str, Dataset],
    num_workers: int | tuple[int, int],
    train_loop_config: Mapping[str, Any] | None = None,
    cpus_per_worker: float = 1.0,
    use_gpu: bool = False,
    storage_path: str | None = None,
    name: str | None = None,
    max_failures: int = 0,
    checkpoints_to_keep: int | None = 2,
    env_vars: Mapping[str, str] | None = None,
    keras: Literal[2, 3] = 2,
    tensorboard: bool = False,
) -> TensorflowTrainer:
    """A ``TensorflowTrainer`` wired for ``ray_tfrecord`` datasets.

    Every dataset is split across the workers with
    ``streaming_split(num_workers, equal=True)``, so each worker's shard has the
    same row count and [`tf_dataset`][ray_tfrecord.tf.tf_dataset] gives every rank the
    same number of batches.  A numeric ``list<T>`` column whose sampled rows
    all hold the same count gets a warning naming how to read it as a dense
    tensor (Keras ``Dense`` refuses the ragged one); the sample runs the
    pipeline up to its first rows on the driver (only datasets with such
    columns).  Ray is started if it is not running yet, to size the
    workers against the cluster's CPUs.  Workers get ``TF_USE_LEGACY_KERAS``
    (``1`` for ``keras=2``, ``0`` for ``keras=3``), and TensorFlow's intra- and
    inter-op thread pools sized to ``cpus_per_worker`` (at least 1;
    ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``), through their
    runtime environment; ``env_vars`` overrides any of them.

    Args:
        train_loop_per_worker: Runs on every worker with ``train_loop_config``;
            read data with ``ray.train.get_dataset_shard(name)``.
        datasets: Ray datasets by name, e.g. ``{"train": read_tfrecords(...)}``.
        num_workers: Training workers (one TensorFlow process each), or a
            ``(min, max)`` range for an elastic group: Ray Train starts with
            as many workers as the cluster has room for, at least ``min``,
            restarts with fewer when a node is lost and grows toward ``max``
            when nodes are added, each time from the latest checkpoint (give
            ``max_failures`` room for the losses).  A
            [`ResumableFeed`][ray_tfrecord.tf.ResumableFeed] continues its epoch
            at any group size, every row once.  Needs a Ray whose Train has
            elastic scaling (2.58 and 2.60 have it).
        train_loop_config: Passed to ``train_loop_per_worker``.
        cpus_per_worker: CPUs reserved per worker; fractions let several workers
            share a small machine while Ray Data keeps CPUs for reading.
        use_gpu: Reserve one GPU per worker.
        storage_path: Where checkpoints and results go; must be shared storage
            (e.g. ``s3://...``) on a multi-node cluster.
        name: Run name; rerunning with the same name and storage path resumes
            from that run's latest checkpoint.
        max_failures: Worker-group failures to recover from, each time from the
            latest reported checkpoint (-1: unlimited).
        checkpoints_to_keep: Most recent checkpoints kept on storage
            (``None`` keeps all).
        env_vars: Extra environment variables for the workers (they win over
            the defaults above).
        keras: Which Keras ``tf.keras`` is on the workers: ``2``, tf-keras, for
            ``model.fit`` under ``MultiWorkerMirroredStrategy`` and
            [`ReportCheckpoint`][ray_tfrecord.tf.ReportCheckpoint]; ``3``, Keras 3, for a custom training loop
            (``strategy.run`` over ``tf_dataset(..., strategy=strategy)``), since
            Keras 3 ``fit`` fails under that strategy (keras-team/keras#20585).
            Every worker checks it before ``train_loop_per_worker`` runs and
            raises [`KerasVersionError`][ray_tfrecord.tf.KerasVersionError] naming the fix when it differs.
        tensorboard: Keep TensorBoard logs under the run's storage path
            (``<storage_path>/<name>/tensorboard``) and print one line saying how
            to open them; the training function adds
            [`TensorBoard`][ray_tfrecord.tf.TensorBoard] to ``fit``'s
            callbacks, which writes there (the chief's logs).

    Raises:
        StallError: if the workers would reserve so many of the cluster's CPUs
            that less than one CPU remains for the datasets' read
            tasks, which Ray would then never schedule: training would wait
            at its first step forever.  The message names the
            ``cpus_per_worker`` that fits; for a range, the check is of
            ``min`` workers.
        ValueError: if ``keras`` is not 2 or 3, or if
            ``num_workers`` is neither a positive int nor a ``(min, max)``
            range with ``1 <= min <= max``.
        RuntimeError: for a range on a Ray without elastic scaling.
    """
    if keras not in (2, 3):
        raise ValueError(f"tensorflow_trainer: keras={keras!r}; pass keras=2 (tf-keras) or keras=3 (Keras 3)")
    if not compat.train_v2_enabled():
        raise RuntimeError(f"tensorflow_trainer: {compat.TRAIN_V2_MESSAGE}")
    smallest = _smallest_group(num_workers)
    # Also without datasets: a ResumableFeed's ranks start their own read tasks.
    _check_cpus_left_for_reads(smallest, cpus_per_worker)
    for ds in datasets.values():
        warn_constant_length_lists(ds)
    # worker_runtime_env: ray.train.RunConfig is Train v2's (the default) at runtime, v1's to mypy.
    run_config = RunConfig(  # type: ignore[call-arg]
        name=name,
        storage_path=storage_path,
        failure_config=FailureConfig(max_failures=max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=checkpoints_to_keep),
    )
    worker_env = _worker_env(cpus_per_worker, keras)
    if tensorboard:
        # Here, not at the top: it imports tf_keras, which must not load in a Keras 3 worker.
        from ray_tfrecord._src.tf import tensorboard_logs

        # RunConfig names the run (a timestamp) and the storage (~/ray_results) when the caller did not.
        log_dir = tensorboard_logs.run_log_dir(str(run_config.storage_path), str(run_config.name))
        worker_env[tensorboard_logs.TENSORBOARD_DIR_ENV] = log_dir
        tensorboard_logs.announce(log_dir)
    run_config.worker_runtime_env = {"env_vars": {**worker_env, **(env_vars or {})}}  # type: ignore[attr-defined]
    return TensorflowTrainer(
        _checked_loop(train_loop_per_worker, keras),
        train_loop_config=dict(train_loop_config or {}),
        # Ray's TensorflowConfig, from a module that does not import TensorFlow into Ray Train's controller.
        tensorflow_config=TensorflowBackendConfig(),  # type: ignore[arg-type]
        # A (min, max) range: ray.train.ScalingConfig is Train v2's at runtime, v1's to mypy.
        scaling_config=ScalingConfig(
            num_workers=num_workers,  # type: ignore[arg-type]
            use_gpu=use_gpu,
            resources_per_worker={"CPU": cpus_per_worker},
        ),
        dataset_config=IngestConfig(progress_bars=sys.stdout.isatty()),
        run_config=run_config,
        datasets=dict(datasets),
    )


def _smallest_group(num_workers: object) -> int:
    """The fewest workers ``num_workers`` allows, after checking it is an int or an elastic range."""
    if isinstance(num_workers, int) and not isinstance(num_workers, bool):
        if num_workers < 1:
            raise ValueError(f"tensorflow_trainer: num_workers={num_workers!r}; pass at least 1 worker, or a "
                             "range num_workers=(min, max)")
        return num_workers
    elastic = (isinstance(num_workers, tuple) and len(num_workers) == 2
               and all(isinstance(n, int) and not isinstance(n, bool) for n in num_workers))
    if not elastic:
        raise ValueError(f"tensorflow_trainer: num_workers={num_workers!r}; pass a number of workers or an "
                         "elastic range num_workers=(min, max) of two ints")
    low, high = cast(tuple[int, int], num_workers)
    if not 1 <= low <= high:
        fix = (max(1, min(low, high)), max(1, low, high))
        raise ValueError(f"tensorflow_trainer: num_workers={num_workers!r} is not a range of group sizes; pass "
                         f"(min, max) with 1 <= min <= max, e.g. num_workers={fix!r}")
    if not compat.elastic_training():
        raise RuntimeError(f"tensorflow_trainer: num_workers={num_workers!r} asks for an elastic group, and Ray "
                           f"{ray.__version__}'s Train has no elastic scaling; upgrade Ray (pip install -U "
                           f"'ray[train]') or pass a fixed num_workers={high}")
    return low


def _worker_env(cpus_per_worker: float, keras: int) -> dict[str, str]:
    """The Keras switch plus TensorFlow's thread pools sized to the worker's CPU share.

    TensorFlow sizes both pools to the whole machine; workers holding a fraction
    of it then contend with each other and with the read tasks they wait on
    (``make bench``, Ray Train, Keras fit on dense columns: 402k -> 527k rows/s).
    ``TF_USE_LEGACY_KERAS=0`` rather than none for Keras 3: a ``1`` inherited
    from the nodes' environment would otherwise win.
    """
    threads = str(max(1, math.floor(cpus_per_worker)))
    legacy = WORKER_ENV_VARS if keras == 2 else {"TF_USE_LEGACY_KERAS": "0"}
    return {**legacy, "TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": threads}


def _checked_loop(loop: Callable[..., None], keras: int) -> Callable[..., None]:
    """``loop``, after a check that this worker's ``tf.keras`` is ``keras``; Ray Train reads the
    signature through ``functools.wraps`` and passes the config only if ``loop`` takes one."""

    @functools.wraps(loop)
    def checked(*config: dict[str, Any]) -> None:
        _check_worker_keras(keras)
        loop(*config)

    return checked


def _check_worker_keras(keras: int) -> None:
    """Raise KerasVersionError, naming the fix, unless ``tf.keras`` here is tf-keras (2) or Keras 3 (3)."""
    if keras == 2 and not _tf_keras_installed():
        raise KerasVersionError(
            f"tensorflow_trainer(keras=2): tf_keras is not installed on this worker, so tf.keras would be "
            f"Keras 3, and {_KERAS_ISSUE}; pip install tf-keras on every node, or pass keras=3 and train "
            "with a custom loop"
        )
    import tensorflow as tf

    legacy = tf.keras.__name__.startswith("tf_keras")
    if keras == 2 and not legacy:
        raise KerasVersionError(
            f"tensorflow_trainer(keras=2): tf.keras on this worker is Keras {tf.keras.__version__}, not tf-keras "
            f"(TF_USE_LEGACY_KERAS was not 1 when TensorFlow was imported), and {_KERAS_ISSUE}; drop "
            "TF_USE_LEGACY_KERAS from env_vars=, or pass keras=3 and train with a custom loop"
        )
    if keras == 3 and legacy:
        raise KerasVersionError(
            "tensorflow_trainer(keras=3): tf.keras on this worker is tf-keras (TF_USE_LEGACY_KERAS was 1 when "
            "TensorFlow was imported); drop TF_USE_LEGACY_KERAS from env_vars=, or pass keras=2 for tf-keras"
        )


def _tf_keras_installed() -> bool:
    try:
        import_module("tf_keras")  # tf.keras has imported it already wherever it is installed
    except ImportError:
        return False
    return True


def _check_cpus_left_for_reads(num_workers: int, cpus_per_worker: float) -> None:
    """Refuse a worker reservation that leaves the read tasks no CPU.

    Ray Train places the workers before Ray Data starts reading, and Ray Data's
    tasks then wait for a CPU that never frees up; the only sign is a warning
    line from Ray.  Failing here, with the numbers that fit, is better than
    quietly shrinking the reservation the caller asked for.
    """
    if not ray.is_initialized():
        # What fit() would do anyway; the check needs to know the cluster.
        ray.init()
    progress.preflight("tensorflow_trainer", [progress.Holder("training workers", num_workers, cpus_per_worker)],
                       fix="tensorflow_trainer(cpus_per_worker={cpus})")
