"""The file writers of one write task: rows to TFRecord files in a write's staging directory.

A task's tables are checked (``WriteConfig.check_schema``), split by partition directory
(``split_by_partitions``), encoded, and written through a
``RecordWriter`` per file, with an index sidecar per uncompressed
file. Files rotate by row count and size, and are named ``part-<task>-<uuid>.tfrecord[.gz|.zlib]``,
by the caller's ``FilenameProvider``, or (``num_files``) as shard ``<task>`` of N (``shard_name``; ``shards``
checks the N on the driver). ``ray_tfrecord._src.data.write.commit`` then moves them into place.
On an object store they are written at their final keys instead, as ``part-<task>-<write id>-<n>``,
and each file's index goes back to the driver for the manifest, not into a sidecar.
"""

from __future__ import annotations

import dataclasses
import posixpath
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from ray.data.datasource import FilenameProvider

from ray_tfrecord._src.core import options, sizes
from ray_tfrecord._src.core.codec import RecordType, check_encodable, encode
from ray_tfrecord._src.core.errors import SchemaError, TFRecordError
from ray_tfrecord._src.core.framing import RecordWriter
from ray_tfrecord._src.core.index import IndexBuilder, write_index
from ray_tfrecord._src.core.layout import is_hidden_name
from ray_tfrecord._src.core.schema import merge_recorded, stored_schema
from ray_tfrecord._src.data.partitioning import split_by_partitions
from ray_tfrecord._src.data.write import tf_schema
from ray_tfrecord._src.data.write.commit import StagedFile, checkpoint_file_base, make_dirs

_EXTENSIONS = {None: ".tfrecord", "gzip": ".tfrecord.gz", "zlib": ".tfrecord.zlib"}
#: Why a num_files write fails when its tasks are not the N shards of an even split (``.format(N)``).
UNEVEN = ("the dataset did not reach the sink as {0} even blocks. write_tfrecords(ds, path, num_files={0}) splits it "
          "so; with ds.write_datasink(sink), write ds.repartition({0}). Nothing was written")


def task_past_shards(count: int, task_idx: int, path: str) -> TFRecordError:
    """The error of a num_files write whose Ray write task ``task_idx`` has no shard of ``count`` to write."""
    return TFRecordError(f"num_files={count}: Ray ran write task {task_idx}: {UNEVEN.format(count)}", path=path)


@dataclass(frozen=True)
class WriteConfig:
    """What write tasks need to produce files (pickled into every write task)."""

    filesystem: pafs.FileSystem
    path: str  # the dataset directory, for messages
    staging: str  # where files are written (relative paths below it are the final ones)
    object_store: bool  # no directories to create
    record_type: RecordType
    partition_cols: tuple[str, ...]
    compression: options.Compression | None
    compression_level: int | None
    filename_provider: FilenameProvider | None
    max_rows_per_file: int | None
    target_file_size: int | None
    write_index: bool
    allow_float64_narrowing: bool
    allow_decimal_narrowing: bool
    max_open_files: int  # per task; beyond it the least recently used file is closed
    checkpointed: bool = False  # a job checkpoint: files are named for Ray's recovery (checkpoint_file_base)
    direct: bool = False  # staging is the dataset itself (an object store): files are named for the write id
    list_types: tuple[tuple[str, pa.DataType], ...] = ()  # the dataset's list columns, as the driver knows them
    serialize_tensors: bool = False  # tensor columns as tf.io.serialize_tensor bytes
    tf_features: tuple[tuple[str, pa.DataType], ...] | None = None  # tf_schema=: each feature's kind (leaf type)
    num_files: int | None = None  # each task writes shard <task> of this many: one file per directory
    file_prefix: str = ""  # the shards' names start so

    @property
    def extension(self) -> str:
        return _EXTENSIONS[self.compression]

    def data_schema(self, schema: pa.Schema) -> pa.Schema:
        """What the records of rows of ``schema`` hold (partition columns live in the directory names)."""
        return stored_schema([f for f in schema if f.name not in self.partition_cols], self.record_type)

    def knowing(self, schema: pa.Schema) -> WriteConfig:
        """This config, told the dataset's ``schema`` (its list columns' element types)."""
        return dataclasses.replace(self, list_types=tuple(_list_types(schema).items()))

    def check_schema(self, schema: pa.Schema, recorded: pa.Schema | None = None, absent: Sequence[str] = ()) -> None:
        """Refuse rows of ``schema`` that cannot be written: partition columns that are missing or
        of a type a directory name cannot hold, records left empty, columns TFRecord cannot encode,
        and (``recorded``: the schema of the dataset appended to) types that contradict the
        dataset's. ``absent`` columns (null-typed in one block) are not encoded; a list column all
        empty in ``schema`` (``list<null>``) takes the element type ``recorded`` gives it."""
        if recorded is not None:
            known = _list_types(recorded)
            schema = pa.schema([f.with_type(known[f.name]) if _is_null_list(f.type) and f.name in known else f
                                for f in schema])
        missing = [c for c in self.partition_cols if c not in schema.names]
        if missing:
            raise ValueError(f"partition_cols {missing} are not columns of {schema.names}")
        for name in self.partition_cols:
            t = schema.field(name).type
            # Null type: a block where the column is all null (goes to the
            # __HIVE_DEFAULT_PARTITION__ directory).
            if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                    or pa.types.is_boolean(t) or pa.types.is_floating(t) or pa.types.is_null(t)):
                raise ValueError(
                    f"Cannot partition by column {name!r} of type {t}: partition "
                    "columns must be integer, floating, boolean or string."
                )
        if len(self.partition_cols) == len(schema.names):
            raise ValueError("Every column is a partition column; records would be empty.")
        data_schema = pa.schema([f for f in schema if f.name not in self.partition_cols and f.name not in absent])
        check_encodable(data_schema, self.record_type, allow_float64_narrowing=self.allow_float64_narrowing)
        if self.tf_features is not None:
            tf_schema.check(data_schema, self.tf_features, self.partition_cols, self.serialize_tensors)
        if recorded is not None:
            merge_recorded(recorded, self.data_schema(schema), path=self.path)


def write_tables(tables: Iterable[pa.Table], config: WriteConfig, task_idx: int, write_uuid: str,
                 recorded: pa.Schema | None) -> tuple[list[StagedFile], list[pa.Schema]]:
    """Write one task's tables into the staging directory; returns the files it staged and the
    record schemas it wrote. ``recorded`` is the schema of the dataset appended to, if any. On an
    error the open files are closed first, so that the commit's abort can remove them."""
    files = _TaskFiles(config, task_idx, write_uuid)
    checked = None
    schemas: list[pa.Schema] = []
    absent: list[str] = []
    list_types = {**tf_schema.empty_list_types(config.tf_features or ()), **dict(config.list_types),
                  **(_list_types(recorded) if recorded is not None else {})}
    held: list[pa.Table] = []

    def write(table: pa.Table) -> None:
        nonlocal checked, absent
        if table.schema != checked:
            checked = table.schema
            data = config.data_schema(table.schema)
            if data not in schemas:
                schemas.append(data)
            # A column whose every cell in this block is null has Arrow type null here even
            # when the dataset's is binary or int64: its records lack the feature, as for a
            # null cell. A column null everywhere is refused from the merged schemas.
            absent = [f.name for f in data if pa.types.is_null(f.type)]
            config.check_schema(table.schema, recorded, absent=absent)
        table = table.drop_columns(absent)
        _refuse_nulls_in_not_null_fields(table, config.path)
        for part_dir, piece in split_by_partitions(table, config.partition_cols):
            for batch in piece.to_batches():
                files.write(part_dir, batch)

    try:
        for table in tables:
            if not table.num_columns:  # the empty blocks of Ray's split repartition (num_files): nothing to write
                continue
            # A list column whose values are all empty in a block is list<null> there, and would be
            # written as features of no kind; the element type the dataset, the dataset appended to
            # or another block of this task gives it makes them typed empty lists (``int64_list {}``),
            # as when the rows come in one block. Blocks wait, in order, until a later one shows it.
            list_types.update(_list_types(table.schema))
            held.append(table)
            typed = [_typed_empty_lists(t, list_types) for t in held]
            if all(t is not None for t in typed):
                held = []
                for t in typed:
                    write(t)
        for table in held:  # no block of this task shows the type: features of no kind, read as empty
            write(_typed_empty_lists(table, list_types, partial=True) or table)
    finally:
        done = files.close_all()
    return done, schemas


def refuse_null_everywhere(written: list[pa.Schema], recorded: pa.Schema | None, record_type: RecordType) -> None:
    """Tasks write a null-typed block column as missing features, since another block may give it
    a type; a column null-typed in every block ``written`` (and not ``recorded`` before) has none, so the
    write fails before any file moves, as it does on the driver when the schema is known."""
    typed = {f.name for s in [*written, recorded or pa.schema([])] for f in s if not pa.types.is_null(f.type)}
    for s in written:
        for f in s:
            if f.name not in typed:
                check_encodable(pa.schema([f]), record_type)


def shard_name(prefix: str, index: int, count: int, extension: str) -> str:
    """The TFDS/Beam name of shard ``index`` of ``count``: 5 digits each, more past 99999."""
    return f"{prefix}-{index:05d}-of-{count:05d}{extension}"


def write_empty(config: WriteConfig, rel_path: str) -> StagedFile:
    """An empty file at ``rel_path`` (a shard with no rows: TensorFlow reads it as no records)."""
    return _PartFile(config, rel_path).close()


def _is_null_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_null(t.value_type)


def _list_types(schema: pa.Schema) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in schema
            if (pa.types.is_list(f.type) or pa.types.is_large_list(f.type)) and not _is_null_list(f.type)}


def _typed_empty_lists(table: pa.Table, list_types: dict[str, pa.DataType], partial: bool = False) -> pa.Table | None:
    """``table`` with its ``list<null>`` columns cast to the list type ``list_types`` knows for them;
    ``None`` if one has none (``partial``: that column is left as it is)."""
    for i, f in enumerate(table.schema):
        if not _is_null_list(f.type):
            continue
        target = list_types.get(f.name)
        if target is None:
            if partial:
                continue
            return None
        table = table.set_column(i, f.with_type(target), table.column(i).cast(target))
    return table


def _refuse_nulls_in_not_null_fields(table: pa.Table, path: str) -> None:
    """Only a task sees the values: a null where the schema says not null fails it before its
    block is written (staged files are then removed), since the record would lack the feature
    and read back as a null the recorded schema forbids."""
    for f, col in zip(table.schema, table.columns):
        if not f.nullable and col.null_count:
            row = pc.index(col.is_null(), True).as_py()
            raise SchemaError(f"row {row} of a block is null but the schema declares the field not nullable; "
                              "fill the nulls or declare the field nullable=True", path=path, column=f.name)


class _PartFile:
    """One open output file (in staging) and its index builder."""

    def __init__(self, config: WriteConfig, rel_path: str):
        self.rel_path = rel_path
        self.rows = 0
        self._fs = config.filesystem
        self._staging = config.staging
        self._path = posixpath.join(config.staging, rel_path)
        make_dirs(self._fs, posixpath.dirname(self._path), object_store=config.object_store)
        # compression=None: pyarrow would otherwise gzip a ".gz" name a second time.
        stream = self._fs.open_output_stream(self._path, compression=None)
        self._writer = RecordWriter(stream, config.compression, config.compression_level)
        self._index = IndexBuilder(sizes.INDEX_SPACING_BYTES) if config.write_index else None
        self._in_manifest = config.object_store  # the index, not a sidecar of it (two requests a file)
        self._direct = config.direct

    @property
    def bytes(self) -> int:
        return self._writer.bytes_written

    def write(self, data: memoryview, offsets: np.ndarray) -> None:
        if self._index is not None:
            self._index.add_records(offsets + self.bytes)
            self._index.observe_bytes(data)
        self._writer.write(data)
        self.rows += len(offsets)

    def close(self) -> StagedFile:
        size = self.bytes
        self._writer.close()
        if self._index is None:
            return StagedFile(self.rel_path, self.rows, size, False, in_place=self._direct)
        index = self._index.finish(size)
        if self._in_manifest:
            return StagedFile(self.rel_path, self.rows, size, False, in_place=self._direct,
                              record_index=index.to_bytes())
        write_index(self._fs, self._path, index, root=self._staging)
        return StagedFile(self.rel_path, self.rows, size, True)


class _TaskFiles:
    """The files one write task has open, one per partition directory, rotated by
    row count / size."""

    def __init__(self, config: WriteConfig, task_idx: int, write_uuid: str):
        self._config = config
        self._task_idx = task_idx
        self._write_uuid = write_uuid
        self._open: dict[str, _PartFile] = {}
        self._done: list[StagedFile] = []
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
        count = self._config.num_files
        if count is not None:
            if self._task_idx >= count:  # the driver's check (shards.complete) would fail the write: fail it now
                raise task_past_shards(count, self._task_idx, self._config.path)
            name = shard_name(self._config.file_prefix, self._task_idx, count, self._config.extension)
            return self._only(name, number, part_dir, f"its blocks span more than {self._config.max_open_files} "
                              "partitions", "raise num_files, so that each shard spans fewer")
        if self._config.checkpointed or self._config.direct:
            return f"{checkpoint_file_base(self._task_idx, self._write_uuid)}-{number}{self._config.extension}"
        if self._config.filename_provider is None:
            return f"part-{self._task_idx:05d}-{uuid.uuid4().hex}{self._config.extension}"
        if self._provided_name is None:
            self._provided_name = _provided_name(self._config.filename_provider, self._write_uuid, self._task_idx)
        name = self._provided_name
        if "{i}" in name:
            return name.replace("{i}", str(number))
        return self._only(name, number, part_dir, f"max_rows_per_file, target_file_size, or more than "
                          f"{self._config.max_open_files} partitions in one task",
                          "put '{i}' in the name for the file's number within the task")

    def _only(self, name: str, number: int, part_dir: str, why: str, fix: str) -> str:
        """``name``, the one file a task may write in ``part_dir`` (``number``: the files it opened there before);
        raises for a second one, saying ``why`` a task writes several and the ``fix``."""
        if number:
            where = f"directory {part_dir!r}" if part_dir else "the dataset root"
            named_by = "num_files" if self._config.num_files is not None else "filename_provider"
            raise TFRecordError(f"{named_by} named write task {self._task_idx}'s file {name!r}, but the task writes "
                                f"more than one file in {where} ({why}); {fix}")
        return name

    def write(self, part_dir: str, batch: pa.RecordBatch) -> None:
        config = self._config
        max_rows, target_bytes = config.max_rows_per_file, config.target_file_size
        encoded = encode(batch, config.record_type, allow_float64_narrowing=config.allow_float64_narrowing,
                         allow_decimal_narrowing=config.allow_decimal_narrowing,
                         serialize_tensors=config.serialize_tensors)
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

    def close_all(self) -> list[StagedFile]:
        while self._open:
            self._done.append(self._open.pop(next(iter(self._open))).close())
        return self._done


def _provided_name(provider: FilenameProvider, write_uuid: str, task_idx: int) -> str:
    """A write task's file name from a Ray ``FilenameProvider``. Ray 2.55+ file datasinks call
    only ``get_filename_for_task`` (earlier releases have no such method); a provider written for
    earlier Rays, which overrides only ``get_filename_for_block``, gets the arguments Ray documents
    for it (block ``None``, index 0) rather than being silently ignored."""
    cls = type(provider)
    for_task = getattr(cls, "get_filename_for_task", None)
    if for_task is None or (for_task is getattr(FilenameProvider, "get_filename_for_task", None)
                            and cls.get_filename_for_block is not FilenameProvider.get_filename_for_block):
        name = provider.get_filename_for_block(None, write_uuid, task_idx, 0)
    else:
        name = provider.get_filename_for_task(write_uuid, task_idx)
    if not isinstance(name, str) or not name or "/" in name or is_hidden_name(name):
        raise TFRecordError(f"filename_provider named write task {task_idx}'s file {name!r}: a name must be a "
                            "non-empty string without '/' that does not start with '.' or '_' (readers skip those)")
    return name
