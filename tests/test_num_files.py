"""write_tfrecords(num_files=N): exactly N files, rows within one of even, TFDS/Beam names; its refusals."""

from __future__ import annotations

import os
import re

import numpy as np
import pyarrow as pa
import pytest
import ray

import ray_tfrecord
from ray_tfrecord import TFRecordDatasink, TFRecordError

ROWS = 1000


def shard_files(path) -> dict[str, list[str]]:
    """The data files under ``path`` by directory (relative; '' for the root), names sorted."""
    found: dict[str, list[str]] = {}
    for d, _, names in os.walk(path):
        rel = "" if os.path.samefile(d, path) else os.path.relpath(d, path)
        if rel.startswith(("_", ".")):  # _temporary/ and the like
            continue
        data = sorted(n for n in names if not n.startswith(("_", ".")))
        if data:
            found[rel] = data
    return found


def prefix_of(name: str) -> str:
    return re.fullmatch(r"(.+)-\d{5}-of-\d{5}\..+", name).group(1)


def shard_pattern(prefix: str, n: int, extension: str = ".tfrecord") -> re.Pattern:
    return re.compile(rf"{re.escape(prefix)}-(\d{{5}})-of-{n:05d}{re.escape(extension)}")


def read_ids(path) -> list[int]:
    tables = [t for t in ray.get(ray_tfrecord.read_tfrecords(str(path)).to_arrow_refs()) if t.num_rows]
    return sorted(pa.concat_tables(tables).column("id").to_pylist()) if tables else []


def rows_in(path) -> int:
    """The records of one uncompressed TFRecord file, counted from its framing (length, CRC, data, CRC)."""
    data, offset, count = open(path, "rb").read(), 0, 0
    while offset < len(data):
        offset += 16 + int.from_bytes(data[offset:offset + 8], "little")
        count += 1
    assert offset == len(data)
    return count


def table(rows: int = ROWS) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32), "p": (ids % 3).astype(np.int64)})


@pytest.mark.parametrize("n", [1, 7, 128])
def test_exactly_n_files_named_as_tfds_with_rows_within_one_of_even(ray_local, tmp_path, n):
    ds = ray.data.from_arrow(table()).repartition(5)  # blocks that do not divide into n
    result = ray_tfrecord.write_tfrecords(ds, tmp_path / "d", num_files=n)
    (names,) = shard_files(tmp_path / "d").values()
    prefix = prefix_of(names[0])
    assert re.fullmatch(r"part-[0-9a-f]{8}", prefix)
    assert names == [f"{prefix}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)]
    assert result.num_files == n and result.num_rows == ROWS
    counts = [rows_in(tmp_path / "d" / name) for name in names]
    assert sum(counts) == ROWS and set(counts) <= {ROWS // n, -(-ROWS // n)}
    assert read_ids(tmp_path / "d") == list(range(ROWS))


def test_prefix_gzip_and_tensorflow_parses_the_shards(ray_local, tmp_path):
    tf = pytest.importorskip("tensorflow")
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table(10)), tmp_path / "d", num_files=3, file_prefix="train",
                                 compression="gzip")
    (names,) = shard_files(tmp_path / "d").values()
    assert names == [f"train-{i:05d}-of-00003.tfrecord.gz" for i in range(3)]
    files = [str(tmp_path / "d" / name) for name in names]
    records = list(tf.data.TFRecordDataset(files, compression_type="GZIP").as_numpy_iterator())
    assert len(records) == 10
    parsed = tf.io.parse_example(records, {"id": tf.io.FixedLenFeature([], tf.int64),
                                           "x": tf.io.FixedLenFeature([], tf.float32)})
    order = np.argsort(parsed["id"].numpy())
    np.testing.assert_array_equal(parsed["id"].numpy()[order], np.arange(10))
    np.testing.assert_array_equal(parsed["x"].numpy()[order], np.arange(10, dtype=np.float32) * 0.5)


@pytest.mark.parametrize("rows", [3, 0])
def test_fewer_rows_than_files_still_gives_n_files_some_empty(ray_local, tmp_path, rows):
    ds = ray.data.from_arrow(table(rows)) if rows else ray.data.from_arrow(table(4)).limit(0)
    result = ray_tfrecord.write_tfrecords(ds, tmp_path / "d", num_files=5)
    (names,) = shard_files(tmp_path / "d").values()
    pattern = shard_pattern(prefix_of(names[0]), 5)
    assert [int(pattern.fullmatch(name).group(1)) for name in names] == list(range(5))
    sizes = sorted(os.path.getsize(tmp_path / "d" / name) for name in names)
    assert sizes[:5 - rows] == [0] * (5 - rows) and all(sizes[5 - rows:])
    assert result.num_files == 5 and result.num_rows == rows
    assert read_ids(tmp_path / "d") == list(range(rows))


def test_each_shard_has_its_index(ray_local, tmp_path):
    from ray_tfrecord.tf import plan_splits

    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table()), tmp_path / "d", num_files=4)
    names = shard_files(tmp_path / "d")[""]
    assert sorted(n for n in os.listdir(tmp_path / "d") if n.startswith("_index.")) == [
        f"_index.{name.replace('.', '%2E')}" for name in names]
    plan = plan_splits(str(tmp_path / "d"))
    assert sorted(s.rows for s in plan.splits) == [250] * 4


def test_partitions_count_shards_spark_style(ray_local, tmp_path):
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table()), tmp_path / "d", num_files=4, partition_cols=["p"],
                                 file_prefix="s")
    found = shard_files(tmp_path / "d")
    assert sorted(found) == ["p=0", "p=1", "p=2"]
    per_shard = [0] * 4
    for directory, names in found.items():
        assert len(names) <= 4
        for name in names:
            index = int(shard_pattern("s", 4).fullmatch(name).group(1))
            per_shard[index] += rows_in(tmp_path / "d" / directory / name)
    assert per_shard == [250] * 4
    assert read_ids(tmp_path / "d") == list(range(ROWS))


def test_appends_and_overwrites_replace_no_file_in_place(ray_local, tmp_path):
    path = tmp_path / "d"
    ds = ray.data.from_arrow(table(20))
    ray_tfrecord.write_tfrecords(ds, path, num_files=2)
    ray_tfrecord.write_tfrecords(ds, path, num_files=2, mode="append")
    (names,) = shard_files(path).values()
    assert len(names) == 4 and len({prefix_of(n) for n in names}) == 2  # each write's own prefix
    assert read_ids(path) == sorted(list(range(20)) * 2)
    ray_tfrecord.write_tfrecords(ds, path, num_files=3, mode="overwrite", file_prefix="train")
    assert shard_files(path) == {"": [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]}
    before = {n: os.path.getmtime(path / n) for n in shard_files(path)[""]}
    for mode in ("append", "overwrite"):
        with pytest.raises(TFRecordError, match=r"file_prefix='train': the dataset already holds "
                                                r"'train-00000-of-00003.tfrecord' and 2 more, and mode='" + mode +
                                                r"' with the same names would replace them in place before the "
                                                r"commit; pass a file_prefix of this write's own"):
            ray_tfrecord.write_tfrecords(ds, path, num_files=3, mode=mode, file_prefix="train")
    assert {n: os.path.getmtime(path / n) for n in shard_files(path)[""]} == before
    assert read_ids(path) == list(range(20))


def test_dynamic_partition_overwrite_replaces_the_partitions_written(ray_local, tmp_path):
    path = tmp_path / "d"
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table(30)), path, num_files=2, partition_cols=["p"])
    kept = {d: names for d, names in shard_files(path).items() if d != "p=0"}
    new = table(30).filter(pa.compute.equal(table(30).column("p"), 0))
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(new), path, num_files=5, partition_cols=["p"],
                                 mode="overwrite", partition_overwrite="dynamic")
    found = shard_files(path)
    assert len(found["p=0"]) == 5 and all(n.endswith("-of-00005.tfrecord") for n in found["p=0"])
    assert {d: names for d, names in found.items() if d != "p=0"} == kept
    assert read_ids(path) == list(range(30))  # p=0's ten rows once, from the new files only


def test_a_sink_given_uneven_blocks_commits_nothing(ray_local, tmp_path):
    ds = ray.data.from_arrow([table(10), table(1)])  # two blocks, 10 rows and 1
    with pytest.raises(TFRecordError, match=r"num_files=2: its shards hold 1 to 10 of the 11 rows, where an even "
                                            r"split gives 5 or 6: the dataset did not reach the sink as 2 even "
                                            r"blocks. .*write ds.repartition\(2\). Nothing was written"):
        ds.write_datasink(TFRecordDatasink(tmp_path / "d", num_files=2))
    assert not shard_files(tmp_path / "d")
    # What the message says to do.
    ds.repartition(2).write_datasink(TFRecordDatasink(tmp_path / "e", num_files=2))
    assert len(shard_files(tmp_path / "e")[""]) == 2 and len(read_ids(tmp_path / "e")) == 11


def test_a_sink_given_more_blocks_than_files_fails(ray_local, tmp_path):
    ds = ray.data.from_arrow([table(3)] * 3)
    with pytest.raises(TFRecordError, match=r"num_files=2: Ray ran write task 2: the dataset did not reach the "
                                            r"sink as 2 even blocks"):
        ds.write_datasink(TFRecordDatasink(tmp_path / "d", num_files=2))
    assert not shard_files(tmp_path / "d")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_rows_per_file": 10}, "num_files=4 writes exactly 4 files of balanced rows, which max_rows_per_file "
                                "would cut, bundle or name otherwise; leave it out, or leave num_files out"),
    ({"min_rows_per_file": 10, "target_file_size": 1 << 20},
     "num_files=4 writes exactly 4 files of balanced rows, which min_rows_per_file and target_file_size would "
     "cut, bundle or name otherwise; leave them out, or leave num_files out"),
    ({"filename_provider": ray.data.datasource.FilenameProvider()},
     "which filename_provider would cut, bundle or name otherwise"),
    ({"num_files": 0}, "num_files must be a positive integer, got 0"),
    ({"num_files": True}, "num_files must be a positive integer, got True"),
    ({"num_files": None, "file_prefix": "train"},
     "file_prefix='train' names the files of num_files=N (<prefix>-00000-of-0000N); give num_files too, or "
     "leave file_prefix out"),
    ({"file_prefix": "_train"}, "file_prefix must be a non-empty string without '/' that does not start with '.' "
                                "or '_' (readers skip those names), got '_train'"),
    ({"file_prefix": "a/b"}, "file_prefix must be a non-empty string without '/'"),
])
def test_refused_combinations(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TFRecordDatasink(tmp_path / "d", **{"num_files": 4, **kwargs})


def test_refused_with_ray_checkpointing(tmp_path):
    checkpoint = pytest.importorskip("ray.data.checkpoint")
    context = ray.data.DataContext.get_current().copy()
    context.checkpoint_config = checkpoint.CheckpointConfig(id_column="id", checkpoint_path=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=re.escape(
            "num_files cannot be used with Ray's checkpoint_config: a rerun writes only the rows earlier runs did "
            "not, so its shards cannot be even; leave num_files out (max_rows_per_file sizes files), or unset "
            "checkpoint_config")):
        TFRecordDatasink(tmp_path / "d", num_files=4).apply_mode(context)
