"""Planning a read: files to byte ranges, byte ranges to read tasks, and how many tasks.

Each file becomes one or more byte ranges. An uncompressed file that rounds to at least two
split sizes is cut into that many ranges: boundaries come from the file's index sidecar when it is
present and current, otherwise each range after the first resynchronises on the next record
header (validated by its length CRC and data CRC); a record belongs to the range its header
starts in. Compressed files are always read whole. Consecutive ranges are packed into read
tasks of about the split size.

Example::

    >>> from ray_tfrecord._src.data.read.listing import DataFile
    >>> from ray_tfrecord._src.data.read.planning import FileRange, pack_ranges
    >>> ranges = [FileRange.whole(DataFile(f"f{i}", 10, ())) for i in range(5)]
    >>> [[r.path for r in task] for task in pack_ranges(ranges, target_bytes=20)]
    [['f0', 'f1'], ['f2', 'f3'], ['f4']]
"""

from __future__ import annotations

import enum
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow.fs as pafs
import ray
from ray.data.datasource import FileShuffleConfig

from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.framing import detect_compression
from ray_tfrecord._src.core.index import RecordIndex, load_index, read_fingerprint
from ray_tfrecord._src.core.manifest import explain_missing
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.partitioning import PartitionValues
from ray_tfrecord._src.data.read.listing import DataFile

Shuffle = Literal["files"] | FileShuffleConfig | None


@dataclass(frozen=True)
class FileRange:
    """A piece of one file read by one read task."""

    path: str
    start: int
    end: int | None  # None: to end of stream (always for compressed files)
    size: int  # on-disk bytes, for metadata and task packing
    # Exact, when an index gave the boundaries or the manifest the whole file's count: then Ray's count() adds
    # the read tasks' counts up without opening a file (so a count polled during an overwrite never reads one).
    num_rows: int | None
    resync: bool  # start is a guessed byte offset, not a known record boundary
    partitions: PartitionValues

    @classmethod
    def whole(cls, file: DataFile) -> FileRange:
        return cls(file.path, 0, None, file.size, file.rows, False, file.partitions)

    @property
    def whole_file(self) -> bool:
        return self.start == 0 and self.end is None


class ProbeKind(enum.Enum):
    COMPRESSED = "compressed"  # read whole
    UNINDEXED = "unindexed"  # split at guessed offsets, resynchronising on record headers
    INDEXED = "indexed"  # split on the record boundaries of a current index


@dataclass(frozen=True)
class Probe:
    """What a look at a large file's head, tail and sidecar found."""

    kind: ProbeKind
    index: RecordIndex | None = None  # set for INDEXED


def probe_file(fs: pafs.FileSystem, file: DataFile, compression: str | None) -> Probe:
    """Classify a large file for splitting (``compression`` as the reader was given it)."""
    with explain_missing(fs, file.path):
        head, tail = read_fingerprint(fs, file.path, file.size)
    if compression == "auto" and detect_compression(head[:16]) is not None:
        return Probe(ProbeKind.COMPRESSED)
    if file.has_index is not False:
        index = load_index(fs, file.path, file.size, head, tail, file.index)
        if index is not None:
            return Probe(ProbeKind.INDEXED, index)
    return Probe(ProbeKind.UNINDEXED)


def _pieces(size: int, target_bytes: int) -> int:
    """How many ranges a file of ``size`` bytes is cut into: the nearest whole number of
    targets. Rounding, not a "twice the target" floor, matters most for a lone file: split
    for P tasks its target is ``ceil(size / P)``, so ``size`` can fall a byte short of two
    targets and a 2-CPU read of one 256 MiB file would run as a single task."""
    return max(1, round(size / max(1, target_bytes)))


def _ranges_of(file: DataFile, probe: Probe | None, target_bytes: int) -> list[FileRange]:
    pieces = _pieces(file.size, target_bytes)
    if probe is None or probe.kind is ProbeKind.COMPRESSED or pieces < 2:
        return [FileRange.whole(file)]
    path, size, parts = file.path, file.size, file.partitions
    if probe.kind is ProbeKind.INDEXED and probe.index is not None:
        piece = math.ceil(size / pieces)
        return [FileRange(path, a, b, b - a, n, False, parts) for a, b, n in probe.index.split(piece)]
    bounds = [size * k // pieces for k in range(pieces + 1)]
    return [
        FileRange(path, a, b, b - a, None, k > 0, parts)
        for k, (a, b) in enumerate(zip(bounds, bounds[1:]))
    ]


def plan_ranges(
    fs: pafs.FileSystem,
    files: list[DataFile],
    compression: str | None,
    target_bytes: int,
    threads: int,
) -> list[FileRange]:
    """Cut ``files`` into ranges of about ``target_bytes``, in file order. Only files that
    round to two targets or more are probed (``threads`` at a time: each probe is a few reads)."""
    splittable = compression in ("auto", None)
    large = [f for f in files if splittable and _pieces(f.size, target_bytes) >= 2]
    with ThreadPoolExecutor(threads) as pool:
        probes = dict(zip((f.path for f in large), pool.map(lambda f: probe_file(fs, f, compression), large)))
    return [r for f in files for r in _ranges_of(f, probes.get(f.path), target_bytes)]


def split_bytes(total_bytes: int, parallelism: int, min_split_bytes: int) -> int:
    """The bytes per read task (and largest range) for ``parallelism`` tasks."""
    return max(min_split_bytes, math.ceil(max(1, total_bytes) / max(1, parallelism)))


# Ranges (files, mostly) per read task at most. A task's rows reach the consumer only as blocks,
# and Ray closes a block at its target size or at the task's end, so a task of thousands of small
# files held back its first block for all of them: 10,000 files of 100 KB on 2 CPUs gave their
# first batch after 8.6 s in 8 tasks, after 1.5 s in 40, at the same throughput.
MAX_RANGES_PER_TASK = 256


def pack_ranges(ranges: list[FileRange], target_bytes: int,
                max_ranges: int = MAX_RANGES_PER_TASK) -> list[list[FileRange]]:
    """Group consecutive ranges into read tasks of about ``target_bytes`` and at most
    ``max_ranges`` ranges."""
    groups: list[list[FileRange]] = []
    size = 0
    for r in ranges:
        if not groups or size + r.size > target_bytes or len(groups[-1]) >= max_ranges:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += r.size
    return groups


def check_shuffle(shuffle: object) -> None:
    """Raise ``ValueError`` unless ``shuffle`` is a value ``shuffle_files`` takes."""
    if not (shuffle is None or shuffle == "files" or isinstance(shuffle, FileShuffleConfig)):
        raise ValueError(
            f"Invalid value for 'shuffle': {shuffle}. "
            "Valid values are None, 'files', `FileShuffleConfig`."
        )


def shuffle_files(files: list[DataFile], shuffle: Shuffle, execution_idx: int) -> list[DataFile]:
    """``files`` in a random order: a fresh one per call for ``"files"``, else the one
    ``shuffle``'s seed gives for this execution (the permutation Ray's readers use)."""
    if shuffle is None:
        return files
    seed = None if shuffle == "files" else compat.shuffle_seed(shuffle, execution_idx)
    shuffled = list(files)
    np.random.default_rng(seed).shuffle(shuffled)
    return shuffled


def default_read_tasks(estimated_bytes: int, target_block_bytes: int | None) -> int | None:
    """One read task per CPU, more when blocks would otherwise exceed Ray's target size, but never
    more than the data has ``MIN_SPLIT_BYTES`` pieces (planning would pack it into fewer tasks);
    ``None`` (Ray Data's own default) when Ray is not running yet, since sizing a cluster must not
    start one.

    Ray splits every task's output k ways (one more copy of each block) when a datasource returns
    fewer read tasks than it asked for: its own default asks for at least 200. Our read tasks already
    stream blocks of a few MiB, which gives downstream operators their parallelism; measured on 2
    CPUs the split costs 2-3x in read throughput. Without the split, Ray before 2.60 can also fuse
    the read tasks with the write tasks that follow, so a task's blocks go to one file.
    """
    if not ray.is_initialized():
        return None
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    splits = max(1, math.ceil(estimated_bytes / sizes.MIN_SPLIT_BYTES))
    return min(splits, max(cpus, math.ceil(estimated_bytes / (target_block_bytes or sizes.TARGET_BLOCK_BYTES))))
