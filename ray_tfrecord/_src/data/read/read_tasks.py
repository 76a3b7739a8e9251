"""What one read task of ``TFRecordDatasource`` does: stream the
framed records of its byte ranges (``ray_tfrecord._src.data.read.planning``), decode them with the native
codec and attach the partition and ``path`` columns, one block per chunk.

The datasource plans the tasks on the driver; everything here runs in the task, from a
``ReadConfig`` and the task's ranges. On an object store every read is a round trip (20 ms and
more), so there a task opens the next files in threads while it decodes one, each small file whole in
its first request (``OBJECT_FIRST_READ_BYTES``): one GET a file on GCS,
a HEAD and a GET on S3 (pyarrow's S3 client asks for the size first).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import ray

from ray_tfrecord._src.core import options, sizes
from ray_tfrecord._src.core.codec import RecordType, decode
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.framing import ByteStream, CorruptionReport, RecordChunk, iter_chunks, open_stream
from ray_tfrecord._src.core.manifest import explain_missing
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.read.planning import FileRange
from ray_tfrecord._src.data.task_errors import from_task

#: The compression argument of the readers: detected per file, none, or one for all files.
Compression = Literal["auto", "gzip", "zlib"] | None

#: The column ``include_paths=True`` adds: each row's file path.
PATH_COLUMN = "path"

# Files a task opens at once ahead of the one it decodes, and how many it keeps opened ahead at most.
_OPEN_THREADS = 16
_MAX_AHEAD = 2 * _OPEN_THREADS

_Opened = tuple[ByteStream, options.Compression | None]


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
    read_ahead: bool = False  # open files ahead, in threads: an object store, where each open is a round trip

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
        with contextlib.closing(_opened_ahead(fs, ranges, config)) as opened:
            for r, stream in opened:
                # CorruptionReport.add logs each skipped record; the ledger keeps counts.
                report = CorruptionReport()
                try:
                    for chunk in _iter_range(fs, r, config, report, stream):
                        yield _to_block(chunk, r, record_schema, config)
                except TFRecordError as e:
                    raise from_task(e) from None
                if report.count:
                    ray.get(config.ledger.record.remote((r.path, r.start), report))

    return read_tfrecord_ranges


def _first_read(r: FileRange) -> int:
    """The bytes a whole file's open reads: all of a small file, and one more to find a file that grew."""
    return min(r.size + 1, sizes.OBJECT_FIRST_READ_BYTES) if r.whole_file else 0


def _opened_ahead(fs: pafs.FileSystem, ranges: list[FileRange],
                  config: ReadConfig) -> Generator[tuple[FileRange, _Opened | None], None, None]:
    """Each range, in order, with its file already opened when it is a whole file and ``config.read_ahead``
    (else ``None``: the range is opened in its turn). The opens run in threads ahead of the range being
    decoded, holding at most ``OBJECT_READ_AHEAD_BYTES`` of first reads; a task that stops early (a row
    limit) closes what it opened."""
    if not config.read_ahead:
        for r in ranges:
            yield r, None
        return

    def open_whole(whole: FileRange) -> _Opened:
        with explain_missing(fs, whole.path):
            return open_stream(whole.path, fs, config.compression, first_read=_first_read(whole))

    ahead: deque[tuple[FileRange, Future[_Opened] | None]] = deque()
    held, following = 0, iter(ranges)
    pool = ThreadPoolExecutor(_OPEN_THREADS)
    try:
        nxt = next(following, None)
        while ahead or nxt is not None:
            while nxt is not None and (not ahead or (len(ahead) < _MAX_AHEAD
                                                     and held + _first_read(nxt) <= sizes.OBJECT_READ_AHEAD_BYTES)):
                ahead.append((nxt, pool.submit(open_whole, nxt) if nxt.whole_file else None))
                held += _first_read(nxt)
                nxt = next(following, None)
            current, opening = ahead.popleft()
            held -= _first_read(current)
            yield current, None if opening is None else opening.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for _, opening in ahead:
            if opening is not None and not opening.cancelled() and opening.exception() is None:
                opening.result()[0].close()


def _iter_range(fs: pafs.FileSystem, r: FileRange, config: ReadConfig,
                report: CorruptionReport, opened: _Opened | None) -> Iterator[RecordChunk]:
    if r.whole_file:
        with explain_missing(fs, r.path):
            stream, found = opened or open_stream(r.path, fs, config.compression)
        with contextlib.closing(stream):
            yield from iter_chunks(stream, path=r.path, verify_crc=config.verify_crc, on_corrupt=config.on_corrupt,
                                   report=report, chunk_bytes=config.chunk_bytes,
                                   size=None if found else r.size, compressed=bool(found))
        return
    with explain_missing(fs, r.path):
        f = fs.open_input_file(r.path)
    with f:
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
