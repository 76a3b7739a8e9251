"""What one read task of :class:`~ray_tfrecord._src.io.datasource.TFRecordDatasource` does: stream the
framed records of its byte ranges (:mod:`ray_tfrecord._src.io.planning`), decode them with the native
codec and attach the partition and ``path`` columns, one block per chunk.

The datasource plans the tasks on the driver; everything here runs in the task, from a
:class:`ReadConfig` and the task's ranges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import ray

from ray_tfrecord._src.core import options
from ray_tfrecord._src.core.codec import RecordType, decode
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.framing import CorruptionReport, RecordChunk, iter_chunks, open_stream
from ray_tfrecord._src.io import compat
from ray_tfrecord._src.io.planning import FileRange
from ray_tfrecord._src.io.task_errors import from_task

__all__ = ["PATH_COLUMN", "Compression", "ReadConfig", "read_ranges"]

#: The compression argument of the readers: detected per file, none, or one for all files.
Compression = Literal["auto", "gzip", "zlib"] | None

#: The column ``include_paths=True`` adds: each row's file path.
PATH_COLUMN = "path"


@dataclass(frozen=True)
class ReadConfig:
    """Everything a read task needs besides its ranges (kept small: it is pickled
    into every task)."""

    filesystem: Any  # the listing's filesystem, made pickleable (compat.pickleable_filesystem)
    record_type: RecordType
    schema: pa.Schema  # the output columns, in order
    attached: frozenset[str]  # output columns taken from the range (partitions, path), not decoded
    compression: Compression
    verify_crc: bool
    on_corrupt: options.OnCorrupt
    chunk_bytes: int
    ledger: Any = field(default=None)  # the datasource's corruption ledger (an actor), skip mode only

    @property
    def record_schema(self) -> pa.Schema:
        """The record columns to decode, in decode order."""
        return pa.schema([f for f in self.schema if f.name not in self.attached])


def read_ranges(ranges: list[FileRange], config: ReadConfig) -> Callable[[], Iterator[pa.Table]]:
    """The body of one read task (a closure over its ranges only, so that a task
    does not carry the whole file list)."""

    def read_tfrecord_ranges() -> Iterator[pa.Table]:
        fs = compat.unpickled_filesystem(config.filesystem)
        record_schema = config.record_schema
        for r in ranges:
            # CorruptionReport.add logs each skipped record; the ledger keeps counts.
            report = CorruptionReport()
            try:
                for chunk in _iter_range(fs, r, config, report):
                    yield _to_block(chunk, r, record_schema, config)
            except TFRecordError as e:
                raise from_task(e) from None
            if report.count:
                ray.get(config.ledger.record.remote((r.path, r.start), report))

    return read_tfrecord_ranges


def _iter_range(fs: pafs.FileSystem, r: FileRange, config: ReadConfig,
                report: CorruptionReport) -> Iterator[RecordChunk]:
    if r.whole_file:
        stream, found = open_stream(r.path, fs, config.compression)
        with contextlib.closing(stream):
            yield from iter_chunks(stream, path=r.path, verify_crc=config.verify_crc, on_corrupt=config.on_corrupt,
                                   report=report, chunk_bytes=config.chunk_bytes,
                                   size=None if found else r.size, compressed=bool(found))
        return
    with fs.open_input_file(r.path) as f:
        f.seek(r.start)
        yield from iter_chunks(f, path=r.path, verify_crc=config.verify_crc, on_corrupt=config.on_corrupt,
                               report=report, chunk_bytes=config.chunk_bytes,
                               start=r.start, end=r.end, resync=r.resync, size=f.size())


def _to_block(chunk: RecordChunk, r: FileRange, record_schema: pa.Schema, config: ReadConfig) -> pa.Table:
    n = len(chunk)
    # With no record column projected (Dataset.count() projects everything away)
    # decode returns a column-less batch that still carries the row count.
    table = pa.Table.from_batches([decode(chunk, record_schema, config.record_type)])
    values = {**dict(r.partitions), PATH_COLUMN: r.path}
    for f in config.schema:
        if f.name in config.attached:
            table = table.append_column(f, pa.repeat(pa.scalar(values.get(f.name), f.type), n))
    table = table.select(config.schema.names)
    if table.num_columns == 0:
        # Ray counts a column-less table as empty; its stub column keeps the rows
        # (the same idiom as Ray's Parquet reader).
        table = table.append_column(compat.ROW_COUNT_STUB_COLUMN, pa.nulls(n))
    return table
