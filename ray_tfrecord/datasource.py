"""Ray Data datasource for TFRecord files, backed by the native codec.

Example:
    >>> import ray_tfrecord
    >>> ds = ray_tfrecord.read_tfrecords("s3://bucket/train/")  # doctest: +SKIP
    >>> ds.schema()  # doctest: +SKIP

Reading works in three stages:

1. *Listing* (driver, at construction). Paths are resolved like every Ray reader;
   directories are listed recursively with one ``FileSelector`` call each. Files or
   directories whose name starts with ``.`` or ``_`` at any depth are skipped
   (Hadoop convention: ``_SUCCESS``, ``_temporary/``, ``.crc`` files and our own
   ``.<name>.idx`` sidecars). ``partition_filter`` and ``file_extensions`` are then
   applied to the listed paths, so a pruned file is never opened.
2. *Schema* (driver, at construction): unless ``schema`` is given, inferred from the
   first ``infer_sample_records`` records of the first files (at most
   ``_INFER_MAX_FILES`` files). Hive partition columns are typed from all listed
   partition values: a key whose every value is an integer is ``int64``, then
   ``float64``, then ``bool`` (``true``/``false``), else ``string``.
3. *Planning* (driver, per execution): each file becomes one or more byte ranges.
   Uncompressed files larger than the split size are cut into several ranges;
   boundaries come from the file's index sidecar when it is present and current,
   otherwise each range after the first resynchronises on the next record header
   (validated by its length CRC and data CRC); a record belongs to the range its
   header starts in. Compressed files are always read whole. Ranges are packed into
   read tasks of about ``total_bytes / parallelism`` bytes, and each task streams
   one block per 4 MiB of framed records (or ``target_max_block_size``, if smaller).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.fs as pafs

import ray
from ray.data import Dataset
from ray.data._internal.arrow_block import _BATCH_SIZE_PRESERVING_STUB_COL_NAME
from ray.data._internal.util import RetryingPyFileSystem, _is_local_scheme
from ray.data.block import BlockMetadata
from ray.data.context import DataContext
from ray.data.datasource import Datasource, ReadTask
from ray.data.datasource.file_based_datasource import (
    FileShuffleConfig,
    _shuffle_file_metadata,
    _unwrap_s3_serialization_workaround,
    _validate_shuffle_arg,
    _wrap_s3_serialization_workaround,
)
from ray.data.datasource.partitioning import (
    Partitioning,
    PathPartitionFilter,
    PathPartitionParser,
)
from ray.data.datasource.path_util import (
    _has_file_extension,
    _resolve_paths_and_filesystem,
)

from ray_tfrecord.codec import BYTE_ARRAY_SCHEMA, RecordType, decode
from ray_tfrecord.framing import (
    CorruptionReport,
    detect_compression,
    iter_chunks,
    open_stream,
)
from ray_tfrecord.index import (
    is_index_path,
    index_path,
    load_index,
    read_fingerprint,
)
from ray_tfrecord.schema import infer_schema, read_stored_schema

logger = logging.getLogger(__name__)

Compression = Optional[Literal["auto", "gzip", "zlib"]]

PATH_COLUMN = "path"
# Hive's spelling of a null partition value (Spark writes it too).
HIVE_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"

_RECORD_TYPES = ("Example", "SequenceExample", "ByteArray")
_PARTITION_TYPES = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT_RE = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class _FileRange:
    """A piece of one file read by one read task."""

    path: str
    start: int
    end: Optional[int]  # None: to end of stream (always for compressed files)
    size: int  # on-disk bytes, for metadata and task packing
    num_rows: Optional[int]  # exact, when an index gave the boundaries
    resync: bool  # start is a guessed byte offset, not a known record boundary
    partitions: Tuple[Tuple[str, Any], ...]

    @property
    def whole_file(self) -> bool:
        return self.start == 0 and self.end is None


@dataclass(frozen=True)
class _ReadConfig:
    """Everything a read task needs besides its ranges (kept small: it is pickled
    into every task)."""

    filesystem: Any
    record_type: RecordType
    file_schema: pa.Schema  # record columns to decode, in decode order
    partition_schema: pa.Schema  # partition columns to attach
    include_path: bool
    output_names: Tuple[str, ...]
    compression: Compression
    verify_crc: bool
    on_corrupt: Literal["raise", "skip"]
    chunk_bytes: int
    ledger: Any = field(default=None)  # actor handle, skip mode only


@ray.remote(num_cpus=0)
class _CorruptionLedger:
    """Collects corruption reports from read tasks, keyed by ``(path, start)``:
    re-executing the dataset or retrying a task replaces a range's report instead
    of counting its bad records twice."""

    def __init__(self):
        self._reports: Dict[Tuple[str, int], CorruptionReport] = {}

    def record(self, key: Tuple[str, int], report: CorruptionReport) -> None:
        self._reports[key] = report

    def reports(self) -> List[CorruptionReport]:
        return list(self._reports.values())


class TFRecordDatasource(Datasource):
    """Reads TFRecord files (``tf.train.Example``, ``tf.train.SequenceExample`` or
    raw bytes) into Arrow blocks with the native codec.

    Use with ``ray.data.read_datasource(TFRecordDatasource(paths, ...))`` or through
    :func:`read_tfrecords`, which takes the same arguments.

    Args:
        paths: A file, a directory (read recursively), or a list of them. Any
            filesystem ``pyarrow.fs`` supports (local, ``s3://``, ``gs://``, HDFS...).
        record_type: ``"Example"``, ``"SequenceExample"`` or ``"ByteArray"`` (one
            ``binary`` column named ``record`` holding each record's payload).
        schema: Arrow schema of the record columns. When absent: the schema recorded by
            the ``write_tfrecords`` that wrote the directory (exact types: strings stay
            strings), else inferred (see ``infer_sample_records``). Partition and ``path``
            columns are added to it.
        columns: Columns to produce (record, partition or ``path`` columns), in this
            order. Only these record columns are decoded. ``Dataset.select_columns``
            after the read is pushed down the same way.
        compression: ``"auto"`` (default: detected per file from its first bytes),
            ``None`` (uncompressed), ``"gzip"`` or ``"zlib"`` for all files.
        verify_crc: Check each record's data CRC (the length CRC is always checked).
        on_corrupt: ``"raise"`` (default) raises
            :class:`~ray_tfrecord.errors.CorruptRecordError` naming the file and byte
            offset; ``"skip"`` drops bad records, logs them and counts them; the
            count is available from :meth:`corruption_report` after execution.
        filesystem: The ``pyarrow.fs.FileSystem`` to use; inferred from the paths
            when absent.
        partitioning: How directory names map to columns; Hive ``key=value`` by
            default, ``None`` to disable. Values are typed (see module docs) unless
            ``partitioning.field_types`` says otherwise.
        partition_filter: A ``PathPartitionFilter``; files it rejects are dropped
            after listing and never opened.
        include_paths: Add a ``path`` column with each row's file path.
        file_extensions: Only read files with one of these extensions. Default
            ``None`` reads every visible file: TFRecord files are often named without
            an extension (``train-00000-of-00100``).
        ignore_missing_paths: Skip paths that do not exist instead of raising.
        shuffle: ``"files"`` or a ``FileShuffleConfig`` to shuffle the file order.
        infer_sample_records: Records sampled to infer the schema, read from the
            first files in listing order (whole files while they fit in the sample).
            A feature absent from every sampled record is not in the schema; pass
            ``schema`` for sparse data.
        fixed_size_lists: Infer ``fixed_size_list`` columns for features whose value
            count is the same in every sampled record.
    """

    # A file is cut into ranges only if each range gets at least this many bytes:
    # smaller ranges cost more in task overhead than they gain in parallelism.
    _MIN_SPLIT_BYTES = 16 << 20
    # Schema inference opens at most this many files, however few records they hold.
    _INFER_MAX_FILES = 32
    # Threads used to read heads/tails/indexes of large files while planning.
    _PLANNING_THREADS = 16
    # Encoded bytes decoded per block: decoding into a few MiB at a time is ~1.5x faster
    # than one huge buffer (fresh pages fault in as a large output grows), and image-like
    # data grows ~5x when decoded, which still leaves blocks well under Ray's target size.
    _CHUNK_BYTES = 4 << 20

    def __init__(
        self,
        paths: Union[str, List[str]],
        *,
        record_type: RecordType = "Example",
        schema: Optional[pa.Schema] = None,
        columns: Optional[List[str]] = None,
        compression: Compression = "auto",
        verify_crc: bool = True,
        on_corrupt: Literal["raise", "skip"] = "raise",
        filesystem: Optional[pafs.FileSystem] = None,
        partitioning: Optional[Partitioning] = Partitioning("hive"),
        partition_filter: Optional[PathPartitionFilter] = None,
        include_paths: bool = False,
        file_extensions: Optional[List[str]] = None,
        ignore_missing_paths: bool = False,
        shuffle: Union[Literal["files"], FileShuffleConfig, None] = None,
        infer_sample_records: int = 10_000,
        fixed_size_lists: bool = False,
    ):
        super().__init__()
        if record_type not in _RECORD_TYPES:
            raise ValueError(f"record_type must be one of {_RECORD_TYPES}, got {record_type!r}")
        if compression not in ("auto", None, "gzip", "zlib"):
            raise ValueError(
                f"compression must be 'auto', None, 'gzip' or 'zlib', got {compression!r}"
            )
        if on_corrupt not in ("raise", "skip"):
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")
        _validate_shuffle_arg(shuffle)

        self._record_type = record_type
        self._compression = compression
        self._verify_crc = verify_crc
        self._on_corrupt = on_corrupt
        self._include_paths = include_paths
        self._shuffle = shuffle
        self._supports_distributed = not _is_local_scheme(paths)
        self._data_context = DataContext.get_current()

        resolved, fs = _resolve_paths_and_filesystem(paths, filesystem)
        self._filesystem = RetryingPyFileSystem.wrap(
            fs, retryable_errors=self._data_context.retried_io_errors
        )
        listed, self._sidecars, self._named_files = _list_files(
            resolved, self._filesystem, ignore_missing_paths
        )
        if not listed:
            raise ValueError(
                f"No TFRecord files found under {resolved}. Note that names starting "
                "with '.' or '_' are skipped."
            )
        if partition_filter is not None:
            keep = set(partition_filter([p for p, _ in listed]))
            listed = [(p, s) for p, s in listed if p in keep]
            if not listed:
                raise ValueError(
                    "No input files left after applying 'partition_filter'. "
                    "Please double check that it is set properly."
                )
        if file_extensions is not None:
            listed = [(p, s) for p, s in listed if _has_file_extension(p, file_extensions)]
            if not listed:
                raise ValueError(
                    f"No input files found with the file extensions {file_extensions}."
                )
        self._paths = [p for p, _ in listed]
        self._sizes = [s for _, s in listed]
        self._partition_schema, self._partitions = _parse_partitions(
            self._paths, partitioning
        )

        if record_type == "ByteArray":
            if schema is not None and schema != BYTE_ARRAY_SCHEMA:
                raise ValueError(
                    f"record_type='ByteArray' always produces {BYTE_ARRAY_SCHEMA}; "
                    f"got schema {schema}"
                )
            schema = BYTE_ARRAY_SCHEMA
        elif schema is None:
            # A dataset this package wrote records its exact schema; others are sampled.
            stored = read_stored_schema(self._filesystem, resolved[0], record_type) if len(resolved) == 1 else None
            if stored is not None:
                schema = stored.remove_metadata()
            else:
                schema = self._infer_schema(infer_sample_records, fixed_size_lists)
        # Partition values win over a record feature of the same name (as in Spark):
        # the directory is what the writer partitioned on.
        self._file_schema = pa.schema(
            [f for f in schema if f.name not in self._partition_schema.names]
        )
        self._projection_map: Optional[Dict[str, str]] = None
        if columns is not None:
            unknown = [c for c in columns if c not in self._all_columns()]
            if unknown:
                raise ValueError(
                    f"Unknown columns {unknown}; available: {self._all_columns()}"
                )
            self._projection_map = {c: c for c in columns}

        self._ledger = _CorruptionLedger.remote() if on_corrupt == "skip" else None

    # -- schema ------------------------------------------------------------------

    def _all_columns(self) -> List[str]:
        names = self._file_schema.names + self._partition_schema.names
        return names + [PATH_COLUMN] if self._include_paths else names

    def _infer_schema(self, sample_records: int, fixed_size_lists: bool) -> pa.Schema:
        def sample() -> Iterator:
            remaining = sample_records
            report = CorruptionReport()
            for path in self._paths[: self._INFER_MAX_FILES]:
                stream, found = open_stream(path, self._filesystem, self._compression)
                with contextlib.closing(stream):
                    for chunk in iter_chunks(
                        stream,
                        path=path,
                        compressed=bool(found),
                        verify_crc=self._verify_crc,
                        on_corrupt=self._on_corrupt,
                        report=report,
                        chunk_bytes=1 << 20,
                    ):
                        yield chunk
                        remaining -= len(chunk)
                        if remaining <= 0:
                            return

        return infer_schema(sample(), self._record_type, fixed_size_lists=fixed_size_lists)

    def output_schema(self) -> pa.Schema:
        """The schema of the blocks this datasource produces (after projection)."""
        fields = {f.name: f for f in self._file_schema}
        fields.update({f.name: f for f in self._partition_schema})
        if self._include_paths:
            fields[PATH_COLUMN] = pa.field(PATH_COLUMN, pa.string())
        names = self._all_columns() if self._projection_map is None else list(self._projection_map)
        return pa.schema([fields[n] for n in names if n in fields])

    # -- Ray Datasource interface -------------------------------------------------

    def supports_projection_pushdown(self) -> bool:
        return True

    @property
    def supports_distributed_reads(self) -> bool:
        return self._supports_distributed

    def estimate_inmemory_data_size(self) -> Optional[int]:
        if self._projection_map == {}:
            return 0  # nothing is materialised, only row counts
        return int(sum(self._sizes))

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: Optional[int] = None,
        data_context: Optional[DataContext] = None,
    ) -> List[ReadTask]:
        paths, sizes = self._paths, self._sizes
        execution_idx = data_context._execution_idx if data_context is not None else 0
        order = list(range(len(paths)))
        if self._shuffle is not None:
            paths, order = _shuffle_file_metadata(paths, order, self._shuffle, execution_idx)
            sizes = [self._sizes[i] for i in order]

        total = max(1, int(sum(sizes)))
        target = max(self._MIN_SPLIT_BYTES, math.ceil(total / max(1, parallelism)))
        ranges = self._plan_ranges(paths, sizes, [self._partitions[i] for i in order], target)

        config = self._read_config()
        schema = self.output_schema()
        tasks = []
        for group in _pack(ranges, target):
            rows = [r.num_rows for r in group]
            meta = BlockMetadata(
                # In skip mode a range may yield fewer rows than its index says.
                num_rows=sum(rows) if None not in rows and self._on_corrupt == "raise" else None,
                size_bytes=sum(r.size for r in group),
                input_files=list(dict.fromkeys(r.path for r in group)),
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    _read_fn(group, config),
                    meta,
                    schema=schema,
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

    # -- planning -----------------------------------------------------------------

    def _read_config(self) -> _ReadConfig:
        schema = self.output_schema()
        target = self._data_context.target_max_block_size or (128 << 20)
        return _ReadConfig(
            filesystem=_wrap_s3_serialization_workaround(self._filesystem),
            record_type=self._record_type,
            file_schema=pa.schema([f for f in schema if f.name in self._file_schema.names]),
            partition_schema=pa.schema(
                [f for f in schema if f.name in self._partition_schema.names]
            ),
            include_path=PATH_COLUMN in schema.names and self._include_paths,
            output_names=tuple(schema.names),
            compression=self._compression,
            verify_crc=self._verify_crc,
            on_corrupt=self._on_corrupt,
            chunk_bytes=int(min(target, self._CHUNK_BYTES)),
            ledger=self._ledger,
        )

    def _plan_ranges(
        self,
        paths: Sequence[str],
        sizes: Sequence[int],
        partitions: Sequence[Tuple[Tuple[str, Any], ...]],
        target: int,
    ) -> List[_FileRange]:
        splittable = self._compression in ("auto", None)
        large = [i for i, s in enumerate(sizes) if splittable and s >= 2 * target]
        with ThreadPoolExecutor(self._PLANNING_THREADS) as pool:
            probes = dict(zip(large, pool.map(lambda i: self._probe(paths[i], sizes[i]), large)))

        ranges = []
        for i, (path, size, parts) in enumerate(zip(paths, sizes, partitions)):
            probe = probes.get(i)
            if probe is None or probe == "compressed":
                ranges.append(_FileRange(path, 0, None, size, None, False, parts))
            elif probe == "unindexed":
                pieces = math.ceil(size / target)
                bounds = [size * k // pieces for k in range(pieces + 1)]
                ranges.extend(
                    _FileRange(path, a, b, b - a, None, k > 0, parts)
                    for k, (a, b) in enumerate(zip(bounds, bounds[1:]))
                )
            else:
                ranges.extend(
                    _FileRange(path, a, b, b - a, n, False, parts)
                    for a, b, n in probe.split(target)
                )
        return ranges

    def _probe(self, path: str, size: int):
        """Classify a large file: ``"compressed"``, ``"unindexed"`` or its current
        :class:`~ray_tfrecord.index.RecordIndex`."""
        head, tail = read_fingerprint(self._filesystem, path, size)
        if self._compression == "auto" and detect_compression(head[:16]) is not None:
            return "compressed"
        sidecar = index_path(path)
        # Listing already told us which sidecars exist in listed directories; for
        # files named explicitly we have to try opening the sidecar.
        if sidecar in self._sidecars or path in self._named_files:
            index = load_index(self._filesystem, path, size, head, tail)
            if index is not None:
                return index
        return "unindexed"


# -- read tasks -----------------------------------------------------------------


def _read_fn(ranges: List[_FileRange], config: _ReadConfig):
    """The body of one read task (a closure over its ranges only, so that a task
    does not carry the whole file list)."""

    def read_tfrecord_ranges() -> Iterator[pa.Table]:
        fs = _unwrap_s3_serialization_workaround(config.filesystem)
        for r in ranges:
            # CorruptionReport.add logs each skipped record; the ledger keeps counts.
            report = CorruptionReport()
            for chunk in _iter_range(fs, r, config, report):
                yield _to_block(chunk, r, config)
            if report.count:
                ray.get(config.ledger.record.remote((r.path, r.start), report))

    return read_tfrecord_ranges


def _iter_range(fs, r: _FileRange, config: _ReadConfig, report: CorruptionReport):
    options = dict(
        path=r.path,
        verify_crc=config.verify_crc,
        on_corrupt=config.on_corrupt,
        report=report,
        chunk_bytes=config.chunk_bytes,
    )
    if r.whole_file:
        stream, found = open_stream(r.path, fs, config.compression)
        try:
            size = None if found else r.size
            yield from iter_chunks(stream, size=size, compressed=bool(found), **options)
        finally:
            stream.close()
        return
    with fs.open_input_file(r.path) as f:
        f.seek(r.start)
        yield from iter_chunks(
            f, start=r.start, end=r.end, resync=r.resync, size=f.size(), **options
        )


def _to_block(chunk, r: _FileRange, config: _ReadConfig) -> pa.Table:
    n = len(chunk)
    # With no record column projected (Dataset.count() projects everything away)
    # decode returns a column-less batch that still carries the row count.
    table = pa.Table.from_batches([decode(chunk, config.file_schema, config.record_type)])
    values = dict(r.partitions)
    for f in config.partition_schema:
        table = table.append_column(f, pa.repeat(pa.scalar(values.get(f.name), f.type), n))
    if config.include_path:
        table = table.append_column(PATH_COLUMN, pa.repeat(pa.scalar(r.path, pa.string()), n))
    table = table.select(list(config.output_names))
    if table.num_columns == 0:
        # Ray counts a column-less table as empty; its stub column keeps the rows
        # (the same idiom as Ray's Parquet reader).
        table = table.append_column(_BATCH_SIZE_PRESERVING_STUB_COL_NAME, pa.nulls(n))
    return table


def _pack(ranges: List[_FileRange], target: int) -> List[List[_FileRange]]:
    """Group consecutive ranges into read tasks of about ``target`` bytes."""
    groups: List[List[_FileRange]] = []
    size = 0
    for r in ranges:
        if not groups or size + r.size > target:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += r.size
    return groups


# -- listing and partitions -------------------------------------------------------


def _is_hidden(relative_path: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative_path.split("/") if part)


def _list_files(
    paths: List[str], fs: pafs.FileSystem, ignore_missing: bool
) -> Tuple[List[Tuple[str, int]], frozenset, frozenset]:
    """Expand files and directories into ``(path, size)`` pairs (directories sorted,
    hidden names skipped at any depth), the set of index sidecars seen in listed
    directories, and the set of files named directly (whose sidecars were not
    listed)."""
    files: List[Tuple[str, int]] = []
    sidecars = set()
    named = set()
    for path, info in zip(paths, fs.get_file_info(paths)):
        if info.type == pafs.FileType.File:
            files.append((path, info.size))
            named.add(path)
        elif info.type == pafs.FileType.Directory:
            base = path.rstrip("/") + "/"
            found = []
            for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
                if not entry.is_file:
                    continue
                if is_index_path(entry.path):
                    sidecars.add(entry.path)
                relative = entry.path[len(base):] if entry.path.startswith(base) else entry.path
                if not _is_hidden(relative):
                    found.append((entry.path, entry.size))
            files.extend(sorted(found))
        elif not ignore_missing:
            raise FileNotFoundError(f"No such file or directory: {path}")
    return files, frozenset(sidecars), frozenset(named)


def _parse_partitions(
    paths: List[str], partitioning: Optional[Partitioning]
) -> Tuple[pa.Schema, List[Tuple[Tuple[str, Any], ...]]]:
    """Parse partition values from every path and type them; returns the partition
    schema and, per path, ``((name, typed value), ...)``."""
    if partitioning is None:
        return pa.schema([]), [()] * len(paths)
    parser = PathPartitionParser(partitioning)
    raw = [parser(p) for p in paths]
    names = list(dict.fromkeys(k for d in raw for k in d))
    explicit = partitioning.field_types or {}
    types = {}
    for name in names:
        if name in explicit:
            types[name] = _PARTITION_TYPES.get(explicit[name], pa.string())
        else:
            types[name] = _infer_partition_type(
                [d[name] for d in raw if d.get(name) not in (None, HIVE_NULL_PARTITION)]
            )

    def typed(name: str, value: Any) -> Any:
        if value is None or value == HIVE_NULL_PARTITION:
            return None
        if name in explicit or types[name] == pa.string():
            return value
        if types[name] == pa.int64():
            return int(value)
        if types[name] == pa.float64():
            return float(value)
        return value == "true"

    schema = pa.schema([pa.field(n, types[n]) for n in names])
    values = [tuple((n, typed(n, d.get(n))) for n in names) for d in raw]
    return schema, values


def _infer_partition_type(values: List[str]) -> pa.DataType:
    # Only exact round-trips count as integers, so "007" (a code, not a number)
    # stays a string.
    if values and all(_INT_RE.fullmatch(v) and -(2**63) <= int(v) < 2**63 for v in values):
        return pa.int64()
    if values and all(_FLOAT_RE.fullmatch(v) for v in values):
        return pa.float64()
    if values and all(v in ("true", "false") for v in values):
        return pa.bool_()
    return pa.string()


def _default_read_tasks(datasource: TFRecordDatasource) -> int:
    """One read task per CPU, more only when blocks would otherwise exceed Ray's target size.

    Ray's own default asks for at least 200 read blocks and, with fewer read tasks than that,
    splits every task's output k ways (one more copy of each block). Our read tasks already stream
    blocks of a few MiB, which gives downstream operators their parallelism; measured on 2 CPUs the
    split costs 2-3x in read throughput.
    """
    if not ray.is_initialized():
        ray.init()  # what read_datasource would do anyway
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = datasource.estimate_inmemory_data_size() or 0
    target = DataContext.get_current().target_max_block_size or (128 << 20)
    return max(cpus, math.ceil(size / target))


def read_tfrecords(
    paths: Union[str, List[str]],
    *,
    record_type: RecordType = "Example",
    schema: Optional[pa.Schema] = None,
    columns: Optional[List[str]] = None,
    compression: Compression = "auto",
    verify_crc: bool = True,
    on_corrupt: Literal["raise", "skip"] = "raise",
    filesystem: Optional[pafs.FileSystem] = None,
    partitioning: Optional[Partitioning] = Partitioning("hive"),
    partition_filter: Optional[PathPartitionFilter] = None,
    include_paths: bool = False,
    file_extensions: Optional[List[str]] = None,
    ignore_missing_paths: bool = False,
    shuffle: Union[Literal["files"], FileShuffleConfig, None] = None,
    infer_sample_records: int = 10_000,
    fixed_size_lists: bool = False,
    override_num_blocks: Optional[int] = None,
    concurrency: Optional[int] = None,
    num_cpus: Optional[float] = None,
    memory: Optional[float] = None,
    ray_remote_args: Optional[Dict[str, Any]] = None,
) -> Dataset:
    """Read TFRecord files into a :class:`ray.data.Dataset`.

    Takes the arguments of :class:`TFRecordDatasource` plus the usual Ray read
    arguments (``override_num_blocks``, ``concurrency``, ``num_cpus``, ``memory``,
    ``ray_remote_args``). ``override_num_blocks`` defaults to one read task per CPU in
    the cluster (more for data larger than that many target-size blocks), not Ray's
    200: each task streams blocks of a few MiB already. To retrieve the count of records skipped with
    ``on_corrupt="skip"``, build the :class:`TFRecordDatasource` yourself and call
    its :meth:`~TFRecordDatasource.corruption_report` after executing the dataset.

    Example:
        >>> import ray_tfrecord
        >>> ds = ray_tfrecord.read_tfrecords(  # doctest: +SKIP
        ...     "/data/train", columns=["label", "image"], on_corrupt="skip")
    """
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
        override_num_blocks = _default_read_tasks(datasource)
    return ray.data.read_datasource(
        datasource,
        override_num_blocks=override_num_blocks,
        concurrency=concurrency,
        num_cpus=num_cpus,
        memory=memory,
        ray_remote_args=ray_remote_args,
    )
