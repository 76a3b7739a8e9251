"""TFRecordDatasink: TensorFlow parses what we write, partitioned layout, save modes,
staged commit (nothing visible from failed or killed writes), file sizing, sidecars."""

import os
import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray
import ray.cloudpickle
import tensorflow as tf
from ray.data.datasource import FilenameProvider
from ray.exceptions import UserCodeException

from ray_tfrecord import SchemaError, TFRecordError, read_tfrecords, write_tfrecords
from ray_tfrecord._src.core.index import RecordIndex, build_index, index_path, is_index_path
from ray_tfrecord._src.data.compat import TaskContext
from ray_tfrecord._src.data.read.listing import list_files
from ray_tfrecord._src.data.write.datasink import TFRecordDatasink
from tests.test_faults import log_entries

pytestmark = pytest.mark.timeout(300)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PART_NAME = re.compile(r"part-\d{5}-[0-9a-f]{32}\.tfrecord(\.gz|\.zlib)?")


def visible_files(root) -> list:
    """Data files a Hadoop-convention reader would see (no '.'/'_' names)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(("_", "."))]
        out += [os.path.join(d, f) for f in files if not f.startswith(("_", "."))]
    return sorted(out)


def root_entries(root, *names) -> list:
    """What a committed dataset's root holds: the markers, ``names``, one sidecar per data file and the log's
    versions, every one up to the latest (none has expired: they are younger than ``LOG_KEEP_S``)."""
    sidecars = [os.path.basename(index_path(f)) for f in visible_files(root)]
    bookkeeping = ["_SUCCESS", "_tfrecord_schema.arrow", "_tfrecord_schema.pbtxt", *log_entries(root)]
    return sorted([*bookkeeping, *names, *sidecars])



def words_dataset():
    numbers = [1, 2, 8]
    return ray.data.from_items(
        [{"number": numbers[n % 3], "word": f"word{n}"} for n in range(60)], override_num_blocks=4
    )


def test_seed_example_partitioned_round_trip(ray_local, tmp_path):
    out = tmp_path / "words"
    result = write_tfrecords(words_dataset(), str(out), partition_cols=["number"])
    assert sorted(os.listdir(out)) == root_entries(out, "number=1", "number=2", "number=8")
    files = visible_files(out)
    assert files and all(PART_NAME.fullmatch(os.path.basename(f)) for f in files)
    assert result.num_rows == 60 and sorted(result.files) == files

    # Partition columns are not in the records...
    for f in files:
        for rec in tf.data.TFRecordDataset(f):
            ex = tf.train.Example.FromString(rec.numpy())
            assert set(ex.features.feature) == {"word"}
    # ...and come back, typed, from the directory names.
    back = read_tfrecords(str(out), schema=pa.schema([("word", pa.string())]))
    assert back.schema().base_schema == pa.schema([("word", pa.string()), ("number", pa.int64())])
    expected = sorted(words_dataset().take_all(), key=lambda r: r["word"])
    assert sorted(back.take_all(), key=lambda r: r["word"]) == expected


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
def test_tensorflow_parses_what_we_write(ray_local, tmp_path, compression):
    rng = np.random.default_rng(0)
    n = 200
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "small": pa.array(rng.integers(-100, 100, n), pa.int32()),
            "flag": pa.array([i % 2 == 0 for i in range(n)]),
            "score": pa.array(rng.standard_normal(n), pa.float32()),
            "text": pa.array([f"t{i}" for i in range(n)]),
            "blob": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary()),
            "tokens": pa.array([list(range(i % 4)) for i in range(n)], pa.list_(pa.int64())),
            "emb": pa.array(rng.standard_normal((n, 3)).astype(np.float32).tolist(), pa.list_(pa.float32(), 3)),
        }
    )
    out = tmp_path / "typed"
    write_tfrecords(ray.data.from_arrow(table), str(out), compression=compression)
    files = visible_files(out)
    assert {f.endswith({None: ".tfrecord", "gzip": ".gz", "zlib": ".zlib"}[compression]) for f in files} == {True}
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "small": tf.io.FixedLenFeature([], tf.int64),
        "flag": tf.io.FixedLenFeature([], tf.int64),
        "score": tf.io.FixedLenFeature([], tf.float32),
        "text": tf.io.FixedLenFeature([], tf.string),
        "blob": tf.io.FixedLenFeature([], tf.string),
        "tokens": tf.io.RaggedFeature(tf.int64),
        "emb": tf.io.FixedLenFeature([3], tf.float32),
    }
    tf_ds = tf.data.TFRecordDataset(files, compression_type={None: "", "gzip": "GZIP", "zlib": "ZLIB"}[compression])
    got = {k: [] for k in spec}
    for batch in tf_ds.batch(64):
        parsed = tf.io.parse_example(batch, spec)
        for k in spec:
            got[k] += parsed[k].to_list() if k == "tokens" else parsed[k].numpy().tolist()
    order = np.argsort(got["id"])
    col = lambda k: [got[k][i] for i in order]  # noqa: E731
    assert col("id") == list(range(n))
    assert col("small") == table["small"].to_pylist()
    assert col("flag") == [int(v) for v in table["flag"].to_pylist()]
    assert col("score") == table["score"].to_pylist()
    assert col("text") == [t.encode() for t in table["text"].to_pylist()]
    assert col("blob") == table["blob"].to_pylist()
    assert col("tokens") == table["tokens"].to_pylist()
    assert col("emb") == table["emb"].to_pylist()


def test_save_modes(ray_local, tmp_path):
    out = str(tmp_path / "modes")
    first = ray.data.from_items([{"x": i} for i in range(10)])
    write_tfrecords(first, out)
    before = visible_files(out)

    with pytest.raises(ValueError, match="already exists"):
        write_tfrecords(first, out)
    with pytest.raises(ValueError, match="already exists"):
        first.write_datasink(TFRecordDatasink(out))

    ignored = write_tfrecords(ray.data.from_items([{"x": 99}]), out, mode="ignore")
    assert ignored.skipped and visible_files(out) == before

    write_tfrecords(ray.data.from_items([{"x": i} for i in range(10, 15)]), out, mode="append")
    assert sorted(r["x"] for r in read_tfrecords(out).take_all()) == list(range(15))
    assert set(before) < set(visible_files(out))

    write_tfrecords(ray.data.from_items([{"x": -1}]), out, mode="overwrite")
    assert [r["x"] for r in read_tfrecords(out).take_all()] == [-1]
    assert not set(before) & set(visible_files(out))
    assert sorted(os.listdir(out)) == root_entries(out, os.path.basename(visible_files(out)[0]))


def test_overwrite_partitioned_removes_old_partitions(ray_local, tmp_path):
    out = tmp_path / "parts"
    write_tfrecords(words_dataset(), str(out), partition_cols=["number"])
    new = ray.data.from_items([{"number": 2, "word": "fresh"}])
    write_tfrecords(new, str(out), partition_cols=["number"], mode="overwrite")
    assert sorted(os.listdir(out)) == root_entries(out, "number=2") and len(visible_files(out)) == 1
    rows = read_tfrecords(str(out), schema=pa.schema([("word", pa.string())])).take_all()
    assert rows == [{"word": "fresh", "number": 2}]


def _failing_dataset(n_ok: int):
    def explode(batch):
        if batch["x"].max() >= n_ok:
            raise RuntimeError("boom")
        return batch

    return ray.data.from_items([{"x": i} for i in range(40)], override_num_blocks=4).map_batches(
        explode, batch_size=10
    )


def test_failed_write_leaves_nothing_visible(ray_local, tmp_path):
    out = tmp_path / "failed"
    with pytest.raises(UserCodeException, match="boom"):
        write_tfrecords(_failing_dataset(20), str(out))
    assert not out.exists() or os.listdir(out) == []

    # A failed overwrite keeps the old dataset intact.
    write_tfrecords(ray.data.from_items([{"x": 7}]), str(out))
    with pytest.raises(UserCodeException, match="boom"):
        write_tfrecords(_failing_dataset(20), str(out), mode="overwrite")
    assert [r["x"] for r in read_tfrecords(str(out)).take_all()] == [7]
    assert "_temporary" not in os.listdir(out)


def test_killed_write_is_invisible(ray_local, tmp_path):
    """A write killed after its tasks wrote files but before the commit."""
    out = tmp_path / "killed"
    write_tfrecords(ray.data.from_items([{"x": 1}, {"x": 2}]), str(out))
    sink = TFRecordDatasink(str(out), mode="overwrite")
    sink.on_write_start(pa.schema([("x", pa.int64())]))
    staged = sink.write([pa.table({"x": list(range(100, 150))})], TaskContext(task_idx=0, op_name="Write"))
    assert staged["files"]  # files exist, in staging
    assert sorted(r["x"] for r in read_tfrecords(str(out)).take_all()) == [1, 2]
    assert os.path.isdir(out / "_temporary")


def test_file_sizing_and_index_sidecars(ray_local, tmp_path):
    rows = [{"id": i, "payload": b"p" * (i % 50)} for i in range(500)]
    out = tmp_path / "sized"
    result = write_tfrecords(
        ray.data.from_items(rows, override_num_blocks=1), str(out), max_rows_per_file=120
    )
    files = visible_files(out)
    counts = sorted(sum(1 for _ in tf.data.TFRecordDataset(f)) for f in files)
    assert counts == [20, 120, 120, 120, 120] and result.num_files == 5
    fs = pafs.LocalFileSystem()
    for f in files:
        sidecar = open(index_path(f), "rb").read()
        assert len(sidecar) < 200  # sparse: a few checkpoints, not one per record
        index = RecordIndex.from_bytes(sidecar, path=f)
        rebuilt = build_index(fs, f)
        assert index.num_records == rebuilt.num_records
        assert index.offsets.tolist() == rebuilt.offsets.tolist()
        assert index.matches(os.path.getsize(f), *_ends(f))

    by_size = tmp_path / "by_size"
    write_tfrecords(ray.data.from_items(rows, override_num_blocks=1), str(by_size), target_file_size=4000)
    sizes = [os.path.getsize(f) for f in visible_files(by_size)]
    assert len(sizes) > 3
    assert all(s >= 4000 for s in sizes[:-1]) or sizes.count(min(sizes)) == 1
    assert max(sizes) < 4000 + 200  # at most one record beyond the target
    assert sorted(r["id"] for r in read_tfrecords(str(by_size)).take_all()) == list(range(500))

    gz = tmp_path / "gz"
    write_tfrecords(ray.data.from_items(rows), str(gz), compression="gzip")
    assert not any(is_index_path(f) for f in os.listdir(gz))


def _ends(path):
    data = open(path, "rb").read()
    return data[:4096], data[-4096:]


def test_unencodable_schema_fails_before_writing(ray_local, tmp_path):
    out = tmp_path / "bad"
    ds = ray.data.from_arrow(pa.table({"when": pa.array([1, 2], pa.timestamp("s"))}))
    with pytest.raises(SchemaError, match="when"):
        write_tfrecords(ds, str(out))
    assert not out.exists()
    with pytest.raises(ValueError, match="partition_cols"):
        write_tfrecords(words_dataset(), str(tmp_path / "p"), partition_cols=["nope"])


def test_byte_array_round_trip_and_null_partition(ray_local, tmp_path):
    payloads = [bytes([i]) * i for i in range(1, 30)]
    out = tmp_path / "raw"
    write_tfrecords(ray.data.from_items([{"record": p} for p in payloads]), str(out), record_type="ByteArray")
    assert sorted(t.numpy() for f in visible_files(out) for t in tf.data.TFRecordDataset(f)) == sorted(payloads)

    nulls = tmp_path / "nulls"
    ds = ray.data.from_items([{"k": None, "v": 1}, {"k": "a/b", "v": 2}])
    write_tfrecords(ds, str(nulls), partition_cols=["k"])
    assert sorted(os.listdir(nulls)) == root_entries(nulls, "k=__HIVE_DEFAULT_PARTITION__", "k=a%2Fb")
    assert sorted(read_tfrecords(str(nulls)).take_all(), key=lambda r: r["v"]) == [
        {"v": 1, "k": None},
        {"v": 2, "k": "a/b"},
    ]


def test_tensorflow_globs_over_a_written_dataset_match_data_files_only(ray_local, tmp_path):
    def parsed(files):
        spec = {"word": tf.io.FixedLenFeature([], tf.string)}
        return sorted(tf.io.parse_single_example(r, spec)["word"].numpy().decode() for r in tf.data.TFRecordDataset(files))

    words = sorted(r["word"] for r in words_dataset().take_all())
    parts = str(tmp_path / "parts")
    write_tfrecords(words_dataset(), parts, partition_cols=["number"])
    assert parsed(tf.io.gfile.glob(parts + "/*/*")) == words
    assert parsed(tf.io.gfile.glob(parts + "/*/*.tfrecord*")) == words
    assert parsed(tf.data.Dataset.list_files(parts + "/*/*")) == words

    flat = str(tmp_path / "flat")
    write_tfrecords(words_dataset().drop_columns(["number"]), flat)
    assert parsed(tf.io.gfile.glob(flat + "/*.tfrecord*")) == words
    assert parsed(tf.data.Dataset.list_files(flat + "/part-*")) == words

    # Our reader still finds every sidecar (tests/test_planning.py splits with them).
    assert [f.has_index for f in list_files(parts).files] == [True] * len(visible_files(parts))
    assert sorted(r["word"] for r in read_tfrecords(parts).take_all()) == words


def test_append_with_an_extra_column_keeps_how_existing_rows_read(ray_local, tmp_path):
    out = str(tmp_path / "people")
    write_tfrecords(ray.data.from_items([{"name": "ada", "age": 36}, {"name": "bob", "age": 41}]), out)
    write_tfrecords(ray.data.from_items([{"name": "cy", "age": 7, "city": "Oslo"}]), out, mode="append")

    back = read_tfrecords(out)
    assert back.schema().base_schema == pa.schema([("name", pa.string()), ("age", pa.int64()), ("city", pa.string())])
    assert sorted(back.take_all(), key=lambda r: r["age"]) == [
        {"name": "cy", "age": 7, "city": "Oslo"},
        {"name": "ada", "age": 36, "city": None},
        {"name": "bob", "age": 41, "city": None},
    ]

    # A block whose type contradicts the recorded one fails in the write task, before its bytes land.
    clash = ray.data.from_items([{"age": "old"}]).map_batches(lambda b: b)
    with pytest.raises(SchemaError,
                       match="column 'age': the dataset stores it as int64, the rows appended have string"):
        write_tfrecords(clash, out, mode="append")
    assert read_tfrecords(out).count() == 3 and not os.path.exists(os.path.join(out, "_temporary"))


def test_inexact_float64_is_refused_with_the_fix_and_leaves_nothing(ray_local, tmp_path):
    out = str(tmp_path / "floats")
    # The message names the fix as a Python keyword; the CLI says --allow-float64-narrowing instead.
    with pytest.raises(TFRecordError, match=r"column 'x': float64 value 0.1 is not exactly representable as float32.*"
                                            r"pass allow_float64_narrowing=True to round it"):
        write_tfrecords(ray.data.from_items([{"x": 0.1}]), out)
    assert not os.path.exists(out)

    write_tfrecords(ray.data.from_items([{"x": 0.5}]), out)  # exact in float32: written as is
    before = sorted(os.listdir(out))
    with pytest.raises(TFRecordError, match="allow_float64_narrowing=True"):
        write_tfrecords(ray.data.from_items([{"x": 0.25}] * 50 + [{"x": 0.1}], override_num_blocks=3), out, mode="append")
    assert sorted(os.listdir(out)) == before
    write_tfrecords(ray.data.from_items([{"x": 0.1}]), out, mode="append", allow_float64_narrowing=True)
    assert sorted(r["x"] for r in read_tfrecords(out).take_all()) == [np.float32(0.1), 0.5]


def test_written_schema_is_restored_exactly_and_kept_honest_on_append(ray_local, tmp_path):
    from ray_tfrecord._src.core.layout import SCHEMA_FILE

    table = pa.table({
        "name": pa.array(["a", "b"], pa.string()),
        "small": pa.array([1, 2], pa.int32()),
        "vec": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32(), 2)),
        "part": pa.array([1, 2], pa.int64()),
    })
    out = str(tmp_path / "typed")
    write_tfrecords(ray.data.from_arrow(table), out, partition_cols=["part"])
    assert os.path.exists(os.path.join(out, SCHEMA_FILE))
    back = read_tfrecords(out)
    assert back.schema().base_schema == pa.schema([("name", pa.string()), ("small", pa.int32()),
                                                   ("vec", pa.list_(pa.float32(), 2)), ("part", pa.int64())])
    assert sorted(back.take_all(), key=lambda r: r["part"])[0]["name"] == "a"

    write_tfrecords(ray.data.from_arrow(table), out, partition_cols=["part"], mode="append")  # same schema: kept
    assert os.path.exists(os.path.join(out, SCHEMA_FILE)) and read_tfrecords(out).count() == 4

    # A column changing type would change how the rows already there read back: refused up front.
    before = visible_files(out)
    other = pa.table({"name": pa.array([b"\xff"], pa.binary()), "part": pa.array([3])})
    with pytest.raises(SchemaError, match="column 'name': the dataset stores it as string, the rows appended "
                                          "have binary; cast the column to string"):
        write_tfrecords(ray.data.from_arrow(other), out, partition_cols=["part"], mode="append")
    assert visible_files(out) == before and not os.path.exists(os.path.join(out, "_temporary"))
    # The schema is in the dataset's version, not only in the file beside it: a tool that deletes the file
    # (or a racing writer's stale copy of it) changes nothing, and the next commit puts it back.
    os.remove(os.path.join(out, SCHEMA_FILE))
    with pytest.raises(SchemaError, match="column 'name': the dataset stores it as string"):
        write_tfrecords(ray.data.from_arrow(other), out, partition_cols=["part"], mode="append")
    assert read_tfrecords(out).schema().base_schema.field("name").type == pa.string()
    write_tfrecords(ray.data.from_arrow(table), out, partition_cols=["part"], mode="append")
    assert os.path.exists(os.path.join(out, SCHEMA_FILE))
    # Files another writer left (no log, no schema) cannot be described: appending to them stays unrecorded.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with tf.io.TFRecordWriter(str(foreign / "part-0.tfrecord")) as w:
        w.write(tf.train.Example(features=tf.train.Features(feature={"name": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[b"z"]))})).SerializeToString())
    write_tfrecords(ray.data.from_arrow(other.drop_columns(["part"])), str(foreign), mode="append")
    assert not os.path.exists(foreign / SCHEMA_FILE)
    assert read_tfrecords(str(foreign)).schema().base_schema.field("name").type == pa.binary()
    assert sorted(r["name"] for r in read_tfrecords(str(foreign)).take_all()) == [b"z", b"\xff"]

    write_tfrecords(ray.data.from_arrow(table), out, partition_cols=["part"], mode="overwrite")
    assert read_tfrecords(out).schema().base_schema.field("name").type == pa.string()
    assert read_tfrecords(out, record_type="SequenceExample").schema().base_schema.field("name").type == pa.binary()


def test_a_partition_overwrite_keeps_the_columns_of_the_partitions_it_leaves(ray_local, tmp_path):
    """partition_overwrite="dynamic" replaces day=2 with rows lacking ``x``; day=1's ``x`` stays readable (the
    recorded schema was the new rows' alone, so day=1's ``x`` read as if absent)."""
    out = str(tmp_path / "days")
    write_tfrecords(ray.data.from_arrow(pa.table({"day": [1, 2], "a": [10, 20], "x": [1.5, 2.5]})), out,
                    partition_cols=["day"])
    write_tfrecords(ray.data.from_arrow(pa.table({"day": [2], "a": [21]})), out, partition_cols=["day"],
                    mode="overwrite", partition_overwrite="dynamic")
    rows = sorted(read_tfrecords(out).take_all(), key=lambda r: r["day"])
    assert rows == [{"a": 10, "x": 1.5, "day": 1}, {"a": 21, "x": None, "day": 2}]
    # A whole overwrite replaces every file, and the schema with them.
    write_tfrecords(ray.data.from_arrow(pa.table({"day": [3], "a": [30]})), out, partition_cols=["day"],
                    mode="overwrite")
    assert read_tfrecords(out).take_all() == [{"a": 30, "day": 3}]


def test_block_with_an_all_null_column_writes_missing_features(ray_local, tmp_path):
    # The null rows come first, so that block's column is null-typed while the next block's is binary.
    rows = [{"id": i, "bytes_partial": None if i < 4 else b"v%d" % i} for i in range(8)]
    ds = ray.data.from_items(rows, override_num_blocks=2)
    out = str(tmp_path / "partial")
    write_tfrecords(ds, out)
    parsed = {}
    for path in visible_files(out):
        for record in tf.data.TFRecordDataset(path):
            example = tf.train.Example.FromString(record.numpy())
            parsed[example.features.feature["id"].int64_list.value[0]] = example.features.feature
    assert all(("bytes_partial" in parsed[i]) == (i >= 4) for i in range(8))
    back = read_tfrecords(out)
    assert back.schema().base_schema.field("bytes_partial").type == pa.binary()
    assert sorted((r["id"], r["bytes_partial"]) for r in back.take_all()) == [tuple(r.values()) for r in rows]

    # A column null in every block has no type at all: still refused, whether or not the driver
    # knows the schema before the tasks run.
    nulls = [{"id": i, "empty": None} for i in range(4)]
    for nowhere in (ray.data.from_items(nulls, override_num_blocks=2),
                    ray.data.from_items(nulls, override_num_blocks=2).map_batches(lambda b: b, batch_format="pyarrow")):
        with pytest.raises(SchemaError, match="column 'empty': type null has no TFRecord representation"):
            write_tfrecords(nowhere, str(tmp_path / "nulls"))
        assert not os.path.exists(tmp_path / "nulls")


def test_null_in_a_not_null_field_fails_the_write_and_leaves_nothing(ray_local, tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    out = str(tmp_path / "strict")
    holes = pa.Table.from_arrays([pa.array([1, None, 3])], schema=schema)
    with pytest.raises(SchemaError) as info:
        write_tfrecords(ray.data.from_arrow(holes), out)
    assert str(info.value) == (f"{out}, column 'id': row 1 of a block is null but the schema declares the field not "
                               "nullable; fill the nulls or declare the field nullable=True")
    assert not os.path.exists(out)
    write_tfrecords(ray.data.from_arrow(pa.Table.from_arrays([pa.array([1, 2, 3])], schema=schema)), out)
    assert sorted(r["id"] for r in read_tfrecords(out).take_all()) == [1, 2, 3]


# -- what users port from Ray's write_tfrecords ------------------------------------------------


def _parsed_ids(path, compression_type=""):
    return [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0]
            for r in tf.data.TFRecordDataset(path, compression_type=compression_type)]


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compression_level_reaches_zlib_and_tensorflow_reads_every_level(ray_local, tmp_path, compression):
    rows = [{"id": i, "text": f"row {i % 7} of a repetitive text column"} for i in range(400)]
    sizes = {}
    for level in (0, 1, 9):
        out = tmp_path / f"level{level}"
        write_tfrecords(ray.data.from_items(rows), str(out), compression=compression, compression_level=level,
                        min_rows_per_file=400)
        (f,) = visible_files(out)
        assert sorted(_parsed_ids(f, compression.upper())) == list(range(400))
        sizes[level] = os.path.getsize(f)
    assert sizes[9] <= sizes[1] < sizes[0]  # 0 stores: the level is zlib's, not ignored


def test_compression_level_is_refused_without_compression_or_outside_zlibs_range(ray_local, tmp_path):
    with pytest.raises(ValueError, match=r"compression_level=9 applies to compressed files only; pass "
                                         r"compression='gzip' or 'zlib' as well"):
        write_tfrecords(words_dataset(), str(tmp_path / "a"), compression_level=9)
    with pytest.raises(ValueError, match=r"compression_level must be an integer from 0 \(fastest\) to 9"):
        TFRecordDatasink(str(tmp_path / "b"), compression="gzip", compression_level=11)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_min_rows_per_file_bundles_blocks_per_write_task(ray_local, tmp_path):
    ds = ray.data.from_items([{"id": i} for i in range(200)], override_num_blocks=20)  # 10-row blocks
    out = tmp_path / "bundled"
    result = write_tfrecords(ds, str(out), min_rows_per_file=50)
    counts = sorted(len(_parsed_ids(f)) for f in visible_files(out))
    assert sum(counts) == 200 and len(counts) == result.num_files < 20
    assert all(c >= 50 for c in counts[1:])  # a hint: only the last task may get fewer
    one = tmp_path / "one"
    assert write_tfrecords(ds, str(one), min_rows_per_file=200).num_files == 1
    # max_rows_per_file still cuts the files a task writes: two tasks of two 50-row blocks each.
    capped = tmp_path / "capped"
    write_tfrecords(ds.repartition(4), str(capped), min_rows_per_file=60, max_rows_per_file=60)
    assert sorted(len(_parsed_ids(f)) for f in visible_files(capped)) == [40, 40, 60, 60]
    with pytest.raises(ValueError, match=r"min_rows_per_file \(100\) must not exceed max_rows_per_file \(80\)"):
        TFRecordDatasink(str(tmp_path / "x"), min_rows_per_file=100, max_rows_per_file=80)
    with pytest.raises(ValueError, match="min_rows_per_file must be positive, got 0"):
        TFRecordDatasink(str(tmp_path / "x"), min_rows_per_file=0)


class TaskNames(FilenameProvider):
    def get_filename_for_task(self, write_uuid, task_index):
        return f"{write_uuid}_{task_index:06}_{{i}}.tfrecord"


class SameName(FilenameProvider):
    def get_filename_for_task(self, write_uuid, task_index):
        return "data.tfrecord"


class BlockNames(FilenameProvider):
    """A provider written for Rays before 2.60, which called get_filename_for_block."""

    def get_filename_for_block(self, block, write_uuid, task_index, block_index):
        return f"legacy-{task_index}-{block_index}.tfrecord"


def test_filename_provider_names_files_in_each_partition_directory(ray_local, tmp_path):
    out = tmp_path / "named"
    result = write_tfrecords(words_dataset(), str(out), partition_cols=["number"], filename_provider=TaskNames(),
                             max_rows_per_file=15)
    names = [os.path.relpath(f, out) for f in result.files]
    pattern = re.compile(r"number=(1|2|8)/([0-9a-f]{32})_(\d{6})_(\d)\.tfrecord")
    assert names and all(pattern.fullmatch(n) for n in names), names
    assert len({pattern.fullmatch(n).group(2) for n in names}) == 1  # one write, one write_uuid
    # {i} numbers each task's files within a directory: 20 rows per partition, 15 per file.
    assert any(n.endswith("_1.tfrecord") for n in names)
    assert sorted(visible_files(out)) == sorted(result.files)
    assert sorted(os.listdir(out)) == root_entries(out, "number=1", "number=2", "number=8")
    back = read_tfrecords(str(out)).take_all()
    assert sorted((r["number"], r["word"]) for r in back) == sorted(
        (r["number"], r["word"]) for r in words_dataset().take_all())


def test_filename_provider_names_that_clash_fail_before_anything_moves(ray_local, tmp_path):
    out = tmp_path / "clash"
    many_tasks = ray.data.from_items([{"id": i} for i in range(40)], override_num_blocks=4)
    with pytest.raises(TFRecordError, match=r"filename_provider gave two write tasks the same file name "
                                            r"'data.tfrecord'; make get_filename_for_task's name depend on "
                                            r"task_index. Nothing was written"):
        write_tfrecords(many_tasks, str(out), filename_provider=SameName(), min_rows_per_file=10)
    assert not out.exists() or os.listdir(out) == []

    # Appending a name that exists would replace the rows there: refused, the dataset unchanged.
    one_task = ray.data.from_items([{"id": i} for i in range(5)])
    write_tfrecords(one_task, str(out), filename_provider=SameName())
    before = {f: open(f, "rb").read() for f in visible_files(out)}
    with pytest.raises(TFRecordError, match=r"data.tfrecord: the file exists: filename_provider named an appended "
                                            r"file like an existing one; put write_uuid in the name"):
        write_tfrecords(one_task, str(out), filename_provider=SameName(), mode="append")
    assert {f: open(f, "rb").read() for f in visible_files(out)} == before
    assert "_temporary" not in os.listdir(out)

    # A task that needs a second file in one directory needs {i} in the name.
    with pytest.raises(TFRecordError, match=r"filename_provider named write task 0's file 'data.tfrecord', but the "
                                            r"task writes more than one file in the dataset root .*put '\{i\}' in "
                                            r"the name"):
        write_tfrecords(one_task, str(tmp_path / "rotated"), filename_provider=SameName(), max_rows_per_file=2)
    assert not (tmp_path / "rotated").exists() or visible_files(tmp_path / "rotated") == []


class HiddenName(FilenameProvider):
    def get_filename_for_task(self, write_uuid, task_index):
        return f"_{task_index}.tfrecord"


def test_filename_provider_hidden_names_are_refused_and_legacy_providers_are_called(ray_local, tmp_path):
    with pytest.raises(TFRecordError, match=r"filename_provider named write task 0's file '_0.tfrecord': a name must "
                                            r"be a non-empty string without '/' that does not start with '.' or '_'"):
        write_tfrecords(words_dataset(), str(tmp_path / "hidden"), filename_provider=HiddenName(),
                        min_rows_per_file=60)
    out = tmp_path / "legacy"
    write_tfrecords(words_dataset(), str(out), filename_provider=BlockNames(), min_rows_per_file=60)
    assert [os.path.basename(f) for f in visible_files(out)] == ["legacy-0-0.tfrecord"]
    assert len(read_tfrecords(str(out)).take_all()) == 60
    with pytest.raises(TypeError, match="filename_provider must be a ray.data.datasource.FilenameProvider"):
        TFRecordDatasink(str(out), filename_provider=lambda uuid, i: "x")


def test_every_varint_length_boundary_parses_in_tensorflow(ray_local, tmp_path):
    """The encoder writes 1- and 2-byte varints and longer ones by different paths, each as whole
    words into spare room: values on each side of every length step must come back exactly."""
    edges = sorted({v for k in range(1, 64) for v in (2**k - 1, 2**k) if v < 2**63} | {0})
    values = edges + [-v for v in edges if v] + [-(2**63)]
    rows = [{"id": i, "vals": values[i:] + values[:i], "one": values[i]} for i in range(len(values))]
    out = tmp_path / "edges"
    write_tfrecords(ray.data.from_items(rows), str(out))
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "one": tf.io.FixedLenFeature([], tf.int64),
            "vals": tf.io.FixedLenFeature([len(values)], tf.int64)}
    got = {}
    for rec in tf.data.TFRecordDataset(visible_files(out)):
        parsed = tf.io.parse_single_example(rec, spec)
        got[int(parsed["id"])] = (int(parsed["one"]), parsed["vals"].numpy().tolist())
    assert got == {r["id"]: (r["one"], r["vals"]) for r in rows}


def test_path_like_destinations(ray_local, tmp_path):
    assert write_tfrecords(words_dataset(), tmp_path / "a", partition_cols=["number"]).num_rows == 60
    sink = TFRecordDatasink(tmp_path / "b")
    words_dataset().write_datasink(sink)
    assert sink.result.num_rows == 60
    assert sorted(r["word"] for r in read_tfrecords(tmp_path / "a").take_all()) == sorted(
        r["word"] for r in read_tfrecords(tmp_path / "b").take_all())


def test_small_blocks_gather_into_one_file_on_every_ray(ray_local, tmp_path):
    # Ray 2.60 bundles a write task's input by min_bytes_per_write; before, the sink asks for the rows that
    # make up those bytes, so 20 ten-row blocks are one file at both ends of the supported range.
    ds = ray.data.from_items([{"id": i} for i in range(200)], override_num_blocks=20)
    result = write_tfrecords(ds, tmp_path / "out")
    assert result.num_files == 1 and sorted(_parsed_ids(result.files[0])) == list(range(200))


def _file_bytes(out) -> bytes:
    files = visible_files(out)
    assert len(files) == 1
    with open(files[0], "rb") as f:
        return f.read()


def _kinds(out) -> list:
    return [tf.train.Example.FromString(r.numpy()).features.feature["vals"].WhichOneof("kind")
            for r in tf.data.TFRecordDataset(visible_files(out))]


def test_a_block_of_only_empty_lists_writes_typed_empty_lists(ray_local, tmp_path):
    """Arrow types a list column whose values are all empty in a block list<null>; the element type
    another block of the task gives it (even a later one) makes them int64_list {}, byte for byte
    what the same rows in one block write, as TensorFlow's proto parser sees."""
    empty = pa.table({"id": [0, 1], "vals": [[], []]})
    full = pa.table({"id": [2, 3], "vals": [[7], [8, 9]]})
    assert pa.types.is_null(empty.schema.field("vals").type.value_type)
    one_block = pa.concat_tables([empty.cast(full.schema), full])
    write_tfrecords(ray.data.from_arrow(one_block), tmp_path / "one")
    # Two blocks, the empty one first, in one write task (min_rows_per_file gathers them); through the
    # sink alone, so that only the task's later block tells the type (write_tfrecords also passes the
    # dataset's schema when Ray knows it without executing).
    ray.data.from_arrow([empty, full]).write_datasink(TFRecordDatasink(tmp_path / "two", min_rows_per_file=4))
    assert _kinds(tmp_path / "one") == ["int64_list"] * 4
    assert _file_bytes(tmp_path / "two") == _file_bytes(tmp_path / "one")
    parsed = [tf.io.parse_single_example(r, {"vals": tf.io.VarLenFeature(tf.int64)})["vals"].values.numpy().tolist()
              for r in tf.data.TFRecordDataset(visible_files(tmp_path / "two"))]
    assert parsed == [[], [], [7], [8, 9]]
    assert [r["vals"] for r in read_tfrecords(tmp_path / "two").take_all()] == [[], [], [7], [8, 9]]


def test_empty_lists_take_the_type_recorded_by_the_dataset_appended_to(ray_local, tmp_path):
    out = tmp_path / "out"
    write_tfrecords(ray.data.from_arrow(pa.table({"id": [1], "vals": pa.array([[1.5]], pa.list_(pa.float32()))})), out)
    write_tfrecords(ray.data.from_arrow(pa.table({"id": [2], "vals": [[]]})), out, mode="append")
    kinds = sorted(tf.train.Example.FromString(r.numpy()).features.feature["vals"].WhichOneof("kind")
                   for r in tf.data.TFRecordDataset(visible_files(out)))
    assert kinds == ["float_list", "float_list"]
    assert sorted(map(str, (r["vals"] for r in read_tfrecords(out).take_all()))) == ["[1.5]", "[]"]


def test_empty_lists_with_no_type_anywhere_stay_features_of_no_kind(ray_local, tmp_path):
    write_tfrecords(ray.data.from_arrow(pa.table({"id": [0], "vals": [[]]})), tmp_path / "out")
    assert _kinds(tmp_path / "out") == [None]
    parsed = [tf.io.parse_single_example(r, {"vals": tf.io.VarLenFeature(tf.int64)})["vals"].values.numpy().tolist()
              for r in tf.data.TFRecordDataset(visible_files(tmp_path / "out"))]
    assert parsed == [[]]
