"""Ray Data datasink writing TFRecord datasets with a staged, all-or-nothing commit.

Example:
    >>> import ray, ray_tfrecord
    >>> ds = ray.data.from_items([{"number": n % 3, "word": f"w{n}"} for n in range(9)])
    >>> result = ray_tfrecord.write_tfrecords(  # doctest: +SKIP
    ...     ds, "/tmp/words", partition_cols=["number"], mode="overwrite")
    >>> result.num_rows  # doctest: +SKIP
    9

Commit protocol (what a concurrent reader sees):

1. ``on_write_start`` (driver) applies ``mode``; write tasks then write every file,
   and its index sidecar (``_index.<relative path>``, see :mod:`ray_tfrecord.core.index`), under
   ``<path>/_temporary/<write id>/``. Readers that
   skip ``_``-prefixed names (this package, Spark, Hive, Ray's readers) never see
   these files, so a failed or killed write leaves nothing visible (at worst a
   hidden ``_temporary/<write id>/`` directory after a hard kill).
2. Only after every write task succeeded, ``on_write_complete`` (driver) moves the
   staged files into place (sidecar first, so a data file is splittable as soon
   as it is visible), then, for ``overwrite``, deletes the files that were there
   before, then removes the staging directory and writes ``_SUCCESS`` last.

During step 2 a reader listing the directory may see a partial dataset: some of
the new files (``append``), or for ``overwrite`` the old files plus some of the new
ones, until the old ones are deleted. On a local filesystem or HDFS each move is a
rename and step 2 takes milliseconds; on object stores a move is a copy and the
window grows with the data. Readers that need a consistent snapshot should wait
for ``_SUCCESS`` to appear (``overwrite``/first write) or be newer (``append``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import ray
from ray.data import Dataset, SaveMode
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, FilenameProvider, WriteResult

from ray_tfrecord.core import options, sizes
from ray_tfrecord.core.codec import RecordType, check_encodable, encode
from ray_tfrecord.core.errors import SchemaError, TFRecordError
from ray_tfrecord.core.framing import RecordWriter
from ray_tfrecord.core.index import IndexBuilder, index_path, write_index
from ray_tfrecord.core.layout import SCHEMA_FILE, STAGING_DIR, SUCCESS_MARKER, is_hidden_name
from ray_tfrecord.core.schema import merge_recorded, read_stored_schema, stored_schema
from ray_tfrecord.io import _compat
from ray_tfrecord.io.partitioning import split_by_partitions

logger = logging.getLogger(__name__)


_EXTENSIONS = {None: ".tfrecord", "gzip": ".tfrecord.gz", "zlib": ".tfrecord.zlib"}


@dataclass(frozen=True)
class TFRecordWriteResult:
    """What a write produced. ``files`` are the final paths of the data files
    (empty when ``mode="ignore"`` skipped the write)."""

    num_rows: int
    files: list[str] = field(default_factory=list)
    bytes_written: int = 0
    skipped: bool = False

    @property
    def num_files(self) -> int:
        return len(self.files)


class _StagedFile(NamedTuple):
    """A file a write task finished in the staging directory."""

    rel_path: str  # under the staging directory, and under the destination once committed
    rows: int
    size: int
    has_index: bool


@dataclass(frozen=True)
class _WriteConfig:
    """What write tasks need to produce files (pickled into every write task)."""

    filesystem: pafs.FileSystem
    staging: str
    record_type: RecordType
    compression: options.Compression | None
    compression_level: int | None
    filename_provider: FilenameProvider | None
    max_rows_per_file: int | None
    target_file_size: int | None
    write_index: bool
    allow_float64_narrowing: bool
    allow_decimal_narrowing: bool
    max_open_files: int

    @property
    def extension(self) -> str:
        return _EXTENSIONS[self.compression]


class TFRecordDatasink(Datasink[dict[str, Any]]):
    """Writes a dataset as TFRecord files, Hive-partitioned if asked.

    Use with ``ds.write_datasink(TFRecordDatasink(path, ...))`` or
    :func:`write_tfrecords`. After the write, :attr:`result` holds a
    :class:`TFRecordWriteResult`.

    Args:
        path: Destination directory (any ``pyarrow.fs`` filesystem).
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
    """

    # Open files per write task; beyond it the least recently used one is closed
    # (its partition continues in a new file), bounding memory and handles.
    _MAX_OPEN_FILES = 64

    def __init__(
        self,
        path: str,
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
    ):
        mode = SaveMode(options.mode(mode))
        options.compression(compression)
        options.compression_level(compression_level, compression)
        options.record_type(record_type)
        for name, value in (("min_rows_per_file", min_rows_per_file), ("max_rows_per_file", max_rows_per_file),
                            ("target_file_size", target_file_size)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if min_rows_per_file is not None and max_rows_per_file is not None and min_rows_per_file > max_rows_per_file:
            raise ValueError(f"min_rows_per_file ({min_rows_per_file}) must not exceed max_rows_per_file "
                             f"({max_rows_per_file})")
        if filename_provider is not None and not isinstance(filename_provider, FilenameProvider):
            raise TypeError(f"filename_provider must be a ray.data.datasource.FilenameProvider, got "
                            f"{type(filename_provider).__name__}")
        self._unresolved_path = path
        paths, fs = _compat.resolve_paths(path, filesystem)
        self._fs = _compat.retrying_filesystem(fs)
        self._path = paths[0].rstrip("/")
        self._mode = mode
        self._partition_cols = list(partition_cols or [])
        self._min_rows_per_file = min_rows_per_file
        self._min_bytes_per_write = min(target_file_size or sizes.MIN_BYTES_PER_WRITE, sizes.MIN_BYTES_PER_WRITE)
        self._staging = posixpath.join(self._path, STAGING_DIR, uuid.uuid4().hex)
        self._config = _WriteConfig(
            filesystem=self._fs,
            staging=self._staging,
            record_type=record_type,
            compression=compression,
            compression_level=compression_level,
            filename_provider=filename_provider,
            max_rows_per_file=max_rows_per_file,
            target_file_size=target_file_size,
            write_index=write_index and compression is None,
            allow_float64_narrowing=allow_float64_narrowing,
            allow_decimal_narrowing=allow_decimal_narrowing,
            max_open_files=self._MAX_OPEN_FILES,
        )
        self._started = False
        self._skip = False
        self._created_root = False
        # The schema recorded by the dataset this write appends to: appended rows must agree.
        self._recorded: pa.Schema | None = None
        self.result: TFRecordWriteResult | None = None

    # -- driver side ------------------------------------------------------------------

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        if self._started:
            return
        self._started = True
        if self._existing_data_blocks_write():
            return
        # The schema Ray passes here is that of the write operator's first input
        # bundle, which after operator fusion can be a read task's input rather
        # than the rows; write tasks check the real schema before writing a byte.
        self._created_root = self._fs.get_file_info(self._path).type == pafs.FileType.NotFound
        _make_dirs(self._fs, self._staging)

    def _existing_data_blocks_write(self) -> bool:
        """Apply ``mode`` to what is at the destination: raise for ``error``, return
        ``True`` (write nothing) for ``ignore``, ``False`` to go ahead."""
        if not _dataset_exists(self._fs, self._path):
            return False
        if self._mode == SaveMode.APPEND:
            self._recorded = read_stored_schema(self._fs, self._path)
        if self._mode == SaveMode.ERROR:
            raise ValueError(
                f"Path {self._path} already exists. Use mode='overwrite', 'append' or "
                "'ignore' to write there anyway."
            )
        if self._mode == SaveMode.IGNORE:
            logger.warning("[mode=ignore] %s exists; not writing.", self._path)
            self._skip = True
            return True
        return False

    def _check_schema(self, schema: pa.Schema, absent: Sequence[str] = ()) -> None:
        """Refuse what cannot be written; ``absent`` columns (null-typed in one block) are not encoded."""
        missing = [c for c in self._partition_cols if c not in schema.names]
        if missing:
            raise ValueError(f"partition_cols {missing} are not columns of {schema.names}")
        for name in self._partition_cols:
            t = schema.field(name).type
            # Null type: a block where the column is all null (goes to the
            # __HIVE_DEFAULT_PARTITION__ directory).
            if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                    or pa.types.is_boolean(t) or pa.types.is_floating(t) or pa.types.is_null(t)):
                raise ValueError(
                    f"Cannot partition by column {name!r} of type {t}: partition "
                    "columns must be integer, floating, boolean or string."
                )
        if len(self._partition_cols) == len(schema.names):
            raise ValueError("Every column is a partition column; records would be empty.")
        data_schema = pa.schema([f for f in schema if f.name not in self._partition_cols and f.name not in absent])
        check_encodable(data_schema, self._config.record_type,
                        allow_float64_narrowing=self._config.allow_float64_narrowing)
        if self._recorded is not None:
            merge_recorded(self._recorded, self._data_schema(schema), path=self._path)

    def on_write_complete(self, write_result: WriteResult[dict[str, Any]]) -> None:
        # An empty dataset never calls on_write_start; the mode still applies.
        self.on_write_start(None)
        if self._skip:
            self.result = TFRecordWriteResult(num_rows=0, skipped=True)
            return
        staged = [f for ret in write_result.write_returns if ret for f in ret["files"]]
        self._refuse_null_everywhere(write_result)
        self._refuse_name_clashes(staged)
        old = _list_old_files(self._fs, self._path) if self._mode == SaveMode.OVERWRITE else []
        appended_to_data = self._mode == SaveMode.APPEND and _dataset_exists(self._fs, self._path)

        final_paths = []
        for f in staged:
            src = posixpath.join(self._staging, f.rel_path)
            dst = posixpath.join(self._path, f.rel_path)
            _make_dirs(self._fs, posixpath.dirname(dst))
            if f.has_index:
                self._fs.move(index_path(src, self._staging), index_path(dst, self._path))
            self._fs.move(src, dst)
            final_paths.append(dst)

        if old:
            new = set(final_paths) | {index_path(p, self._path) for p in final_paths}
            for path in old:
                if path not in new:
                    self._fs.delete_file(path)
            _remove_empty_dirs(self._fs, self._path, {posixpath.dirname(p) for p in old})
        self._remove_staging()
        self._record_schema(write_result, appended_to_data)
        with self._fs.open_output_stream(posixpath.join(self._path, SUCCESS_MARKER), compression=None):
            pass
        self.result = TFRecordWriteResult(
            num_rows=sum(f.rows for f in staged),
            files=final_paths,
            bytes_written=sum(f.size for f in staged),
        )

    def _refuse_name_clashes(self, staged: list[_StagedFile]) -> None:
        """A filename_provider's names are the caller's: two tasks may get the same one (both wrote the
        same staged path, so one file's rows are lost) or, appending, one already in the dataset.
        Either fails the write before any file moves, rather than replacing data."""
        if self._config.filename_provider is None:
            return
        seen = set()
        for f in staged:
            if f.rel_path in seen:
                raise TFRecordError(f"filename_provider gave two write tasks the same file name {f.rel_path!r}; "
                                    "make get_filename_for_task's name depend on task_index. Nothing was written",
                                    path=self._path)
            seen.add(f.rel_path)
        if self._mode == SaveMode.APPEND:
            for f in staged:
                dst = posixpath.join(self._path, f.rel_path)
                if self._fs.get_file_info(dst).type != pafs.FileType.NotFound:
                    raise TFRecordError("the file exists: filename_provider named an appended file like an existing "
                                        "one; put write_uuid in the name, or write with mode='overwrite'. Nothing "
                                        "was written", path=dst)

    def _refuse_null_everywhere(self, write_result: WriteResult[dict[str, Any]]) -> None:
        """Tasks write a null-typed block column as missing features, since another block may give it
        a type; a column null-typed in every block (and not recorded before) has none, so the
        write fails before any file moves, as it does on the driver when the schema is known."""
        written = _written_schemas(write_result)
        typed = {f.name for s in written + [self._recorded or pa.schema([])] for f in s if not pa.types.is_null(f.type)}
        for s in written:
            for f in s:
                if f.name not in typed:
                    check_encodable(pa.schema([f]), self._config.record_type)

    def _record_schema(self, write_result: WriteResult[dict[str, Any]], appended_to_data: bool) -> None:
        """Keep SCHEMA_FILE true of every file in the dataset, or remove it.

        It records the schema every task wrote, merged into the one recorded before for an append
        (:func:`~ray_tfrecord.core.schema.merge_recorded`); it is removed when tasks wrote conflicting
        types, or when appending to files whose schema was not recorded.
        """
        merged = read_stored_schema(self._fs, self._path) if appended_to_data else None
        written = _written_schemas(write_result)
        if merged is not None or not appended_to_data:
            try:
                for schema in written:
                    merged = schema if merged is None else merge_recorded(merged, schema)
            except SchemaError:
                merged = None
        path = posixpath.join(self._path, SCHEMA_FILE)
        if merged is not None:
            with self._fs.open_output_stream(path, compression=None) as f:
                f.write(merged.serialize())
        elif self._fs.get_file_info(path).type == pafs.FileType.File:
            self._fs.delete_file(path)

    def on_write_failed(self, error: Exception) -> None:
        logger.warning("Write to %s failed; removing staged files: %s", self._path, _compat.task_cause(error) or error)
        self._remove_staging()
        if self._created_root and not _dataset_exists(self._fs, self._path):
            self._fs.delete_dir(self._path)

    def _remove_staging(self) -> None:
        if self._fs.get_file_info(self._staging).type != pafs.FileType.NotFound:
            self._fs.delete_dir(self._staging)
        # `_temporary` is shared with concurrent writers: a check-then-delete could wipe a staging
        # directory created in between, or fail on one another writer removed first. Locally an
        # rmdir is atomic and refuses a non-empty directory; elsewhere delete_dir removes a whole
        # prefix, so the (hidden, empty) prefix is left.
        if isinstance(_compat.unwrap_filesystem(self._fs), pafs.LocalFileSystem):
            with contextlib.suppress(OSError):
                os.rmdir(posixpath.dirname(self._staging))

    @property
    def min_rows_per_write(self) -> int | None:
        return self._min_rows_per_file

    @property
    def min_bytes_per_write(self) -> int | None:
        # Ray otherwise runs one write task, hence one file, per input block:
        # hundreds of tiny files (and tasks) for a dataset that Ray split finely.
        # A write task's input gathers in the object store until it reaches this size,
        # so it must stay well below the store (Ray Data budgets about half of it across
        # all operators): gathering 128 MiB in a 100 MiB store stalls the upstream
        # operators on backpressure and spills (tests/test_faults.py).
        if self._min_rows_per_file is not None:
            return None  # the caller's row target bundles instead (Ray accepts only one of the two)
        store = ray.cluster_resources().get("object_store_memory") if ray.is_initialized() else None
        if store:
            return max(1, min(self._min_bytes_per_write, int(store) // sizes.STORE_SHARE_PER_WRITE))
        return self._min_bytes_per_write

    @property
    def supports_distributed_writes(self) -> bool:
        return not _compat.is_local_scheme(self._unresolved_path)

    # -- write tasks ---------------------------------------------------------------------

    def write(self, blocks: Iterable[Block], ctx: _compat.TaskContext) -> dict[str, Any]:
        """Write this task's blocks into the staging directory; returns the staged
        files (:class:`_StagedFile`) and the record schemas written."""
        if self._skip:
            return {"files": [], "schemas": []}
        files = _TaskFiles(self._config, ctx.task_idx, _compat.write_uuid(ctx) or posixpath.basename(self._staging))
        checked = None
        schemas: list[pa.Schema] = []
        try:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.schema != checked:
                    checked = table.schema
                    data = self._data_schema(table.schema)
                    if data not in schemas:
                        schemas.append(data)
                    # A column whose every cell in this block is null has Arrow type null here even
                    # when the dataset's is binary or int64: its records lack the feature, as for a
                    # null cell. A column null everywhere is refused from the merged schemas.
                    absent = [f.name for f in data if pa.types.is_null(f.type)]
                    self._check_schema(table.schema, absent=absent)
                table = table.drop_columns(absent)
                self._refuse_nulls_in_not_null_fields(table)
                for part_dir, piece in split_by_partitions(table, self._partition_cols):
                    for batch in piece.to_batches():
                        files.write(part_dir, batch)
        except TFRecordError as e:
            raise _compat.from_task(e) from None
        finally:
            done = files.close_all()
        return {"files": done, "schemas": schemas}

    def _refuse_nulls_in_not_null_fields(self, table: pa.Table) -> None:
        """Only a task sees the values: a null where the schema says not null fails it before its
        block is written (staged files are then removed), since the record would lack the feature
        and read back as a null the recorded schema forbids."""
        for f, col in zip(table.schema, table.columns):
            if not f.nullable and col.null_count:
                row = pc.index(col.is_null(), True).as_py()
                raise SchemaError(f"row {row} of a block is null but the schema declares the field not nullable; "
                                  "fill the nulls or declare the field nullable=True", path=self._path, column=f.name)

    def _data_schema(self, schema: pa.Schema) -> pa.Schema:
        """What the records hold (partition columns live in the directory names)."""
        return stored_schema([f for f in schema if f.name not in self._partition_cols], self._config.record_type)


class _PartFile:
    """One open output file (in staging) and its index builder."""

    def __init__(self, config: _WriteConfig, rel_path: str):
        self.rel_path = rel_path
        self.rows = 0
        self._fs = config.filesystem
        self._staging = config.staging
        self._path = posixpath.join(config.staging, rel_path)
        _make_dirs(self._fs, posixpath.dirname(self._path))
        # compression=None: pyarrow would otherwise gzip a ".gz" name a second time.
        stream = self._fs.open_output_stream(self._path, compression=None)
        self._writer = RecordWriter(stream, config.compression, config.compression_level)
        self._index = IndexBuilder(sizes.INDEX_SPACING_BYTES) if config.write_index else None

    @property
    def bytes(self) -> int:
        return self._writer.bytes_written

    def write(self, data, offsets: np.ndarray) -> None:
        if self._index is not None:
            self._index.add_records(offsets + self.bytes)
            self._index.observe_bytes(data)
        self._writer.write(data)
        self.rows += len(offsets)

    def close(self) -> _StagedFile:
        size = self.bytes
        self._writer.close()
        if self._index is not None:
            write_index(self._fs, self._path, self._index.finish(size), root=self._staging)
        return _StagedFile(self.rel_path, self.rows, size, self._index is not None)


class _TaskFiles:
    """The files one write task has open, one per partition directory, rotated by
    row count / size."""

    def __init__(self, config: _WriteConfig, task_idx: int, write_uuid: str):
        self._config = config
        self._task_idx = task_idx
        self._write_uuid = write_uuid
        self._open: dict[str, _PartFile] = {}
        self._done: list[_StagedFile] = []
        self._opened_in: dict[str, int] = {}  # files this task opened per directory
        self._provided_name: str | None = None

    def _file(self, part_dir: str) -> _PartFile:
        f = self._open.pop(part_dir, None)
        if f is None:
            if len(self._open) >= self._config.max_open_files:
                self._done.append(self._open.pop(next(iter(self._open))).close())
            name = self._name(part_dir)
            f = _PartFile(self._config, posixpath.join(part_dir, name) if part_dir else name)
        self._open[part_dir] = f  # re-insert: dict order is recency order
        return f

    def _name(self, part_dir: str) -> str:
        """The next file's name in ``part_dir``: ours, or the filename_provider's."""
        number = self._opened_in.get(part_dir, 0)
        self._opened_in[part_dir] = number + 1
        if self._config.filename_provider is None:
            return f"part-{self._task_idx:05d}-{uuid.uuid4().hex}{self._config.extension}"
        if self._provided_name is None:
            self._provided_name = _provided_name(self._config.filename_provider, self._write_uuid, self._task_idx)
        name = self._provided_name
        if "{i}" in name:
            return name.replace("{i}", str(number))
        if number:
            where = f"directory {part_dir!r}" if part_dir else "the dataset root"
            raise TFRecordError(f"filename_provider named write task {self._task_idx}'s file {name!r}, but the task "
                                f"writes more than one file in {where} (max_rows_per_file, target_file_size, or more "
                                f"than {self._config.max_open_files} partitions in one task); put '{{i}}' in the name "
                                "for the file's number within the task")
        return name

    def write(self, part_dir: str, batch: pa.RecordBatch) -> None:
        config = self._config
        max_rows, target_bytes = config.max_rows_per_file, config.target_file_size
        encoded = encode(batch, config.record_type, allow_float64_narrowing=config.allow_float64_narrowing,
                         allow_decimal_narrowing=config.allow_decimal_narrowing)
        data = memoryview(encoded.data).cast("B")
        starts = np.asarray(encoded.offsets, dtype=np.int64)
        ends = np.append(starts[1:], len(data))
        i, n = 0, len(starts)
        while i < n:
            f = self._file(part_dir)
            j = n
            if max_rows is not None:
                j = min(j, i + max_rows - f.rows)
            if target_bytes is not None:
                # First record whose end brings the file to the target size.
                k = int(np.searchsorted(ends, starts[i] + target_bytes - f.bytes, "left"))
                j = min(j, k + 1)
            j = max(j, i + 1)
            f.write(data[starts[i] : ends[j - 1]], starts[i:j] - starts[i])
            i = j
            full = (max_rows is not None and f.rows >= max_rows) or (
                target_bytes is not None and f.bytes >= target_bytes
            )
            if full:
                self._done.append(self._open.pop(part_dir).close())

    def close_all(self) -> list[_StagedFile]:
        while self._open:
            self._done.append(self._open.pop(next(iter(self._open))).close())
        return self._done


# -- helpers -------------------------------------------------------------------------


def _provided_name(provider: FilenameProvider, write_uuid: str, task_idx: int) -> str:
    """A write task's file name from a Ray ``FilenameProvider``. Ray 2.60's file datasinks call
    only ``get_filename_for_task``; a provider written for earlier Rays, which overrides only
    ``get_filename_for_block``, gets the arguments Ray documents for it (block ``None``, index 0)
    rather than being silently ignored."""
    cls = type(provider)
    if (cls.get_filename_for_task is FilenameProvider.get_filename_for_task
            and cls.get_filename_for_block is not FilenameProvider.get_filename_for_block):
        name = provider.get_filename_for_block(None, write_uuid, task_idx, 0)
    else:
        name = provider.get_filename_for_task(write_uuid, task_idx)
    if not isinstance(name, str) or not name or "/" in name or is_hidden_name(name):
        raise TFRecordError(f"filename_provider named write task {task_idx}'s file {name!r}: a name must be a "
                            "non-empty string without '/' that does not start with '.' or '_' (readers skip those)")
    return name


def _is_s3(fs: pafs.FileSystem) -> bool:
    return _compat.unwrap_filesystem(fs).type_name == "s3"


def _make_dirs(fs: pafs.FileSystem, path: str) -> None:
    # Object stores have no directories; creating marker objects there only
    # costs requests (and IAM permissions on parent prefixes).
    if not _is_s3(fs):
        fs.create_dir(path, recursive=True)


def _dataset_exists(fs: pafs.FileSystem, path: str) -> bool:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return True
    if info.type != pafs.FileType.Directory:
        return False
    entries = fs.get_file_info(pafs.FileSelector(path))
    return any(posixpath.basename(e.path) != STAGING_DIR for e in entries)


def _written_schemas(write_result: WriteResult[dict[str, Any]]) -> list[pa.Schema]:
    """The record schemas every write task reported, in task order."""
    return [s for ret in write_result.write_returns for s in (ret or {}).get("schemas", [])]


def _list_old_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """Every file of the existing dataset, excluding other writers' staging."""
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return []
    staging = posixpath.join(path, STAGING_DIR) + "/"
    return [
        e.path
        for e in fs.get_file_info(pafs.FileSelector(path, recursive=True))
        if e.is_file and not e.path.startswith(staging)
    ]


def _remove_empty_dirs(fs: pafs.FileSystem, root: str, dirs: Iterable[str]) -> None:
    # Deepest first, so a parent emptied by removing its children goes too.
    candidates = set()
    for d in dirs:
        while d.startswith(root + "/"):
            candidates.add(d)
            d = posixpath.dirname(d)
    for d in sorted(candidates, key=lambda p: p.count("/"), reverse=True):
        info = fs.get_file_info(d)
        if info.type == pafs.FileType.Directory and not fs.get_file_info(pafs.FileSelector(d)):
            fs.delete_dir(d)


def write_tfrecords(
    ds: Dataset,
    path: str,
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
    concurrency: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> TFRecordWriteResult:
    """Write ``ds`` as TFRecord files under ``path``; see :class:`TFRecordDatasink`
    for the arguments and the commit protocol. Returns what was written.

    Example:
        >>> import ray, ray_tfrecord
        >>> ds = ray.data.range(100)  # doctest: +SKIP
        >>> ray_tfrecord.write_tfrecords(ds, "/tmp/r", compression="gzip")  # doctest: +SKIP
        TFRecordWriteResult(num_rows=100, ...)
    """
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
    )
    # Settle error/ignore before executing the dataset: Ray would otherwise compute
    # the whole dataset only for the sink to refuse or drop it.
    if sink._existing_data_blocks_write():
        return TFRecordWriteResult(num_rows=0, skipped=True)
    known = ds.schema(fetch_if_missing=False)
    if known is not None and isinstance(known.base_schema, pa.Schema):
        sink._check_schema(known.base_schema)  # fail before computing anything
    try:
        ds.write_datasink(sink, concurrency=concurrency, ray_remote_args=ray_remote_args)
    except Exception as e:
        # A write task's TFRecordError arrives inside Ray's task traceback (kilobytes); the
        # caller gets the error itself, with its path, offset and column.
        cause = _compat.task_cause(e)
        if cause is None:
            raise
        raise cause from None
    return sink.result
