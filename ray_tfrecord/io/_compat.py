"""The one place this package touches Ray Data's private internals.

Everything else imports public Ray names only (``ray.data.SaveMode``,
``ray.data.datasource.Partitioning`` and friends); what is here has no public
counterpart in Ray 2.x, and each name says which public API it stands in for, so a
Ray upgrade that breaks one breaks it here and nowhere else. Tests that need one of
these names import it from here too.
"""

from __future__ import annotations

import pyarrow.fs as pafs

# Ray counts a column-less Arrow table as empty; a column of this name carries the row
# count of a batch whose columns were all projected away, and Ray drops it again. No
# public constant or "row-count-only block" API exists.
from ray.data._internal.arrow_block import _BATCH_SIZE_PRESERVING_STUB_COL_NAME as ROW_COUNT_STUB_COLUMN

# The context Ray passes to ``Datasink.write``; the public ``Datasink.write`` signature
# names it but Ray exports it from no public module.
from ray.data._internal.execution.interfaces import TaskContext

# The key under which a write task's context carries the write's id, which Ray's file datasinks pass
# to ``FilenameProvider.get_filename_for_task``; no public accessor exists.
from ray.data._internal.planner.plan_write_op import WRITE_UUID_KWARG_NAME

# The filesystem wrapper that retries ``DataContext.retried_io_errors``, the retry
# behaviour every built-in Ray reader and writer has; Ray offers no public way to get it.
from ray.data._internal.util import RetryingPyFileSystem, _is_local_scheme
from ray.data.context import DataContext

# pyarrow's S3FileSystem needs ``pyarrow.fs`` imported before it is unpickled in a
# worker; Ray's file-based readers wrap it for shipping in read tasks. Not public.
from ray.data.datasource.file_based_datasource import (
    _unwrap_s3_serialization_workaround,
    _wrap_s3_serialization_workaround,
)

# How every Ray reader turns user paths into (normalised paths, inferred filesystem),
# including schemes like ``local://`` and ``s3://`` with default credentials; and its
# extension test (case-insensitive, leading dot optional). Neither is public.
from ray.data.datasource.path_util import _has_file_extension, _resolve_paths_and_filesystem

__all__ = [
    "ROW_COUNT_STUB_COLUMN",
    "TaskContext",
    "execution_index",
    "has_file_extension",
    "is_local_scheme",
    "pickleable_filesystem",
    "resolve_paths",
    "retrying_filesystem",
    "unpickled_filesystem",
    "unwrap_filesystem",
    "write_uuid",
]


resolve_paths = _resolve_paths_and_filesystem
has_file_extension = _has_file_extension
is_local_scheme = _is_local_scheme  # local:// paths: Ray runs their tasks on the driver's node


def write_uuid(ctx: TaskContext) -> str | None:
    """The id Ray gives one write (the same in all its tasks), for a ``FilenameProvider``; ``None``
    when ``Datasink.write`` is called outside Ray's write operator."""
    return ctx.kwargs.get(WRITE_UUID_KWARG_NAME)


def retrying_filesystem(fs: pafs.FileSystem) -> pafs.FileSystem:
    """``fs`` retrying the errors listed in ``DataContext.retried_io_errors``."""
    return RetryingPyFileSystem.wrap(fs, retryable_errors=DataContext.get_current().retried_io_errors)


def unwrap_filesystem(fs: pafs.FileSystem) -> pafs.FileSystem:
    """The filesystem under Ray's retrying wrapper (to test its type)."""
    return fs.unwrap() if isinstance(fs, RetryingPyFileSystem) else fs


def pickleable_filesystem(fs: pafs.FileSystem):
    """``fs`` made safe to ship in a task; undo with :func:`unpickled_filesystem`."""
    return _wrap_s3_serialization_workaround(fs)


def unpickled_filesystem(shipped) -> pafs.FileSystem:
    return _unwrap_s3_serialization_workaround(shipped)


def execution_index(context: DataContext | None) -> int:
    """How many times this dataset has been executed before, which
    ``FileShuffleConfig.get_seed`` takes to reseed per execution. Ray passes the context
    to ``Datasource.get_read_tasks`` but keeps the counter in a private attribute."""
    return context._execution_idx if context is not None else 0
