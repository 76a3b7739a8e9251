"""Record indexes for planning: scanned in Ray tasks spread over the cluster, and kept for the next plan.

``plan_splits`` needs every file's record count and, to cut an
uncompressed file into splits, record boundaries: an index (``ray_tfrecord._src.core.index``). A file
whose sidecar is missing or stale is scanned once, every record's CRC checked, in a Ray task
(``SPREAD``: the bytes are read on the cluster's nodes, not all through the driver); a GZIP/ZLIB
file is decompressed once to count its records.  What a scan finds is kept:

- as the file's index sidecar (the layout the datasink writes, at the dataset root) where the
  dataset is one this package wrote (its root holds the recorded schema, ``_tfrecord_schema.arrow``)
  and can be written: a directory another writer made (TensorFlow's, Spark's) stays as that writer
  left it, since a ``dir/*`` glob there would match a sidecar;
- else, and always for a compressed file's count, in this machine's index cache
  (``$RAY_TFRECORD_CACHE_DIR``, by default ``~/.cache/ray_tfrecord/index``), one file per data
  file keyed by its filesystem and path.

Planning the same files again then reads, per file, its fingerprint (the first and last 4 KiB,
which tell a file changed since it was indexed, as for every sidecar) and the kept index: no other
record byte.  Without a running Ray (``ray.init()`` not called) the scans run in threads here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import ray

from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.framing import iter_chunks, open_stream
from ray_tfrecord._src.core.index import (
    IndexBuilder,
    IndexFormatError,
    RecordIndex,
    build_index,
    dataset_root,
    read_fingerprint,
    write_index,
)
from ray_tfrecord._src.core.layout import SCHEMA_FILE
from ray_tfrecord._src.core.manifest import explain_missing
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.read.listing import DataFile
from ray_tfrecord._src.data.read.planning import ProbeKind, probe_file
from ray_tfrecord._src.data.read.read_tasks import Compression
from ray_tfrecord._src.data.task_errors import fetched, from_task

#: The environment variable naming the index cache's directory.
CACHE_DIR_ENV = "RAY_TFRECORD_CACHE_DIR"

# Files looked at (a fingerprint and a sidecar: a few small reads each) at once on the driver.
_PROBE_THREADS = 8
# A scan task's share: files of at most this many bytes in all, and at most this many files, so that
# a directory of many small files makes few tasks and one of a few large files spreads them.
_TASK_BYTES = 256 * sizes.MiB
_TASK_FILES = 64


@dataclasses.dataclass(frozen=True)
class FileIndex:
    """A file's record index; ``compressed``: a GZIP/ZLIB file, whose index has its record count and
    no boundaries (it is read whole)."""

    index: RecordIndex
    compressed: bool


def cache_dir() -> str:
    """Where scanned indexes are kept when the dataset's directory takes no sidecar."""
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ray_tfrecord", "index")


def file_indexes(fs: pafs.FileSystem, files: Sequence[DataFile], compression: Compression, spacing_bytes: int, *,
                 keep: bool) -> list[FileIndex]:
    """Every file's index, in order: its current sidecar, else the cache's, else a scan (kept as a
    sidecar or in the cache unless ``keep`` is false). Raises the scan's
    ``CorruptRecordError`` for a damaged file."""
    with ThreadPoolExecutor(_PROBE_THREADS) as pool:
        known = list(pool.map(lambda f: _known(fs, f, compression), files))
    missing = [f for f, k in zip(files, known, strict=True) if k is None]
    scanned = dict(zip((f.path for f in missing), _scan_all(fs, missing, compression, spacing_bytes), strict=True))
    if keep and missing:
        ours = {root: fs.get_file_info(posixpath.join(root, SCHEMA_FILE)).type != pafs.FileType.NotFound
                for root in {dataset_root(f.path) for f in missing}}
        with ThreadPoolExecutor(_PROBE_THREADS) as pool:
            list(pool.map(lambda f: _keep(fs, f.path, scanned[f.path], ours[dataset_root(f.path)]), missing))
    return [k if k is not None else scanned[f.path] for f, k in zip(files, known, strict=True)]


def _known(fs: pafs.FileSystem, file: DataFile, compression: Compression) -> FileIndex | None:
    compressed = compression in ("gzip", "zlib")
    if not compressed:
        probe = probe_file(fs, file, compression)
        if probe.kind is ProbeKind.INDEXED and probe.index is not None:
            return FileIndex(probe.index, False)
        compressed = probe.kind is ProbeKind.COMPRESSED
    return _cached(fs, file, compressed)


def _cache_path(fs: pafs.FileSystem, path: str) -> str:
    key = hashlib.sha256(f"{fs.type_name}:{path}".encode()).hexdigest()
    return os.path.join(cache_dir(), key[:2], key[2:])


def _cached(fs: pafs.FileSystem, file: DataFile, compressed: bool) -> FileIndex | None:
    cached = _cache_path(fs, file.path)
    try:
        with open(cached, "rb") as f:
            index = RecordIndex.from_bytes(f.read(), path=cached)
    except (OSError, IndexFormatError):
        return None
    if not index.matches(file.size, *read_fingerprint(fs, file.path, file.size)):
        return None
    return FileIndex(index, compressed)


def _keep(fs: pafs.FileSystem, path: str, found: FileIndex, sidecar: bool) -> None:
    """``found`` as ``path``'s sidecar if ``sidecar`` (and it can be written), else in the cache
    (always for a compressed file: readers never look for its sidecar). A cache that cannot be
    written either costs the next plan a scan, nothing else."""
    if sidecar and not found.compressed:
        try:
            write_index(fs, path, found.index)
            return
        except (OSError, pa.ArrowException):
            pass
    cached = _cache_path(fs, path)
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        partial = f"{cached}.{os.getpid()}.tmp"
        with open(partial, "wb") as f:
            f.write(found.index.to_bytes())
        os.replace(partial, cached)
    except OSError:
        pass


def _scan_all(fs: pafs.FileSystem, files: list[DataFile], compression: Compression,
              spacing_bytes: int) -> list[FileIndex]:
    if not files:
        return []
    groups: list[list[str]] = [[]]
    size = 0
    for file in files:
        if groups[-1] and (size + file.size > _TASK_BYTES or len(groups[-1]) >= _TASK_FILES):
            groups.append([])
            size = 0
        groups[-1].append(file.path)
        size += file.size
    shipped = compat.pickleable_filesystem(fs)
    if ray.is_initialized():
        scan = ray.remote(_scan_group).options(num_cpus=1, scheduling_strategy="SPREAD")
        # A damaged file: raised here as the local scan raises it.
        results = fetched([scan.remote(shipped, group, compression, spacing_bytes) for group in groups])
    else:
        with ThreadPoolExecutor(_PROBE_THREADS) as pool:
            results = list(pool.map(lambda g: _scan_group(shipped, g, compression, spacing_bytes), groups))
    return [FileIndex(RecordIndex.from_bytes(data, path=path), compressed)
            for group, result in zip(groups, results, strict=True)
            for path, (data, compressed) in zip(group, result, strict=True)]


def _scan_group(shipped: Any, paths: list[str], compression: Compression,
                spacing_bytes: int) -> list[tuple[bytes, bool]]:
    """The body of a scan task: each file's index (as bytes: a few KiB, not numpy objects) and
    whether it is compressed."""
    fs = compat.unpickled_filesystem(shipped)
    out = []
    try:
        for path in paths:
            index = None if compression in ("gzip", "zlib") else build_index(fs, path, spacing_bytes=spacing_bytes)
            out.append((index.to_bytes(), False) if index is not None else (_count(fs, path, compression), True))
    except TFRecordError as error:
        raise from_task(error) from None
    return out


def _count(fs: pafs.FileSystem, path: str, compression: Compression) -> bytes:
    """A compressed file's record count, as an index without boundaries (fingerprinted like any)."""
    size = fs.get_file_info(path).size
    head, tail = read_fingerprint(fs, path, size)
    with explain_missing(fs, path):
        stream, found = open_stream(path, fs, compression)
    try:
        count = sum(len(c) for c in iter_chunks(stream, path=path, compressed=bool(found)))
    finally:
        stream.close()
    index = IndexBuilder().finish(size, head, tail)
    return dataclasses.replace(index, num_records=count).to_bytes()

