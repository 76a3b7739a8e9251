"""The one place this package touches Ray's private internals, and its one Ray version switch.

It is a public module of the package (no underscore) because the tf layer needs the Ray Train
and actor-pool switches too; it is not part of the user-facing API.

Supported: Ray 2.50 (October 2025) to ``NEWEST_TESTED_RAY``, both ends tested (`make test` at the
newest, `make test-lowest` at the floor pinned in ``.ci/lowest-constraints.txt``). Everything else in
the package imports public Ray names only; what is here has no public counterpart, and each name says
which public API it stands in for. A private name that a Ray release removes costs its feature, with
one warning, never the import: the fallback beside each name says what is lost.

Raising the newest tested Ray (one line): install the new release in ``.venv``, run ``make test``,
and when it passes set ``NEWEST_TESTED_RAY`` to its minor version.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow.fs as pafs
import ray
from ray.data.context import DataContext
from ray.data.datasource import Partitioning, PartitionStyle, PathPartitionParser

from ray_tfrecord._src.core import options

#: The newest Ray minor release ``make test`` has passed on (see the module docstring to raise it).
NEWEST_TESTED_RAY = (2, 60)
#: The floor, pyproject.toml's ``ray>=`` (tests/test_versions.py checks they agree).
OLDEST_SUPPORTED_RAY = (2, 50)


def _minor(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


RAY_VERSION = _minor(ray.__version__)

#: The version switch: Ray 2.60 bundles a write task's input blocks by ``Datasink.min_bytes_per_write``;
#: earlier releases ignore that property and honour only ``min_rows_per_write`` (one file per block
#: otherwise), so the datasink turns its byte target into a row target itself (``io/datasink.py``).
RAY_BUNDLES_WRITES_BY_BYTES = RAY_VERSION >= (2, 60)


#: Whether Ray's Hive ``PathPartitionParser`` URL-decodes values (2.52+), as this package's writer and pyarrow
#: encode them; on 2.50-2.51 the reader decodes them itself (``io/partitioning.py``). Probed, not versioned.
HIVE_PARSER_DECODES = PathPartitionParser(Partitioning(PartitionStyle.HIVE))("k=%2F/f") == {"k": "/"}


def untested_ray_message(version: str) -> str | None:
    """The warning for a Ray release newer than the newest tested, ``None`` for a tested one."""
    if _minor(version) <= NEWEST_TESTED_RAY:
        return None
    oldest, newest = (".".join(map(str, v)) for v in (OLDEST_SUPPORTED_RAY, NEWEST_TESTED_RAY))
    return (f"ray_tfrecord is tested with Ray {oldest} to {newest}; Ray {version} is newer and untested. "
            f"If reads or writes fail, install 'ray<={newest}.*' and report the failure.")


def _private(modules: tuple[str, ...], name: str, loss: str) -> Any:
    """``name`` from the first of ``modules`` that has it, or ``None`` and one warning saying which
    feature is lost without it."""
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    warnings.warn(f"Ray {ray.__version__} has no {name}: {loss}", stacklevel=2)
    return None


# Ray counts a column-less Arrow table as empty; a column of this name carries the row count of a batch
# whose columns were all projected away (``Dataset.count()``), and Ray drops it again. No public constant
# or "row-count-only block" API exists; Ray 2.50 keeps it in its Parquet reader.
ROW_COUNT_STUB_COLUMN: str = _private(
    ("ray.data._internal.arrow_block", "ray.data._internal.datasource.parquet_datasource"),
    "_BATCH_SIZE_PRESERVING_STUB_COL_NAME",
    "a read that projects every column away shows a '__row_count' column",
) or "__row_count"

# Ray Data's save modes: public (``ray.data.SaveMode``) from Ray 2.52, in a private module before.
try:
    from ray.data import SaveMode
except ImportError:  # Ray 2.50, 2.51
    from ray.data._internal.savemode import SaveMode  # type: ignore[no-redef]  # noqa: F401 (the datasink's)

# The context Ray passes to ``Datasink.write``; the public ``Datasink.write`` signature names it but Ray
# exports it from no public module. Only a type here, so nothing is lost without it.
try:
    from ray.data._internal.execution.interfaces import TaskContext
except ImportError:  # pragma: no cover - a type annotation only
    TaskContext = Any  # type: ignore[misc,assignment]

# The key under which a write task's context carries the write's id, which Ray's file datasinks pass to
# ``FilenameProvider.get_filename_for_task``; no public accessor exists.
_WRITE_UUID_KEY = _private(("ray.data._internal.planner.plan_write_op",), "WRITE_UUID_KWARG_NAME",
                           "a FilenameProvider gets the staging directory's id instead of Ray's write id")

# The filesystem wrapper that retries ``DataContext.retried_io_errors``, the retry behaviour every built-in
# Ray reader and writer has; Ray offers no public way to get it.
_RetryingPyFileSystem = _private(("ray.data._internal.util",), "RetryingPyFileSystem",
                                 "transient filesystem errors (DataContext.retried_io_errors) are not retried")

# pyarrow's S3FileSystem needs ``pyarrow.fs`` imported before it is unpickled in a worker; Ray's file-based
# readers wrap it for shipping in read tasks. Not public.
_S3_MODULE = ("ray.data.datasource.file_based_datasource",)
_s3_loss = "an S3 filesystem may fail to unpickle in read tasks"
_wrap_s3 = _private(_S3_MODULE, "_wrap_s3_serialization_workaround", _s3_loss)
_unwrap_s3 = _private(_S3_MODULE, "_unwrap_s3_serialization_workaround", _s3_loss) if _wrap_s3 else None

# How every Ray reader turns user paths into (normalised paths, inferred filesystem), including schemes like
# ``local://`` and ``s3://`` with default credentials. Not public.
_resolve_paths = _private(("ray.data.datasource.path_util",), "_resolve_paths_and_filesystem",
                          "paths resolve with pyarrow.fs.FileSystem.from_uri (no local:// or cloud defaults)")

_LOCAL_SCHEME = "local://"


def is_local_scheme(paths: list[str]) -> bool:
    """Whether ``paths`` use Ray's ``local://`` scheme, whose tasks Ray runs on the driver's node (as Ray's
    readers decide it: all of them or none)."""
    local = [p.startswith(_LOCAL_SCHEME) for p in paths]
    if any(local) and not all(local):
        raise ValueError(f"paths must all use {_LOCAL_SCHEME} or none of them; got {paths}")
    return bool(local) and all(local)


def has_file_extension(path: str, extensions: list[str]) -> bool:
    """Ray's readers' extension test: case-insensitive, leading dot optional."""
    lowered = path.lower()
    return any(lowered.endswith("." + e.lower().lstrip(".")) for e in extensions)


def resolve_paths(paths: list[str], filesystem: pafs.FileSystem | None) -> tuple[list[str], pafs.FileSystem]:
    """``paths`` normalised, and the filesystem they are on (``filesystem`` when given)."""
    if _resolve_paths is not None:
        return _resolve_paths(paths, filesystem)
    if filesystem is None:
        filesystem, _ = pafs.FileSystem.from_uri(paths[0] if "://" in paths[0] else os.path.abspath(paths[0]))
    out = []
    for p in paths:
        out.append(pafs.FileSystem.from_uri(p)[1] if "://" in p else os.path.abspath(p))
    return out, filesystem


def write_uuid(ctx: Any) -> str | None:
    """The id Ray gives one write (the same in all its tasks), for a ``FilenameProvider``; ``None``
    when ``Datasink.write`` is called outside Ray's write operator."""
    return ctx.kwargs.get(_WRITE_UUID_KEY) if _WRITE_UUID_KEY else None


def data_context() -> DataContext:
    """``DataContext.get_current()``. The call that creates the context (the first in a process) makes Ray
    2.60 warn about its own deprecated fields (``use_push_based_shuffle``, ``use_polars``,
    ``use_arrow_tensor_v2``: its constructor sets them); those warnings say nothing about the caller's
    code, so they are not shown when that first call is ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.data\.context")
        return DataContext.get_current()


def retrying_filesystem(fs: pafs.FileSystem) -> pafs.FileSystem:
    """``fs`` retrying the errors listed in ``DataContext.retried_io_errors``."""
    if _RetryingPyFileSystem is None:
        return fs
    return _RetryingPyFileSystem.wrap(fs, retryable_errors=data_context().retried_io_errors)


def unwrap_filesystem(fs: pafs.FileSystem) -> pafs.FileSystem:
    """The filesystem under Ray's retrying wrapper (to test its type)."""
    return fs.unwrap() if _RetryingPyFileSystem and isinstance(fs, _RetryingPyFileSystem) else fs


def pickleable_filesystem(fs: pafs.FileSystem) -> Any:
    """``fs`` made safe to ship in a task; undo with ``unpickled_filesystem``."""
    return _wrap_s3(fs) if _wrap_s3 else fs


def unpickled_filesystem(shipped: Any) -> pafs.FileSystem:
    return _unwrap_s3(shipped) if _unwrap_s3 else shipped


def execution_index(context: DataContext | None) -> int:
    """How many times this dataset has been executed before, which ``FileShuffleConfig.get_seed`` takes to
    reseed per execution. Ray 2.54+ passes the context to ``Datasource.get_read_tasks`` but keeps the
    counter in a private attribute; before 2.54 there is none (every execution counts as the first)."""
    return getattr(context, "_execution_idx", 0) if context is not None else 0


def shuffle_seed(config: Any, execution_idx: int) -> int | None:
    """The seed of a ``FileShuffleConfig`` for one execution: ``get_seed`` from Ray 2.54, the plain
    seed before (those releases have no per-execution reseeding)."""
    get_seed = getattr(config, "get_seed", None)
    return get_seed(execution_idx) if get_seed is not None else config.seed




def ray_call_args(func: Callable[..., Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's options (``None`` meaning not given) as keywords for the Ray call ``func``: what its
    signature names passes as given, so that Ray's own defaults and deprecation warnings apply; Ray task
    options it does not name go into its ``ray_remote_args``, merged over the caller's: ``read_datasource``
    names them from Ray 2.59 (2.60 deprecates them in ``ray_remote_args``, to be removed in 2.64); earlier
    releases, and ``Dataset.write_datasink`` in all, take them inside ``ray_remote_args`` only."""
    params = inspect.signature(func).parameters
    given = {k: v for k, v in given.items() if v is not None}
    out = {k: v for k, v in given.items() if k in params}
    folded = {k: v for k, v in given.items() if k not in params}
    unknown = sorted(set(folded) - options.RAY_TASK_OPTIONS)
    if unknown:
        raise TypeError(f"Ray {ray.__version__} does not take {', '.join(unknown)}; upgrade Ray or leave it out")
    if folded:
        out["ray_remote_args"] = {**(given.get("ray_remote_args") or {}), **folded}
    return out


def actor_pool_args(size: int) -> dict[str, Any]:
    """``Dataset.map_batches`` keywords for a pool of ``size`` actors: ``compute=ActorPoolStrategy`` from
    Ray 2.51 (which deprecates ``concurrency=`` for it), ``concurrency=`` on 2.50 (which deprecates
    ``compute=``)."""
    if RAY_VERSION >= (2, 51):
        return {"compute": ray.data.ActorPoolStrategy(size=size)}
    return {"concurrency": size}


#: Why ``train_v2_enabled`` is false, in the caller's terms.
TRAIN_V2_MESSAGE = (f"Ray {ray.__version__} runs Ray Train v1, and ray_tfrecord's trainer needs v2: set "
                    "RAY_TRAIN_V2_ENABLED=1 in the environment before Ray starts (the default from Ray 2.51)")


def train_v2_enabled() -> bool:
    """Whether ``ray.train.RunConfig`` is Ray Train v2's, which takes ``worker_runtime_env`` (where the
    trainer puts ``TF_USE_LEGACY_KERAS`` before TensorFlow is imported): the default from Ray 2.51, behind
    ``RAY_TRAIN_V2_ENABLED=1`` on 2.50."""
    from ray.train import RunConfig

    return "worker_runtime_env" in inspect.signature(RunConfig).parameters


def tensorflow_framework() -> Any:
    """Ray Train's label for a TensorFlow run (``TrainingFramework.TENSORFLOW``, private: in Ray 2.60, not
    2.50), which its run state shows; ``None`` on a Ray without it, where no backend has a label."""
    try:
        from ray.train.v2._internal.util import TrainingFramework
    except ImportError:
        return None
    return TrainingFramework.TENSORFLOW


def elastic_training() -> bool:
    """Whether Ray Train grows and shrinks a worker group within ``ScalingConfig(num_workers=(min, max))``
    (Ray Train v2's elastic scaling: in Ray 2.58 and 2.60; probed, not versioned). Without it, a tuple
    would reach a ``ScalingConfig`` that takes only an int."""
    from ray.train import ScalingConfig

    return hasattr(ScalingConfig, "elasticity_enabled")


_untested = untested_ray_message(ray.__version__)
if _untested:
    warnings.warn(_untested, stacklevel=2)


# Ray 2.60's job checkpointing (``DataContext.checkpoint_config``, public) records a write task's ids in two
# phases only for subclasses of its private ``_FileDatasink`` (ids pending before the task writes, committed
# after it returns, and on a rerun the data files named after a pending record deleted); any other sink gets
# post-write checkpointing, which loses every row a staged sink has not committed when the job is killed.
# TFRecordDatasink derives from ``_FileDatasink`` where that two-phase path exists, and raises if a release has
# checkpointing without it. ``_pending_checkpoints`` (no public accessor) is where a write task's context holds
# the pending records the task must make its files visible before returning for.
def _probe_checkpoints() -> tuple[type, str | None]:
    from ray.data.datasource import Datasink

    if not hasattr(DataContext, "checkpoint_config"):
        return Datasink, None
    try:
        two_phase = importlib.import_module("ray.data._internal.planner.checkpoint.plan_write_op")
        plan_write = importlib.import_module("ray.data._internal.planner.plan_write_op")
        base = importlib.import_module("ray.data.datasource.file_datasink")._FileDatasink
        key = plan_write.PENDING_CHECKPOINTS_KWARG_NAME
        two_phase._generate_prepare_checkpoint_transform  # noqa: B018 - the path TFRecordDatasink relies on
    except (ImportError, AttributeError):
        return Datasink, None
    return base, key


FileDatasinkBase, _PENDING_CHECKPOINTS_KEY = _probe_checkpoints()
#: Whether Ray has job checkpointing that a TFRecord write can take part in (two-phase, per write task).
CHECKPOINTS = _PENDING_CHECKPOINTS_KEY is not None


def checkpoint_config(context: DataContext | None = None) -> Any:
    """The ``CheckpointConfig`` of ``context`` (default: the current one), ``None`` when checkpointing is off
    or Ray has none. Raises ``ValueError`` on a Ray whose checkpointing would record ids before a TFRecord
    write commits its files."""
    config = getattr(context or data_context(), "checkpoint_config", None)
    if config is not None and not CHECKPOINTS:
        raise ValueError(f"Ray {ray.__version__}'s checkpoint_config records a write task's ids before "
                         "write_tfrecords makes its files visible, so a killed job would lose rows; upgrade to Ray "
                         "2.60 or set DataContext.checkpoint_config = None")
    return config


def checkpoint_started(config: Any) -> bool:
    """Whether the checkpoint ``config`` names holds records (pending or committed): a run of its job
    has written, and a rerun continues it."""
    from ray.data.datasource.path_util import _unwrap_protocol

    selector = pafs.FileSelector(_unwrap_protocol(config.checkpoint_path), allow_not_found=True)
    return any(e.is_file for e in config.filesystem.get_file_info(selector))


def task_checkpoints_pending(ctx: Any) -> bool:
    """Whether Ray holds pending checkpoint records for this write task, which it commits when the task
    returns: the task's files must be visible by then."""
    kwargs = getattr(ctx, "kwargs", None) or {}
    return bool(_PENDING_CHECKPOINTS_KEY and kwargs.get(_PENDING_CHECKPOINTS_KEY))
