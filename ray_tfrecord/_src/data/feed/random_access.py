"""Random access over plain TFRecord: ``TFRecordSource``, the record at any global index.

A dataset's records are numbered in plan order (``plan_splits``: files in listing order, records in
file order); a global index finds its split by a binary search over the splits' cumulative row
counts. A split is also the unit of reading here, a *block*: the first time a process touches one,
it reads the whole block in one request, checks every CRC in it and keeps, for good, where each of
its records starts (4 bytes a record), and keeps the block's bytes in a small per-process cache
(``cache_bytes``, least recently used). Then a record costs one ranged read of its own frame, its
CRCs checked, unless its block is cached; records of one block asked together are read in one
request (``_HOLE_BYTES`` apart or closer), and a second miss in the block missed last reads the
block whole again where the cache will keep it, so reading in order costs two requests a block, not
one a record. A batch is decoded by one native call: from the one buffer that holds its records, or
their frames gathered into one buffer in the order asked.

Nothing open travels in a pickle: a Grain or PyTorch worker process opens its files and builds its
offsets and cache itself, on first use (and again after a ``fork``).

GZIP/ZLIB files are refused: a record inside one cannot be reached without decompressing the file up
to it, and a cache of whole decompressed files would make a miss cost a file's decompression.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.codec import BYTE_ARRAY_SCHEMA, Decoder
from ray_tfrecord._src.core.errors import DecodeError, TFRecordError
from ray_tfrecord._src.core.feature_specs import SchemaLike
from ray_tfrecord._src.core.framing import FRAME_OVERHEAD, RecordChunk, iter_chunks
from ray_tfrecord._src.core.manifest import explain_missing
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.feed.splits import SplitPlan, plan_splits
from ray_tfrecord._src.data.read.read_tasks import PATH_COLUMN, Compression

#: Bytes per block when ``TFRecordSource`` plans the files itself: what a process reads the first time it
#: touches a block. Larger blocks cost fewer requests in a first epoch and more bytes per first touch.
DEFAULT_BLOCK_BYTES = sizes.MiB
#: The per-process block cache: whole blocks, least recently used out first.
DEFAULT_CACHE_BYTES = 64 * sizes.MiB
# Wanted records of one block this close (bytes between them) are read in one request: on an object
# store a request costs a round trip (20 ms) against well under a millisecond for 64 KiB more.
_HOLE_BYTES = 64 << 10
# Open files kept per process (each a file descriptor on local disk; a HEAD request to reopen on S3).
_OPEN_FILES = 128


@public("ray_tfrecord")
class TFRecordSource:
    """The records of TFRecord files by global index: a Grain data source and a PyTorch map-style dataset.

    ``len(source)`` is the number of records, ``source[i]`` record ``i`` (numbered in file order, files
    in listing order, as [`read_tfrecords`][ray_tfrecord.read_tfrecords] lists them) as a dict of
    its columns: a NumPy scalar for a scalar column, a NumPy array for a list column, ``bytes`` or
    ``str`` for a binary or string one, ``None`` for a missing feature; with ``raw=True`` the record's
    serialized ``tf.train.Example`` bytes instead. ``source.__getitems__(indices)`` returns a list of
    them (PyTorch's batched fetch; Grain calls it ``_getitems``), and ``source.take(indices)`` the
    same rows as a ``pyarrow.Table``. Every read checks the records' CRCs and is decoded by the native
    codec, one call per batch; the reads and their cache are described in
    [JAX, PyTorch and Grain](../jax-pytorch-grain.md).

    Args:
        source: a dataset directory, file, glob or list of them (listed as ``read_tfrecords`` lists
            them), or a plan of [`plan_splits`][ray_tfrecord.plan_splits], whose splits are then the
            blocks.
        schema: the columns to decode, in any dialect ``read_tfrecords`` takes; ``None`` reads the schema
            the writer recorded. Only with paths (a plan holds its schema).
        columns: the columns to return (partition columns of Hive directories included), in this order;
            ``None``: all.
        raw: return each record's serialized bytes, undecoded.
        filesystem: a ``pyarrow.fs`` filesystem (``None``: from the paths, as ``read_tfrecords``).
        block_bytes: bytes per block when planning the paths.
        cache_bytes: the per-process block cache's size; 0 keeps no bytes (only the record offsets).

    Raises:
        TFRecordError: a GZIP/ZLIB file (naming it), a damaged record (file and offset) or a record that
            does not fit its column (file, offset and column); ``IndexError`` for an index out of range.

    Example:
        >>> import ray, ray_tfrecord
        >>> ds = ray.data.from_items([{"x": i} for i in range(10)])  # doctest: +SKIP
        >>> ray_tfrecord.write_tfrecords(ds, "/tmp/ten", mode="overwrite")  # doctest: +SKIP
        >>> source = ray_tfrecord.TFRecordSource("/tmp/ten")  # doctest: +SKIP
        >>> record = source[3]  # doctest: +SKIP
        >>> len(source), int(record["x"])  # doctest: +SKIP
        (10, 3)
    """

    def __init__(self, source: str | os.PathLike | Sequence[str] | SplitPlan, *, schema: SchemaLike | None = None,
                 columns: Sequence[str] | None = None, raw: bool = False, filesystem: pafs.FileSystem | None = None,
                 compression: Compression = "auto", block_bytes: int = DEFAULT_BLOCK_BYTES,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be 0 or more, got {cache_bytes}")
        if isinstance(source, SplitPlan):
            if schema is not None or filesystem is not None:
                raise ValueError("a plan holds its schema and filesystem: pass schema= and filesystem= to "
                                 "plan_splits, not to TFRecordSource")
            plan = source
        else:
            plan = plan_splits([os.fspath(source)] if isinstance(source, str | os.PathLike) else list(source),
                               schema=schema, split_bytes=block_bytes, filesystem=filesystem, compression=compression)
        whole = next((s for s in plan.splits if s.end is None), None)
        if whole is not None:
            raise TFRecordError("a GZIP/ZLIB-compressed file: a record in it cannot be read without decompressing "
                                "the file up to it, so TFRecordSource reads only uncompressed files; write the "
                                "dataset again uncompressed (write_tfrecords(read_tfrecords(path), new_path)), or "
                                "read it in order (read_tfrecords)", path=whole.path)
        available = plan.columns(include_paths=True)
        names = [f.name for f in available if f.name != PATH_COLUMN] if columns is None else list(columns)
        missing = [c for c in names if c not in available.names]
        if missing:
            raise ValueError(f"columns={missing} are not among the dataset's columns {available.names}")
        attached = {*plan.partition_schema.names, PATH_COLUMN}
        self._names = names
        self._raw = raw
        self._schema = BYTE_ARRAY_SCHEMA if raw else pa.schema([plan.schema.field(c) for c in names
                                                                if c not in attached])
        self._filesystem = plan.filesystem
        self._cache_bytes = cache_bytes
        paths = list(dict.fromkeys(s.path for s in plan.splits))
        number = {p: i for i, p in enumerate(paths)}
        self._paths = tuple(paths)
        self._file = np.array([number[s.path] for s in plan.splits], np.int64)
        self._start = np.array([s.start for s in plan.splits], np.int64)
        self._size = np.array([s.size for s in plan.splits], np.int64)
        self._first = np.concatenate([[0], np.cumsum([s.rows for s in plan.splits], dtype=np.int64)])
        # Partition and path columns: one value a file, taken per record by its file's number.
        values = dict(plan.partitions)
        self._attached = {} if raw else {
            c: pa.array([p if c == PATH_COLUMN else dict(values.get(p, ())).get(c) for p in paths],
                        available.field(c).type) for c in names if c in attached}
        self._local: _Local | None = None

    def __len__(self) -> int:
        return int(self._first[-1])

    def __repr__(self) -> str:
        # Grain's DataLoader checks a checkpoint against its source's repr: it names the same records.
        return (f"TFRecordSource({len(self)} records in {len(self._paths)} files from {self._paths[:1]}, "
                f"columns={self._names}, raw={self._raw})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None}

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The records at ``indices``, in that order (PyTorch's batched fetch)."""
        batch = self._batch(indices)
        if self._raw:
            return batch.column(0).to_pylist()
        columns = [_values(c) for c in batch.columns]
        return [dict(zip(self._names, row)) for row in zip(*columns)]

    # Grain's name for the batched read (its SupportsBatchedReadRandomAccessDataSource protocol).
    _getitems = __getitems__

    def take(self, indices: Sequence[int]) -> pa.Table:
        """The records at ``indices``, in that order, as a table of the source's columns (with ``raw``
        one ``record`` column of serialized records)."""
        return pa.Table.from_batches([self._batch(indices)])

    def _batch(self, indices: Sequence[int]) -> pa.RecordBatch:
        local = self._process()
        chunk, where, files = local.frames(self, _checked(indices, len(self)))
        try:
            batch = local.decoder.decode(chunk)
        except DecodeError as e:
            if where is None:
                raise
            # Located in the gathered buffer; the caller needs the file and the record's offset there.
            path, offset = where(e.offset) if e.offset is not None else (None, None)
            raise DecodeError(e.reason, path=path, offset=offset, column=e.column) from None
        if not self._attached:
            return batch
        columns = dict(zip(batch.schema.names, batch.columns))
        columns.update((name, per_file.take(pa.array(files))) for name, per_file in self._attached.items())
        return pa.record_batch([columns[n] for n in self._names], names=self._names)

    def _process(self) -> _Local:
        local = self._local
        if local is None or local.pid != os.getpid():
            # First use in this process (unpickled, or forked with its parent's open files).
            local = self._local = _Local(self)
        return local


class _Local:
    """One process's reading state: open files, each touched block's record offsets, the block cache."""

    def __init__(self, source: TFRecordSource) -> None:
        self.pid = os.getpid()
        self.fs = compat.unpickled_filesystem(source._filesystem)
        self.decoder = Decoder(source._schema, "ByteArray" if source._raw else "Example")
        self.lock = threading.Lock()
        self.offsets: dict[int, np.ndarray] = {}  # block -> its records' starts and its end, from the block's start
        self.blocks: OrderedDict[int, np.ndarray] = OrderedDict()  # block -> its bytes
        self.cache_limit = source._cache_bytes
        self.cached = 0
        self.files: OrderedDict[int, Any] = OrderedDict()
        self.last_miss = -1

    def frames(self, source: TFRecordSource, wanted: np.ndarray) -> tuple[RecordChunk, Any, np.ndarray]:
        """The frames of records ``wanted`` as one chunk, in that order; a function from a position in it
        to (file, offset), or ``None`` where the chunk is one file's and so says it itself; and each
        record's file number."""
        if len(wanted) == 1:
            # One record (Grain asks for them one by one): the steps below on plain integers, where their
            # NumPy calls on arrays of one cost more than the read.
            b = int(np.searchsorted(source._first, wanted[0], side="right")) - 1
            r = int(wanted[0] - source._first[b])
            offsets, fresh = self.block_offsets(source, b)
            ((buffer, at, _),) = [(fresh, 0, None)] if fresh is not None else self.sources(source, b, offsets,
                                                                                            np.array([r]))
            start, end, file = int(offsets[r]), int(offsets[r + 1]), source._file[b:b + 1]
            return (RecordChunk(buffer, np.array([start - at]), np.array([end - start - FRAME_OVERHEAD]),
                                int(source._start[b]) + at, source._paths[file[0]]), None, file)
        # Each record read once, however often it is asked for.
        unique, slot = np.unique(wanted, return_inverse=True)
        block = np.searchsorted(source._first, unique, side="right") - 1
        record = unique - source._first[block]
        parts: list[tuple[np.ndarray, int, np.ndarray, np.ndarray]] = []  # buffer, its start, offsets, records
        starts = np.empty(len(unique), np.int64)  # each unique record's frame, from its block's start
        ends = np.empty(len(unique), np.int64)
        cuts = np.flatnonzero(np.diff(block)) + 1
        for lo, hi in zip([0, *cuts], [*cuts, len(unique)]) if len(unique) else ():
            b, records = int(block[lo]), record[lo:hi]
            offsets, fresh = self.block_offsets(source, b)
            starts[lo:hi], ends[lo:hi] = offsets[records], offsets[records + 1]
            held = [(fresh, 0, records)] if fresh is not None else self.sources(source, b, offsets, records)
            parts += [(buffer, at, offsets, rs) for buffer, at, rs in held]
        lengths = (ends - starts - FRAME_OVERHEAD)[slot]
        files = source._file[block]
        if len(parts) == 1:
            # One buffer holds them all (a cached block, one read): decoded where they lie, no copy.
            buffer, at, _, _ = parts[0]
            b = int(block[0])
            return (RecordChunk(buffer, (starts - at)[slot], lengths, int(source._start[b]) + at,
                                source._paths[source._file[b]]), None, files[slot])
        placed = np.concatenate([[0], np.cumsum(ends - starts)])
        out = np.empty(int(placed[-1]), np.uint8)
        k = 0
        for buffer, at, offsets, rs in parts:
            # Runs of consecutive records: one copy each.
            breaks = np.flatnonzero(np.diff(rs) != 1) + 1
            for a, z in zip([0, *breaks], [*breaks, len(rs)]):
                lo_, hi_ = int(offsets[rs[a]]) - at, int(offsets[rs[z - 1] + 1]) - at
                out[placed[k + a]:placed[k + a] + hi_ - lo_] = buffer[lo_:hi_]
            k += len(rs)
        positions = placed[:-1]

        def where(position: int) -> tuple[str, int]:
            u = int(np.searchsorted(positions, position, side="right")) - 1
            return source._paths[files[u]], int(source._start[block[u]] + starts[u])

        return RecordChunk(out, positions[slot], lengths, 0, "gathered records"), where, files[slot]

    def block_offsets(self, source: TFRecordSource, b: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Where block ``b``'s records start (and its end), from the block's start; and the block's bytes
        where this call read them (its first touch)."""
        offsets = self.offsets.get(b)
        if offsets is not None:
            return offsets, None
        # First touch: the whole block, every CRC checked, its records' starts kept.
        buffer, starts = self.read(source, b, 0, int(source._size[b]), int(source._first[b + 1] - source._first[b]))
        offsets = np.append(starts, source._size[b]).astype(np.uint32 if source._size[b] < 2**32 else np.int64)
        with self.lock:
            self.offsets[b] = offsets
            self.keep(b, buffer)
        return offsets, buffer

    def sources(self, source: TFRecordSource, b: int, offsets: np.ndarray,
                records: np.ndarray) -> list[tuple[np.ndarray, int, np.ndarray]]:
        """Buffers holding ``records`` of block ``b``: (buffer, its offset in the block, its records)."""
        with self.lock:
            cached = self.blocks.get(b)
            if cached is not None:
                self.blocks.move_to_end(b)
                return [(cached, 0, records)]
            again, self.last_miss = self.last_miss == b and source._size[b] <= self.cache_limit, b
        if again:
            # A second miss in a row in this block: reading in order, so read the block whole again (where
            # the cache will keep it).
            buffer, _ = self.read(source, b, 0, int(source._size[b]), int(source._first[b + 1] - source._first[b]))
            with self.lock:
                self.keep(b, buffer)
            return [(buffer, 0, records)]
        # Records close together in one request: the bytes between them are read and checked too.
        gaps = offsets[records[1:]].astype(np.int64) - offsets[records[:-1] + 1]
        breaks = np.flatnonzero(gaps > _HOLE_BYTES) + 1
        out = []
        for lo, hi in zip([0, *breaks], [*breaks, len(records)]):
            first, last = int(records[lo]), int(records[hi - 1])
            at = int(offsets[first])
            buffer, _ = self.read(source, b, at, int(offsets[last + 1]) - at, last + 1 - first)
            out.append((buffer, at, records[lo:hi]))
        return out

    def read(self, source: TFRecordSource, b: int, at: int, nbytes: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``nbytes`` of block ``b`` from ``at``, ``count`` whole records, CRCs checked: the bytes and
        where each record starts, from the block's start."""
        path, offset = source._paths[source._file[b]], int(source._start[b]) + at
        data = self.file(source, int(source._file[b])).read_at(nbytes, offset)
        chunks = list(iter_chunks(pa.BufferReader(data), path=path, start=offset, end=offset + nbytes,
                                  size=offset + nbytes, chunk_bytes=max(1, nbytes)))
        found = sum(len(c) for c in chunks)
        if len(data) != nbytes or found != count:
            raise TFRecordError(f"{found} records in {len(data)} bytes from here where the plan counted {count} "
                                f"in {nbytes}; the file changed since it was planned: make the source again",
                                path=path, offset=offset)
        (chunk,) = chunks
        return np.asarray(chunk.buffer), chunk.positions + at

    def keep(self, b: int, buffer: np.ndarray) -> None:
        """Cache block ``b``'s bytes (the lock held), dropping the least recently used over the limit."""
        if b in self.blocks or len(buffer) > self.cache_limit:
            return
        self.blocks[b] = buffer
        self.cached += len(buffer)
        while self.cached > self.cache_limit:
            self.cached -= len(self.blocks.popitem(last=False)[1])

    def file(self, source: TFRecordSource, f: int) -> Any:
        with self.lock:
            handle = self.files.get(f)
            if handle is not None:
                self.files.move_to_end(f)
                return handle
        with explain_missing(self.fs, source._paths[f]):
            handle = self.fs.open_input_file(source._paths[f])
        with self.lock:
            self.files[f] = handle
            while len(self.files) > _OPEN_FILES:
                # Not closed here: another thread may be reading it; it closes when the last one lets go.
                self.files.popitem(last=False)
        return handle


def _checked(indices: Sequence[int], n: int) -> np.ndarray:
    """``indices`` as int64, negative ones counted from the end as a sequence's are."""
    wanted = np.asarray(indices)
    if wanted.size == 0:
        return np.empty(0, np.int64)
    if wanted.ndim != 1 or wanted.dtype.kind not in "iu":
        raise TypeError(f"record indices are integers, one a record; got {wanted.dtype} of shape {wanted.shape}")
    wanted = wanted.astype(np.int64)
    outside = (wanted < -n) | (wanted >= n)
    if outside.any():
        raise IndexError(f"record index {wanted[outside][0]} is out of range: the source holds {n} records")
    return np.where(wanted < 0, wanted + n, wanted)


def _values(array: pa.Array) -> Any:
    """A column's values, one a record: NumPy's (a scalar, or an array viewing the list's values), except
    where NumPy would turn a missing feature of a scalar column into NaN: Python values, ``None`` for it."""
    if array.null_count and pa.types.is_primitive(array.type):
        return array.to_pylist()
    return array.to_numpy(zero_copy_only=False)
