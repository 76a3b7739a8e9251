"""Ray Data datasource for TFRecord files, backed by the native codec.

Example:
    >>> import ray_tfrecord
    >>> ds = ray_tfrecord.read_tfrecords("s3://bucket/train/")  # doctest: +SKIP
    >>> ds.schema()  # doctest: +SKIP

Reading works in three stages:

1. *Listing* (driver, at construction): ``ray_tfrecord._src.data.read.listing.list_files``, which
   skips names starting with ``.`` or ``_`` and applies ``partition_filter`` and
   ``file_extensions`` before any file is opened. Hive partition columns are typed
   from all listed values (``ray_tfrecord._src.data.partitioning``).
2. *Schema* (driver, at construction): the one given, else the schema recorded by the
   ``write_tfrecords`` that wrote the directory, else inferred from the first
   ``infer_sample_records`` records of the first files (at most ``_INFER_MAX_FILES``
   files); see ``_record_schema``. Partition and ``path`` columns are added to it.
3. *Planning* (driver, per execution): ``ray_tfrecord._src.data.read.planning`` cuts files into
   byte ranges and packs them into read tasks of about ``total_bytes / parallelism``
   bytes.
4. *Reading* (read tasks): ``ray_tfrecord._src.data.read.read_tasks``; each task streams one block per
   4 MiB of framed records (or ``target_max_block_size``, if smaller).
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Unpack

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from ray.data import Dataset
from ray.data.block import BlockMetadata
from ray.data.context import DataContext
from ray.data.datasource import Datasource, Partitioning, PartitionStyle, PathPartitionFilter, ReadTask

if TYPE_CHECKING:
    from ray.data import ActorPoolStrategy, TaskPoolStrategy

from ray_tfrecord._src.core import options, sizes
from ray_tfrecord._src.core.codec import BYTE_ARRAY_SCHEMA, RecordType, decode
from ray_tfrecord._src.core.feature_specs import SchemaLike, arrow_schema, ray_tf_schema
from ray_tfrecord._src.core.framing import CorruptionReport, iter_chunks, open_stream
from ray_tfrecord._src.core.manifest import explain_missing, is_object_store
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.core.schema import infer_schema, read_stored_schema
from ray_tfrecord._src.data import compat, progress
from ray_tfrecord._src.data.read.listing import Listing, list_files
from ray_tfrecord._src.data.read.planning import (
    Shuffle,
    check_shuffle,
    default_read_tasks,
    pack_ranges,
    plan_ranges,
    shuffle_files,
    split_bytes,
)
from ray_tfrecord._src.data.read.read_tasks import PATH_COLUMN, Compression, ReadConfig, read_ranges


class _CorruptionLedger:
    """Collects corruption reports from read tasks, keyed by ``(path, start)``:
    re-executing the dataset or retrying a task replaces a range's report instead
    of counting its bad records twice."""

    def __init__(self) -> None:
        self._reports: dict[tuple[str, int], CorruptionReport] = {}

    # @ray.method: Ray's typed form of an actor method, so that handles show ``.remote``.
    @ray.method
    def record(self, key: tuple[str, int], report: CorruptionReport) -> None:
        self._reports[key] = report

    @ray.method
    def reports(self) -> list[CorruptionReport]:
        return list(self._reports.values())


# ray.remote called rather than used as a class decorator, whose result type checkers cannot see.
_RemoteLedger = ray.remote(num_cpus=0)(_CorruptionLedger)


@public("ray_tfrecord")
class TFRecordDatasource(Datasource):
    """Reads TFRecord files (``tf.train.Example``, ``tf.train.SequenceExample`` or
    raw bytes) into Arrow blocks with the native codec.

    Use with ``ray.data.read_datasource(TFRecordDatasource(paths, ...))`` or through
    [`read_tfrecords`][ray_tfrecord.read_tfrecords], which takes the same arguments.

    Args:
        paths: A file, a directory (read recursively), or a list of them, as strings or
            path-like objects (``pathlib.Path``). Any
            filesystem ``pyarrow.fs`` supports (local, ``s3://``, ``gs://``, HDFS...).
        record_type: ``"Example"``, ``"SequenceExample"`` or ``"ByteArray"`` (one
            ``binary`` column named ``record`` holding each record's payload).
        schema: The record columns: a ``pyarrow.Schema``, or a TensorFlow one, translated as the table
            in [Types and schemas](../types.md#tensorflow-feature-specs-and-tfmd-schemas) says: a dict of
            ``tf.io`` feature specs (defaults, ragged partitions included), the ``(context_features,
            sequence_features)`` pair for SequenceExample, a TFMD ``Schema`` or a ``schema.pbtxt`` path.
            When absent: the schema recorded by
            the ``write_tfrecords`` that wrote the directory (exact types: strings stay
            strings), else inferred (see ``infer_sample_records``). Partition and ``path``
            columns are added to it. A given schema is checked against the first chunk
            (1 MiB) of the data here, on the driver: a contradicting type raises
            [`DecodeError`][ray_tfrecord.DecodeError], a field none of those records has
            gets a ``UserWarning``.
        columns: Columns to produce (record, partition or ``path`` columns), in this
            order. Only these record columns are decoded. ``Dataset.select_columns``
            after the read is pushed down the same way.
        compression: ``"auto"`` (default: detected per file from its first bytes),
            ``None`` (uncompressed), ``"gzip"`` or ``"zlib"`` for all files.
        verify_crc: Check each record's data CRC (the length CRC is always checked).
        on_corrupt: ``"raise"`` (default) raises
            [`CorruptRecordError`][ray_tfrecord.CorruptRecordError] naming the file and byte
            offset; ``"skip"`` drops bad records, logs them and counts them; the count is
            available from [`corruption_report`][ray_tfrecord.TFRecordDatasource.corruption_report]
            after execution. A damaged GZIP/ZLIB stream keeps the records before the damage and counts the
            rest of the file as one lost stretch.
        filesystem: The ``pyarrow.fs.FileSystem`` to use; inferred from the paths
            when absent.
        partitioning: How directory names map to columns; Hive ``key=value`` by
            default, ``None`` to disable. Unless ``partitioning.field_types`` says otherwise, a
            column is typed from every value listed for it: ``int64`` if all are integers, else
            ``float64``, else ``bool`` (``true``/``false``), else ``string``;
            ``__HIVE_DEFAULT_PARTITION__`` is null.
        partition_filter: A ``PathPartitionFilter``; files it rejects are dropped
            after listing and never opened.
        include_paths: Add a ``path`` column with each row's file path.
        file_extensions: Only read files with one of these extensions. Default
            ``None`` reads every visible file: TFRecord files are often named without
            an extension (``train-00000-of-00100``). Names starting with ``.`` or ``_``
            (``_SUCCESS``, ``.crc`` files, index sidecars) are never read.
        ignore_missing_paths: Skip paths that do not exist, and globs that match no file, instead
            of raising.
        shuffle: ``"files"`` or a ``FileShuffleConfig`` to shuffle the file order.
        infer_sample_records: Records sampled to infer the schema, read from the
            first files in listing order (whole files while they fit in the sample).
            A feature absent from every sampled record is not in the schema; pass
            ``schema`` for sparse data.
        fixed_size_lists: Infer ``fixed_size_list`` columns for features whose value
            count is the same in every sampled record.
    """

    # Schema inference opens at most this many files, however few records they hold.
    _INFER_MAX_FILES = 32
    # Threads used to read heads/tails/indexes of large files while planning.
    _PLANNING_THREADS = 16

    def __init__(
        self,
        paths: str | os.PathLike | list[str | os.PathLike],
        *,
        record_type: RecordType = "Example",
        schema: SchemaLike | None = None,
        columns: list[str] | None = None,
        compression: Compression = "auto",
        verify_crc: bool = True,
        on_corrupt: options.OnCorrupt = "raise",
        filesystem: pafs.FileSystem | None = None,
        partitioning: Partitioning | None = Partitioning(PartitionStyle.HIVE),
        partition_filter: PathPartitionFilter | None = None,
        include_paths: bool = False,
        file_extensions: list[str] | None = None,
        ignore_missing_paths: bool = False,
        shuffle: Shuffle = None,
        infer_sample_records: int = 10_000,
        fixed_size_lists: bool = False,
    ):
        super().__init__()
        resolved = _fspaths(paths)
        self._record_type = options.record_type(record_type)
        schema = arrow_schema(schema, self._record_type)
        self._compression = options.compression(compression, allow_auto=True)
        self._on_corrupt = options.on_corrupt(on_corrupt)
        check_shuffle(shuffle)
        self._verify_crc = verify_crc
        self._shuffle = shuffle
        self._supports_distributed = not compat.is_local_scheme([resolved] if isinstance(resolved, str) else resolved)
        self._data_context = compat.data_context()

        self._listing = list_files(
            resolved,
            filesystem=filesystem,
            file_extensions=file_extensions,
            ignore_missing_paths=ignore_missing_paths,
            partitioning=partitioning,
            partition_filter=partition_filter,
        )
        record_schema = _record_schema(
            self._listing,
            record_type,
            schema,
            lambda: self._sample(infer_sample_records),
            fixed_size_lists,
        )
        # Partition values win over a record feature of the same name (as in Spark): the
        # directory is what the writer partitioned on. Then the file's path, if asked for.
        attached = list(self._listing.partition_schema)
        if include_paths:
            attached.append(pa.field(PATH_COLUMN, pa.string()))
        self._attached = frozenset(f.name for f in attached)
        self._schema = pa.schema([f for f in record_schema if f.name not in self._attached] + attached)

        self._projection_map: dict[str, str] | None = None
        if columns is not None:
            unknown = [c for c in columns if c not in self._schema.names]
            if unknown:
                raise ValueError(f"Unknown columns {unknown}; available: {self._schema.names}")
            self._projection_map = {c: c for c in columns}

        self._ledger = _RemoteLedger.remote() if on_corrupt == "skip" else None

    @property
    def listing(self) -> Listing:
        """The files this datasource reads, their partitions and their filesystem."""
        return self._listing

    def output_schema(self) -> pa.Schema:
        """The schema of the blocks this datasource produces (after projection)."""
        if self._projection_map is None:
            return self._schema
        return pa.schema([self._schema.field(n) for n in self._projection_map if n in self._schema.names])

    def _sample(self, records: int) -> Iterator:
        """The first ``records`` records of the first files, as framed chunks."""
        remaining = records
        report = CorruptionReport()
        fs = self._listing.filesystem
        for file in self._listing.files[: self._INFER_MAX_FILES]:
            with explain_missing(fs, file.path):
                stream, found = open_stream(file.path, fs, self._compression)
            with contextlib.closing(stream):
                for chunk in iter_chunks(
                    stream,
                    path=file.path,
                    compressed=bool(found),
                    verify_crc=self._verify_crc,
                    on_corrupt=self._on_corrupt,
                    report=report,
                    chunk_bytes=sizes.SAMPLE_CHUNK_BYTES,
                ):
                    yield chunk
                    remaining -= len(chunk)
                    if remaining <= 0:
                        return

    # -- Ray Datasource interface -------------------------------------------------

    def supports_projection_pushdown(self) -> bool:
        return True

    def apply_projection(self, projection: dict[str, str] | list[str] | None) -> TFRecordDatasource:
        """A copy reading only ``projection``'s columns (of those this one reads, in its order): a
        ``{name: name}`` map from Ray 2.52, a list of names before; ``None`` changes nothing."""
        clone = copy.copy(self)
        if projection is not None:
            kept = dict.fromkeys(projection) if self._projection_map is None else self._projection_map
            clone._projection_map = {name: name for name in kept if name in projection}
        return clone

    def get_current_projection(self) -> list[str] | None:
        """The projected columns, as Ray 2.50 and 2.51 ask for them."""
        return None if self._projection_map is None else list(self._projection_map)

    @property
    def supports_distributed_reads(self) -> bool:
        return self._supports_distributed

    def estimate_inmemory_data_size(self) -> int | None:
        if self._projection_map == {}:
            return 0  # nothing is materialised, only row counts
        return int(sum(f.size for f in self._listing.files))

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
        **_: Any,  # arguments later Ray releases add; Ray 2.50 passes only the first two
    ) -> list[ReadTask]:
        files = shuffle_files(self._listing.files, self._shuffle, compat.execution_index(data_context))
        target = split_bytes(sum(f.size for f in files), parallelism, sizes.MIN_SPLIT_BYTES)
        ranges = plan_ranges(self._listing.filesystem, files, self._compression, target, self._PLANNING_THREADS)
        config = self._read_config()
        tasks = []
        for group in pack_ranges(ranges, target):
            rows = [r.num_rows for r in group if r.num_rows is not None]
            meta = BlockMetadata(
                # In skip mode a range may yield fewer rows than its index says.
                num_rows=sum(rows) if len(rows) == len(group) and self._on_corrupt == "raise" else None,
                size_bytes=sum(r.size for r in group),
                input_files=tuple(dict.fromkeys(r.path for r in group)),
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    read_ranges(group, config),
                    meta,
                    schema=config.schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks

    def corruption_report(self) -> CorruptionReport:
        """Corrupt records skipped by the read tasks executed so far
        (``on_corrupt="skip"`` only). Re-executing the dataset does not double-count.
        """
        if self._ledger is None:
            raise ValueError("corruption_report() needs on_corrupt='skip'")
        total = CorruptionReport()
        for report in ray.get(self._ledger.reports.remote()):
            total.merge(report)
        return total

    def _read_config(self) -> ReadConfig:
        schema = self.output_schema()
        target = self._data_context.target_max_block_size or sizes.TARGET_BLOCK_BYTES
        return ReadConfig(
            filesystem=compat.pickleable_filesystem(self._listing.filesystem),
            record_type=self._record_type,
            schema=schema,
            attached=self._attached & set(schema.names),
            compression=self._compression,
            verify_crc=self._verify_crc,
            on_corrupt=self._on_corrupt,
            chunk_bytes=int(min(target, sizes.READ_CHUNK_BYTES)),
            ledger=self._ledger,
            read_ahead=is_object_store(compat.unwrap_filesystem(self._listing.filesystem)),
        )


def _record_schema(
    listing: Listing,
    record_type: RecordType,
    schema: pa.Schema | None,
    sample,
    fixed_size_lists: bool,
) -> pa.Schema:
    """The record columns: ``schema`` if given (ByteArray has only one possible), else the
    schema ``write_tfrecords`` recorded for the dataset, else inferred from ``sample()``."""
    if record_type == "ByteArray":
        if schema is not None and schema != BYTE_ARRAY_SCHEMA:
            raise ValueError(
                f"record_type='ByteArray' always produces {BYTE_ARRAY_SCHEMA}; "
                f"got schema {schema}"
            )
        return BYTE_ARRAY_SCHEMA
    if schema is not None:
        _check_schema_against(schema, listing, record_type, sample)
        return schema
    # A dataset this package wrote records its exact schema; others are sampled.
    if len(listing.roots) == 1:
        stored = read_stored_schema(listing.filesystem, listing.roots[0], record_type,
                                    version=listing.version_of(listing.roots[0]))
        if stored is not None:
            return stored.remove_metadata()
    return infer_schema(sample(), record_type, fixed_size_lists=fixed_size_lists)


def _check_schema_against(schema: pa.Schema, listing: Listing, record_type: RecordType, sample) -> None:
    """Decode the first chunk of the data with an explicit ``schema``: a type that contradicts
    the records fails here, on the driver, instead of in the first read task; a field no
    record in that chunk has (often a misspelling, read as all nulls) is warned about."""
    record_schema = pa.schema([f for f in schema if f.name not in listing.partition_schema.names])
    chunks = sample()
    with contextlib.closing(chunks):
        first = next(chunks, None)
    if first is None or not len(record_schema):
        return
    batch = decode(first, record_schema, record_type)
    absent = [f.name for f, column in zip(record_schema, batch.columns) if column.null_count == len(first)]
    if absent:
        warnings.warn(
            f"schema fields {absent} are in none of the first {len(first)} records of {first.path} "
            f"and will read as nulls; check their spelling (features there: "
            f"{infer_schema([first], record_type).names})",
            stacklevel=5,  # the caller of read_tfrecords
        )


@public("ray_tfrecord")
def read_tfrecords(
    paths: str | os.PathLike | list[str | os.PathLike],
    *,
    record_type: RecordType = "Example",
    schema: SchemaLike | None = None,
    tf_schema: Any = None,
    columns: list[str] | None = None,
    compression: Compression = "auto",
    verify_crc: bool = True,
    on_corrupt: options.OnCorrupt = "raise",
    filesystem: pafs.FileSystem | None = None,
    partitioning: Partitioning | None = Partitioning(PartitionStyle.HIVE),
    partition_filter: PathPartitionFilter | None = None,
    include_paths: bool = False,
    file_extensions: list[str] | None = None,
    ignore_missing_paths: bool = False,
    shuffle: Shuffle = None,
    infer_sample_records: int = 10_000,
    fixed_size_lists: bool = False,
    override_num_blocks: int | None = None,
    concurrency: int | None = None,
    compute: TaskPoolStrategy | ActorPoolStrategy | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    **task_options: Unpack[options.RayTaskOptions],
) -> Dataset:
    """Read TFRecord files into a ``ray.data.Dataset``.

    Takes the arguments of [`TFRecordDatasource`][ray_tfrecord.TFRecordDatasource] plus those of Ray 2.60's
    ``ray.data.read_datasource``: ``override_num_blocks``, ``concurrency``, ``compute``
    and the read tasks' Ray options by name ([`RayTaskOptions`][ray_tfrecord.RayTaskOptions]:
    ``num_cpus``, ``num_gpus``, ``memory``, ``resources``, ``accelerator_type``, ``runtime_env``,
    ``label_selector``, ``fallback_strategy``, ``max_calls``). Only the ones given reach Ray; on a Ray release
    whose read API does not name one yet it goes into ``ray_remote_args``, which is still
    accepted (Ray 2.60 deprecates it). ``override_num_blocks`` defaults to one read task per
    CPU in the cluster (more for data larger than that many target-size blocks), not Ray's
    200: each task streams blocks of a few MiB already. That needs a running Ray to
    count CPUs; before ``ray.init()`` the read leaves the choice to Ray Data. To retrieve
    the count of records skipped with ``on_corrupt="skip"``, build the
    [`TFRecordDatasource`][ray_tfrecord.TFRecordDatasource] yourself and call its
    [`corruption_report`][ray_tfrecord.TFRecordDatasource.corruption_report] after executing the dataset.

    ``tf_schema`` is Ray's: a TFMD ``Schema`` whose every feature reads as a list of its type
    (``schema=`` with the same proto reads a feature with a ``shape`` as a dense column instead), so a
    call written for ``ray.data.read_tfrecords`` runs unchanged; give ``schema`` or ``tf_schema``, not both.

    Example:
        >>> import ray_tfrecord
        >>> ds = ray_tfrecord.read_tfrecords(  # doctest: +SKIP
        ...     "/data/train", columns=["label", "image"], on_corrupt="skip")
    """
    task_options = options.ray_task_options("read_tfrecords", task_options)  # a misspelt keyword fails first
    if tf_schema is not None:
        if schema is not None:
            raise ValueError("pass schema= or tf_schema= (Ray's TFMD Schema), not both")
        schema = ray_tf_schema(tf_schema)
    datasource = TFRecordDatasource(
        paths,
        record_type=record_type,
        schema=schema,
        columns=columns,
        compression=compression,
        verify_crc=verify_crc,
        on_corrupt=on_corrupt,
        filesystem=filesystem,
        partitioning=partitioning,
        partition_filter=partition_filter,
        include_paths=include_paths,
        file_extensions=file_extensions,
        ignore_missing_paths=ignore_missing_paths,
        shuffle=shuffle,
        infer_sample_records=infer_sample_records,
        fixed_size_lists=fixed_size_lists,
    )
    if override_num_blocks is None:
        size = datasource.estimate_inmemory_data_size() or 0
        override_num_blocks = default_read_tasks(size, compat.data_context().target_max_block_size)
    given = dict(override_num_blocks=override_num_blocks, concurrency=concurrency, compute=compute,
                 ray_remote_args=ray_remote_args, **task_options)
    cpus = task_options.get("num_cpus")  # None, as Ray's own keywords take it: not given
    progress.preflight("read_tfrecords", [], task_cpus=progress.TASK_CPUS if cpus is None else cpus)
    return ray.data.read_datasource(datasource, **compat.ray_call_args(ray.data.read_datasource, given))


def _fspaths(paths: str | os.PathLike | list[str | os.PathLike]) -> str | list[str]:
    """``paths`` as strings, as Ray's path resolution takes them."""
    if isinstance(paths, (str, os.PathLike)):
        return os.fspath(paths)
    return [os.fspath(p) for p in paths]
