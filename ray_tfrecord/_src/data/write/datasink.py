"""Ray Data datasink writing TFRecord datasets with a staged, all-or-nothing commit.

Example:
    >>> import ray, ray_tfrecord
    >>> ds = ray.data.from_items([{"number": n % 3, "word": f"w{n}"} for n in range(9)])  # doctest: +SKIP
    >>> result = ray_tfrecord.write_tfrecords(  # doctest: +SKIP
    ...     ds, "/tmp/words", partition_cols=["number"], mode="overwrite")
    >>> result.num_rows  # doctest: +SKIP
    9

This module adapts the write to Ray Data: the driver side of the commit protocol
(``ray_tfrecord._src.data.write.commit``, which says what a concurrent reader sees) runs in
``on_write_start``/``on_write_complete``/``on_write_failed``, the file writers
(``ray_tfrecord._src.data.write.writers``) in ``write``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, Unpack

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from ray.data import Dataset
from ray.data.block import Block, BlockAccessor
from ray.data.context import DataContext
from ray.data.dataset import MaterializedDataset
from ray.data.datasource import Datasink, FilenameProvider, WriteResult

from ray_tfrecord._src.core import options, sizes
from ray_tfrecord._src.core.codec import RecordType
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat, filesystems, progress
from ray_tfrecord._src.data.compat import SaveMode
from ray_tfrecord._src.data.task_errors import from_task, task_cause
from ray_tfrecord._src.data.write import shards
from ray_tfrecord._src.data.write.commit import Commit, TFRecordWriteResult, checkpoint_file_base
from ray_tfrecord._src.data.write.commit.protocol import DEFAULT_KEEP_REPLACED_S
from ray_tfrecord._src.data.write.tf_schema import feature_types as tf_schema_kinds
from ray_tfrecord._src.data.write.writers import WriteConfig, refuse_null_everywhere, write_tables

# SaveMode: Ray's, for callers on every supported Ray (ray.data exports it from Ray 2.52 only).

logger = logging.getLogger(__name__)

#: What ``mode="overwrite"`` replaces: the whole dataset, or (Spark's dynamic partition overwrite) the partitions
#: the write writes.
PartitionOverwrite = Literal["static", "dynamic"]

if TYPE_CHECKING:
    _Base = Datasink[dict[str, Any]]
else:
    # Ray's file-datasink base where Ray has job checkpointing, so that Ray checkpoints our write tasks in
    # two phases (compat.FileDatasinkBase says why); Datasink elsewhere. Every method Ray calls is ours.
    _Base = compat.FileDatasinkBase


class _CheckpointNames(FilenameProvider):
    """What Ray's checkpointing asks a file datasink for: the name a write task's files start with."""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return checkpoint_file_base(task_index, write_uuid) + ".tfrecord"


@public("ray_tfrecord")
class TFRecordDatasink(_Base):
    """Writes a dataset as TFRecord files, Hive-partitioned if asked.

    Use with ``ds.write_datasink(TFRecordDatasink(path, ...))`` or
    [`write_tfrecords`][ray_tfrecord.write_tfrecords]. After the write, ``result`` holds what was
    written: ``num_rows``, ``files`` (the data files' final paths), ``num_files``, ``bytes_written``
    and ``skipped`` (``mode="ignore"`` found data). The write is staged and committed all or nothing:
    a failed or killed write leaves nothing visible ([Writing](../writing.md),
    [Cloud storage](../cloud-storage.md#how-a-write-commits)).

    Args:
        path: Destination directory (any ``pyarrow.fs`` filesystem), a string or a path-like object.
        filesystem: Filesystem to use; inferred from ``path`` when absent.
        record_type: ``"Example"``, ``"SequenceExample"`` or ``"ByteArray"`` (the
            dataset then has one binary column, written as raw records).
        partition_cols: Columns to partition by: rows go to
            ``<col>=<value>/...`` directories and the columns are dropped from the
            records (the reader restores them from the directory names). Nulls go
            to ``<col>=__HIVE_DEFAULT_PARTITION__``.
        mode: ``"error"`` (default: raise if ``path`` holds anything),
            ``"overwrite"`` (replace the dataset once the new one is complete),
            ``"append"`` (add files) or ``"ignore"`` (do nothing if ``path`` holds
            anything). A directory holding only ``_temporary`` counts as empty.
        compression: ``None``, ``"gzip"`` or ``"zlib"``; files are readable by
            ``tf.data.TFRecordDataset`` with ``compression_type`` ``"GZIP"``/``"ZLIB"``.
        compression_level: zlib's level for ``"gzip"``/``"zlib"`` files: 0 (fastest) to 9
            (smallest); ``None`` is zlib's default (6). Refused without ``compression``.
        min_rows_per_file: As in Ray's file datasinks: a write task gathers input blocks until it
            holds at least this many rows, and writes them to one file per partition directory. A
            hint, not a limit: a task may get more rows (whole blocks), the last task fewer, and
            ``max_rows_per_file``/``target_file_size`` still cut files. With ``partition_cols`` it
            counts a task's rows over all its partitions.
        filename_provider: A Ray ``FilenameProvider``: each write task names its files
            ``get_filename_for_task(write_uuid, task_index)``, used as given within each
            partition directory. ``{i}`` in the name becomes the file's number (0, 1, ...) within
            the task and directory, as in ``write_parquet``; without it, a task that needs a
            second file in one directory fails. Two tasks giving the same name, or (``append``) a
            name that exists, fail the write before any file moves. Default:
            ``part-<task>-<uuid>.tfrecord[.gz|.zlib]``.
        max_rows_per_file: Start a new file after this many records.
        target_file_size: Start a new file once this many (uncompressed) bytes
            have been written to it; files end on record boundaries, so they may
            exceed it by up to one record.
        write_index: Write an index sidecar for each uncompressed file so readers
            can split it.
        allow_float64_narrowing: Write ``float64`` columns as TFRecord's float32
            (lossy) instead of refusing them.
        allow_decimal_narrowing: Write decimal values that have no exact float32 form
            as the nearest float32 (lossy) instead of refusing them.
        partition_overwrite: With ``mode="overwrite"`` and ``partition_cols``: ``"static"`` (default)
            replaces the whole dataset; ``"dynamic"`` replaces only the partitions present in the new
            rows and keeps the others (Spark's ``partitionOverwriteMode=dynamic``): a backfill of one day.
        keep_replaced_files: Seconds the files an ``overwrite`` replaces stay after its commit, for reads
            of ours planned before it (they read one committed version, so they never see old and new
            together). Default ``0``: deleted at the commit, so a ``tf.data`` glob of the directory never
            sees both; a read planned before then fails, naming the commit. Set it (to the seconds a read
            takes) for datasets read while they are overwritten; a glob then matches the replaced files too
            until a later write, or ``ray-tfrecord clean``, deletes them.
        serialize_tensors: Write each tensor column (``pa.fixed_shape_tensor``, Ray's tensor types) as Ray's
            ``write_tfrecords`` does: one ``bytes_list`` value a row, its ``tf.io.serialize_tensor`` bytes, for
            ``tf.io.parse_tensor``. Default: the tensor's flat values (a ``FixedLenFeature`` of its shape).
        tf_schema: Ray's: a TFMD ``Schema`` fixing each feature's kind (``INT``, ``FLOAT``, ``BYTES``). Every
            record column must be one of its features, of that kind (a column of another kind is refused, not
            converted); all-empty list columns take its types. Example records only.
        num_files: Write exactly this many files, rows within one of even (empty ones where rows are fewer), named
            ``<prefix>-00000-of-000NN.tfrecord[.gz|.zlib]`` as TFDS, Beam and TFX name shards. ``write_tfrecords``
            splits the rows so (Ray's ``repartition(N)``); before ``ds.write_datasink``, call it yourself. With
            ``partition_cols``, N counts shards, as Spark's ``repartition(N)`` before ``partitionBy``: each writes
            one file in each partition directory it has rows for ([Writing](../writing.md#exactly-n-files)).
        file_prefix: ``num_files``' ``<prefix>``, default ``part-<8 hex of the write id>``; taken names are refused.

    Concurrent writes to one dataset (appends from several jobs, backfills, an overwrite) each commit a
    version of its log; an append never conflicts, and the rest end as if one ran after the other
    ([Cloud storage](../cloud-storage.md#concurrent-writes)). A write that cannot follow another
    (``mode="error"`` to a dataset created meanwhile) raises [`ConflictError`][ray_tfrecord.ConflictError].
    """

    # Open files per write task; beyond it the least recently used one is closed
    # (its partition continues in a new file), bounding memory and handles.
    _MAX_OPEN_FILES = 64

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        filesystem: pafs.FileSystem | None = None,
        record_type: RecordType = "Example",
        partition_cols: list[str] | None = None,
        mode: options.Mode | SaveMode = "error",
        compression: options.Compression | None = None,
        compression_level: int | None = None,
        min_rows_per_file: int | None = None,
        filename_provider: FilenameProvider | None = None,
        max_rows_per_file: int | None = None,
        target_file_size: int | None = None,
        write_index: bool = True,
        allow_float64_narrowing: bool = False,
        allow_decimal_narrowing: bool = False,
        partition_overwrite: PartitionOverwrite = "static",
        keep_replaced_files: float = DEFAULT_KEEP_REPLACED_S,
        serialize_tensors: bool = False,
        tf_schema: Any = None,
        num_files: int | None = None,
        file_prefix: str | None = None,
    ):
        mode = options.mode(mode)
        options.compression(compression)
        options.compression_level(compression_level, compression)
        options.record_type(record_type)
        shards.check_file_options(num_files=num_files, file_prefix=file_prefix, min_rows_per_file=min_rows_per_file,
                                  max_rows_per_file=max_rows_per_file, target_file_size=target_file_size,
                                  filename_provider=filename_provider)
        self._unresolved_path = os.fspath(path)
        self._names_from_caller = filename_provider is not None or num_files is not None  # staged: they may clash
        paths, fs = filesystems.resolve_paths([self._unresolved_path], filesystem)
        retrying = compat.retrying_filesystem(fs)
        #: The write's commit protocol: its save mode, staging directory and final moves.
        if partition_overwrite not in ("static", "dynamic"):
            raise ValueError(f"partition_overwrite must be 'static' (an overwrite replaces the whole dataset) or "
                             f"'dynamic' (only the partitions it writes), got {partition_overwrite!r}")
        if partition_overwrite == "dynamic" and not partition_cols:
            raise ValueError("partition_overwrite='dynamic' replaces the partitions the write writes; give "
                             "partition_cols, or leave partition_overwrite out to replace the whole dataset")
        self.commit = Commit(retrying, paths[0], mode, underlying=compat.unwrap_filesystem(retrying),
                             caller_names=self._names_from_caller,
                             partitions_only=partition_overwrite == "dynamic", keep_replaced=keep_replaced_files)
        self._min_rows_per_file = min_rows_per_file
        self._rows_per_write: int | None = None  # Ray < 2.60: min_bytes_per_write as rows (_bundle_rows_like_bytes)
        self._min_bytes_per_write = min(target_file_size or sizes.MIN_BYTES_PER_WRITE, sizes.MIN_BYTES_PER_WRITE)
        self._config = WriteConfig(
            filesystem=retrying,
            path=self.commit.path,
            staging=self.commit.write_dir,
            object_store=self.commit.object_store,
            direct=self.commit.direct,
            record_type=record_type,
            partition_cols=tuple(partition_cols or ()),
            compression=compression,
            compression_level=compression_level,
            filename_provider=filename_provider,
            max_rows_per_file=max_rows_per_file,
            target_file_size=target_file_size,
            write_index=write_index and compression is None,
            allow_float64_narrowing=allow_float64_narrowing,
            allow_decimal_narrowing=allow_decimal_narrowing,
            max_open_files=self._MAX_OPEN_FILES,
            serialize_tensors=serialize_tensors,
            tf_features=None if tf_schema is None else tf_schema_kinds(tf_schema, record_type),
            num_files=num_files,
            file_prefix=file_prefix or shards.default_prefix(self.commit.write_id),
        )
        self._own_prefix = file_prefix is not None
        self._started = False
        self._skips: bool | None = None  # what apply_mode decided, once
        #: Whether the write continues a job checkpoint that holds records (Ray's checkpoint filter then
        #: runs beside it), as apply_mode found or was told; False without a checkpoint.
        self.rerun = False
        self._context: DataContext | None = None  # the dataset's, whose checkpoint_config applies
        self.result: TFRecordWriteResult | None = None

    # What Ray's planner and ``Dataset.write_datasink`` read of a file datasink (Ray 2.60).
    @property
    def unresolved_path(self) -> str:
        return self._unresolved_path

    @property
    def path(self) -> str:
        return self.commit.path

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self.commit.filesystem

    @property
    def filename_provider(self) -> FilenameProvider:
        return _CheckpointNames()

    @property
    def _skip_write(self) -> bool:
        return bool(self._skips)

    def check_schema(self, schema: pa.Schema) -> None:
        """Raise if rows of ``schema`` cannot be written with this sink's options (partition
        columns, types TFRecord cannot encode, types that contradict the dataset appended to), so
        that a caller who knows the schema fails before executing the dataset; the write then
        knows the element type of list columns that are all empty in some block."""
        self._config.check_schema(schema, self.commit.recorded)
        self._config = self._config.knowing(schema)

    # -- driver side ------------------------------------------------------------------

    def prepare(self, ds: Dataset, *, rerun: bool | None = None) -> bool:
        """Settle what can be settled before ``ds`` runs, so that Ray does not compute a dataset only for
        the sink to refuse or drop it: join its job checkpoint and apply the save mode (``True``: nothing
        is to be written, and ``result`` says why), and check the schema Ray knows without executing
        it. Optional: ``ds.write_datasink(sink)`` alone does the same as the write starts. ``rerun``: as
        for ``apply_mode``."""
        self._context = ds.context
        if self.apply_mode(ds.context, rerun=rerun):
            return True
        if not compat.RAY_BUNDLES_WRITES_BY_BYTES:
            self._bundle_rows_like_bytes(ds)
        known = ds.schema(fetch_if_missing=False)
        if known is not None and isinstance(known.base_schema, pa.Schema):
            self.check_schema(known.base_schema)
        return False

    def apply_mode(self, context: DataContext | None = None, *, rerun: bool | None = None) -> bool:
        """Take part in the job checkpoint of ``context`` (the dataset's; default: the current one), if
        it has one, and apply the save mode, once; ``True``: nothing is to be written (``ignore`` found
        data, or a rerun completed a checkpointed write whose data was complete), and ``result`` says
        so. ``rerun``: whether that checkpoint holds records, from a caller that listed it and checked the
        cluster for Ray's checkpoint filter already (``inference``); ``None``: listed and checked here."""
        if self._skips is None:
            config = compat.checkpoint_config(context)
            if config is not None:
                if self._config.filename_provider is not None:
                    raise ValueError("filename_provider cannot be used with Ray's checkpoint_config: a rerun finds "
                                     "each task's files by the name Ray gave the task; leave filename_provider out")
                if self._config.num_files is not None:
                    raise ValueError("num_files cannot be used with Ray's checkpoint_config: a rerun writes only the "
                                     "rows earlier runs did not, so its shards cannot be even; leave num_files out "
                                     "(max_rows_per_file sizes files), or unset checkpoint_config")
                if rerun is None:
                    rerun = compat.checkpoint_started(config)
                    if rerun:
                        progress.preflight("write_tfrecords", [progress.CHECKPOINT_FILTER])
                self.rerun = rerun
                self.commit.use_checkpoint(config.checkpoint_path, started=rerun)
                self._config = dataclasses.replace(self._config, checkpointed=True, staging=self.commit.write_dir)
            self._skips = self.commit.apply_mode()
            if self._own_prefix and not self._skips:
                shards.refuse_taken_names(self.commit, self._config.file_prefix)
            if self.commit.completed is not None:
                self.result = self.commit.completed
            elif self._skips:
                self.result = TFRecordWriteResult(num_rows=0, skipped=True)
        return self._skips

    def on_write_start(self, schema: pa.Schema | None = None, **_: Any) -> None:  # Ray 2.50-2.52 pass no schema
        if self._started:
            return
        self._started = True
        # The schema Ray passes here is that of the write operator's first input
        # bundle, which after operator fusion can be a read task's input rather
        # than the rows; write tasks check the real schema before writing a byte.
        if not self.apply_mode(self._context):
            self.commit.start()

    def on_write_complete(self, write_result: WriteResult[dict[str, Any]]) -> None:
        # An empty dataset never calls on_write_start; the mode still applies.
        self.on_write_start(None)
        if self._skips:
            return
        returns = [ret for ret in write_result.write_returns if ret]
        schemas: list[pa.Schema] = [s for ret in returns for s in ret.get("schemas", [])]
        refuse_null_everywhere(schemas, self.commit.recorded, self._config.record_type)
        staged = shards.complete(returns, self._config)
        self.result = self.commit.finish(staged, schemas, names_from_caller=self._names_from_caller)

    def on_write_failed(self, error: Exception) -> None:
        if self.commit.checkpoint is not None:
            logger.warning("Write to %s failed; the files of the write tasks that completed stay, and running the "
                           "job again continues it: %s", self.commit.path, task_cause(error) or error)
        else:
            logger.warning("Write to %s failed; removing staged files: %s", self.commit.path,
                           task_cause(error) or error)
        self.commit.abort()

    @property
    def min_rows_per_write(self) -> int | None:
        # num_files: one write task per block of the N-way split, never bundled.
        return None if self._config.num_files is not None else self._min_rows_per_file or self._rows_per_write

    def _bundle_rows_like_bytes(self, ds: Dataset) -> None:
        """Ray before 2.60 ignores ``min_bytes_per_write`` and runs one write task per input block
        unless a row target is given. For a materialized dataset, whose size Ray knows without
        executing it, set the row target that gathers the same bytes, so that the same files are
        written on every Ray; a lazy dataset's write tasks are fused with the read tasks before it
        where Ray can, and take one block each where it cannot."""
        if self._min_rows_per_file is not None or not isinstance(ds, MaterializedDataset):
            return
        rows, size = ds.count(), ds.size_bytes()
        target = self.min_bytes_per_write
        if rows and size and target:
            self._rows_per_write = max(1, math.ceil(target * rows / size))

    @property
    def min_bytes_per_write(self) -> int | None:
        # Ray otherwise runs one write task, hence one file, per input block:
        # hundreds of tiny files (and tasks) for a dataset that Ray split finely.
        # A write task's input gathers in the object store until it reaches this size,
        # so it must stay well below the store (Ray Data budgets about half of it across
        # all operators): gathering 128 MiB in a 100 MiB store stalls the upstream
        # operators on backpressure and spills (tests/test_faults.py).
        if self.min_rows_per_write is not None or self._config.num_files is not None:
            return None  # the row target bundles instead (Ray accepts only one of the two), or nothing does
        store = ray.cluster_resources().get("object_store_memory") if ray.is_initialized() else None
        if store:
            return max(1, min(self._min_bytes_per_write, int(store) // sizes.STORE_SHARE_PER_WRITE))
        return self._min_bytes_per_write

    @property
    def supports_distributed_writes(self) -> bool:
        return not compat.is_local_scheme([self._unresolved_path])

    # -- write tasks ---------------------------------------------------------------------

    def write(self, blocks: Iterable[Block], ctx: compat.TaskContext) -> dict[str, Any]:
        """Write this task's blocks into the staging directory (Ray calls it in each write task);
        returns the staged files and the record schemas written."""
        if self._skips:
            return {"files": [], "schemas": [], "shard": ctx.task_idx}
        tables = (BlockAccessor.for_block(block).to_arrow() for block in blocks)
        # Ray's id where its checkpointing or a filename_provider needs it; ours where files carry it for cleanup.
        ray_uuid = compat.write_uuid(ctx) if self._config.checkpointed or not self.commit.direct else None
        write_uuid = ray_uuid or self.commit.write_id
        try:
            files, schemas = write_tables(tables, self._config, ctx.task_idx, write_uuid, self.commit.recorded)
        except TFRecordError as e:
            raise from_task(e) from None
        # Ray commits this task's ids when it returns (its pending record was written before the first
        # block arrived): the files go into place now, not at the driver's commit.
        if compat.task_checkpoints_pending(ctx):
            if not self._config.checkpointed:
                raise ValueError("the dataset's checkpoint_config was set after the write started; set "
                                 "DataContext.get_current().checkpoint_config before creating the dataset")
            files = self.commit.publish(files, schemas, checkpoint_file_base(ctx.task_idx, write_uuid))
        return {"files": files, "schemas": schemas, "shard": ctx.task_idx}


@public("ray_tfrecord")
def write_tfrecords(
    ds: Dataset,
    path: str | os.PathLike,
    *,
    filesystem: pafs.FileSystem | None = None,
    record_type: RecordType = "Example",
    partition_cols: list[str] | None = None,
    mode: options.Mode | SaveMode = "error",
    compression: options.Compression | None = None,
    compression_level: int | None = None,
    min_rows_per_file: int | None = None,
    filename_provider: FilenameProvider | None = None,
    max_rows_per_file: int | None = None,
    target_file_size: int | None = None,
    write_index: bool = True,
    allow_float64_narrowing: bool = False,
    allow_decimal_narrowing: bool = False,
    partition_overwrite: PartitionOverwrite = "static",
    keep_replaced_files: float = DEFAULT_KEEP_REPLACED_S,
    serialize_tensors: bool = False,
    tf_schema: Any = None,
    num_files: int | None = None,
    file_prefix: str | None = None,
    concurrency: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    **task_options: Unpack[options.RayTaskOptions],
) -> TFRecordWriteResult:
    """Write ``ds`` as TFRecord files under ``path``; see [`TFRecordDatasink`][ray_tfrecord.TFRecordDatasink]
    for the arguments and the commit protocol. Returns what was written (``num_rows``, ``files``,
    ``num_files``, ``bytes_written``, ``skipped``).

    ``concurrency`` and ``ray_remote_args`` are ``Dataset.write_datasink``'s; the write tasks'
    Ray options can also be given by name ([`RayTaskOptions`][ray_tfrecord.RayTaskOptions]:
    ``num_cpus``, ``num_gpus``, ``memory``, ``resources``, ``accelerator_type``, ``runtime_env``,
    ``label_selector``, ``fallback_strategy``, ``max_calls``), as for
    [`read_tfrecords`][ray_tfrecord.read_tfrecords];
    only the ones given reach Ray.

    Example:
        >>> import ray, ray_tfrecord
        >>> ds = ray.data.range(100)  # doctest: +SKIP
        >>> ray_tfrecord.write_tfrecords(ds, "/tmp/r", compression="gzip")  # doctest: +SKIP
        TFRecordWriteResult(num_rows=100, ...)
    """
    task_options = options.ray_task_options("write_tfrecords", task_options)  # a misspelt keyword fails first
    sink = TFRecordDatasink(
        path,
        filesystem=filesystem,
        record_type=record_type,
        partition_cols=partition_cols,
        mode=mode,
        compression=compression,
        compression_level=compression_level,
        min_rows_per_file=min_rows_per_file,
        filename_provider=filename_provider,
        max_rows_per_file=max_rows_per_file,
        target_file_size=target_file_size,
        write_index=write_index,
        allow_float64_narrowing=allow_float64_narrowing,
        allow_decimal_narrowing=allow_decimal_narrowing,
        partition_overwrite=partition_overwrite,
        keep_replaced_files=keep_replaced_files,
        serialize_tensors=serialize_tensors,
        tf_schema=tf_schema,
        num_files=num_files,
        file_prefix=file_prefix,
    )
    given = dict(concurrency=concurrency, ray_remote_args=ray_remote_args, **task_options)
    if sink.prepare(ds):
        return _result(sink)
    if num_files is not None:
        ds = ds.repartition(num_files, shuffle=False)  # N blocks of even rows, in the object store (shards.py)
    with progress.Watchdog("write_tfrecords", [progress.CHECKPOINT_FILTER] if sink.rerun else []):
        return write_prepared(ds, sink, **given)


def write_prepared(ds: Dataset, sink: TFRecordDatasink, **write_args: Any) -> TFRecordWriteResult:
    """Write ``ds`` into ``sink``, which ``prepare`` readied for it (and found something to write), with
    ``Dataset.write_datasink``'s ``write_args``; the caller watches the job (``progress.Watchdog``)."""
    try:
        ds.write_datasink(sink, **compat.ray_call_args(Dataset.write_datasink, write_args))
    except Exception as e:
        # A write task's TFRecordError arrives inside Ray's task traceback (kilobytes); the
        # caller gets the error itself, with its path, offset and column.
        cause = task_cause(e)
        if cause is None:
            raise
        raise cause from None
    return _result(sink)


def _result(sink: TFRecordDatasink) -> TFRecordWriteResult:
    # A check, not an assert: under python -O an assert would let a write that never committed return None.
    if sink.result is None:
        raise RuntimeError(f"write_tfrecords: Ray finished writing {sink.commit.path} without committing it (the "
                           "datasink's on_write_complete was not called); nothing of this write is visible")
    return sink.result
