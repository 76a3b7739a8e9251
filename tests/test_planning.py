"""Listing files and planning a read: named records in, byte ranges and read tasks out."""

import gzip
import os
import subprocess
import sys

import pyarrow.fs as pafs
import pytest
from ray.data.datasource import FileShuffleConfig

from ray_tfrecord._src.core.index import build_index, write_index
from ray_tfrecord._src.data.read.listing import DataFile, list_files
from ray_tfrecord._src.data.read.planning import (
    MAX_RANGES_PER_TASK,
    FileRange,
    ProbeKind,
    default_read_tasks,
    pack_ranges,
    plan_ranges,
    probe_file,
    shuffle_files,
    split_bytes,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def layout(tmp_path):
    import tensorflow as tf

    root = tmp_path / "ds"
    for part in ("k=1/a.tfrecord", "k=2/b.tfrecord", "k=2/_tmp/c.tfrecord", "k=2/.d.tfrecord"):
        path = root / part
        path.parent.mkdir(parents=True, exist_ok=True)
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(200):
                w.write(b"x" * 100)
    fs = pafs.LocalFileSystem()
    write_index(fs, str(root / "k=2/b.tfrecord"), build_index(fs, str(root / "k=2/b.tfrecord"), spacing_bytes=1024))
    return root


def test_list_files_returns_named_records(layout):
    listing = list_files(str(layout))
    assert [(os.path.relpath(f.path, layout), f.partitions, f.has_index) for f in listing.files] == [
        ("k=1/a.tfrecord", (("k", 1),), False),
        ("k=2/b.tfrecord", (("k", 2),), True),
    ]
    assert all(f.size == os.path.getsize(f.path) for f in listing.files)
    assert listing.partition_schema.names == ["k"]
    assert listing.roots == [str(layout)]
    named = list_files(str(layout / "k=2" / "b.tfrecord"), partitioning=None)
    assert named.files == [DataFile(str(layout / "k=2" / "b.tfrecord"), 23200, (), None)]


def test_probe_and_plan(layout, tmp_path):
    fs = pafs.LocalFileSystem()
    listed = {os.path.basename(f.path): f for f in list_files(str(layout)).files}
    assert probe_file(fs, listed["a.tfrecord"], "auto").kind is ProbeKind.UNINDEXED
    indexed = probe_file(fs, listed["b.tfrecord"], "auto")
    assert indexed.kind is ProbeKind.INDEXED and indexed.index.num_records == 200
    zipped = tmp_path / "z.gz"
    zipped.write_bytes(gzip.compress(open(listed["a.tfrecord"].path, "rb").read()))
    assert probe_file(fs, DataFile(str(zipped), zipped.stat().st_size, ()), "auto").kind is ProbeKind.COMPRESSED

    files = [listed["a.tfrecord"], listed["b.tfrecord"]]
    ranges = plan_ranges(fs, files, "auto", target_bytes=5000, threads=2)
    for f in files:
        mine = [r for r in ranges if r.path == f.path]
        assert len(mine) > 1 and mine[0].start == 0 and mine[-1].end == f.size
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
        assert all(r.partitions == f.partitions for r in mine)
    assert all(r.num_rows is None and r.resync == (r.start > 0) for r in ranges if r.path == files[0].path)
    assert sum(r.num_rows for r in ranges if r.path == files[1].path) == 200
    # Compressed on request: never split, never probed.
    assert plan_ranges(fs, files, "gzip", target_bytes=5000, threads=2) == [FileRange.whole(f) for f in files]


def test_sidecars_found_in_both_layouts_and_from_a_partition_directory(layout):
    fs = pafs.LocalFileSystem()
    b = str(layout / "k=2/b.tfrecord")
    assert os.path.exists(layout / "_index.k=2%2Fb%2Etfrecord")  # at the dataset root
    # A partition directory read alone: the sidecar is above it, so unknown until probed.
    alone = list_files(str(layout / "k=2")).files
    assert [(os.path.basename(f.path), f.has_index) for f in alone] == [("b.tfrecord", None)]
    assert probe_file(fs, alone[0], "auto").kind is ProbeKind.INDEXED

    # A dataset indexed before sidecars moved to the root: `.<name>.idx` beside the file.
    os.rename(layout / "_index.k=2%2Fb%2Etfrecord", layout / "k=2/.b.tfrecord.idx")
    legacy = {os.path.basename(f.path): f for f in list_files(str(layout)).files}
    assert legacy["b.tfrecord"].has_index is True
    assert probe_file(fs, legacy["b.tfrecord"], "auto").index.num_records == 200
    # Still checked for staleness: the file changed, so the sidecar is ignored.
    with open(b, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"?")
    assert probe_file(fs, legacy["b.tfrecord"], "auto").kind is ProbeKind.UNINDEXED


def test_pack_ranges_keeps_order():
    ranges = [FileRange(f"f{i}", 0, None, size, None, False, ()) for i, size in enumerate([5, 5, 30, 1, 1])]
    assert [[r.path for r in g] for g in pack_ranges(ranges, 10)] == [["f0", "f1"], ["f2"], ["f3", "f4"]]


def test_many_small_files_make_tasks_of_at_most_max_ranges():
    ranges = [FileRange(f"f{i}", 0, None, 1, None, False, ()) for i in range(1000)]
    groups = pack_ranges(ranges, target_bytes=1 << 30)
    assert [len(g) for g in groups] == [MAX_RANGES_PER_TASK] * 3 + [1000 - 3 * MAX_RANGES_PER_TASK]
    assert [r for g in groups for r in g] == ranges
    assert [len(g) for g in pack_ranges(ranges[:10], 1 << 30, max_ranges=4)] == [4, 4, 2]


def test_shuffle_files_is_a_seeded_permutation():
    files = [DataFile(f"f{i}", i, ()) for i in range(20)]
    fixed = FileShuffleConfig(seed=3)
    once = shuffle_files(files, fixed, 0)
    assert sorted(once, key=lambda f: f.size) == files and once != files
    assert shuffle_files(files, fixed, 0) == once
    assert shuffle_files(files, None, 0) is files
    if hasattr(FileShuffleConfig, "get_seed"):  # Ray 2.54+: a new order per execution unless told otherwise
        assert shuffle_files(files, fixed, 1) != shuffle_files(files, fixed, 2)
        kept = FileShuffleConfig(seed=3, reseed_after_execution=False)
        assert shuffle_files(files, kept, 5) == shuffle_files(files, kept, 0)
    else:  # Ray 2.50-2.53: the seed alone decides
        assert shuffle_files(files, fixed, 5) == once


def test_default_read_tasks_does_not_start_ray():
    code = (
        "import ray\n"
        "from ray_tfrecord._src.data.read.planning import default_read_tasks\n"
        "assert default_read_tasks(10 << 30, None) is None\n"
        "assert not ray.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_default_read_tasks_is_one_per_cpu(ray_local):
    assert default_read_tasks(64 << 20, None) == 2
    assert default_read_tasks(10 * (128 << 20), None) == 10
    # No more tasks than MIN_SPLIT_BYTES pieces: Ray would split each task's output to make up the count.
    assert default_read_tasks(0, None) == 1
    assert default_read_tasks(40 << 20, 1 << 20) == 3


def test_a_lone_file_is_cut_into_one_range_per_task(tmp_path):
    """Split for P tasks, a file's target is ceil(size / P): a size that falls short of P whole
    targets by a byte still gives P ranges (it once gave a 2-CPU read of 256 MiB one task)."""
    import tensorflow as tf

    fs = pafs.LocalFileSystem()
    path = tmp_path / "odd.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for _ in range(199):
            w.write(b"y" * 101)  # 117 framed bytes a record: an odd file size
    size = path.stat().st_size
    assert size % 2 == 1
    indexed = tmp_path / "idx" / "odd.tfrecord"
    indexed.parent.mkdir()
    indexed.write_bytes(path.read_bytes())
    write_index(fs, str(indexed), build_index(fs, str(indexed), spacing_bytes=512))
    for parallelism in (2, 3, 4):
        target = split_bytes(size, parallelism, 1)
        for p in (path, indexed):
            (file,) = list_files(str(p)).files
            ranges = plan_ranges(fs, [file], "auto", target, threads=1)
            assert len(ranges) == parallelism, (p, parallelism)
            assert ranges[0].start == 0 and ranges[-1].end == size
            assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))
            assert len(pack_ranges(ranges, target)) == parallelism
    # Rounding also means a file well short of two targets is read whole.
    (file,) = list_files(str(path)).files
    assert len(plan_ranges(fs, [file], "auto", int(size / 1.4), threads=1)) == 1
    assert len(plan_ranges(fs, [file], "auto", int(size / 1.6), threads=1)) == 2
