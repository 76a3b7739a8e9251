"""TFRecordDatasource: TensorFlow-written files, compression, corruption, splitting,
partitions (with proof that pruned files are never opened), listing options."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray
import ray.cloudpickle
import tensorflow as tf
from ray.data import FileShuffleConfig
from ray.data.context import DataContext
from ray.data.datasource.partitioning import Partitioning, PathPartitionFilter

from ray_tfrecord import CorruptRecordError, NotTFRecordError, read_tfrecords
from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.index import build_index, index_path, write_index
from ray_tfrecord._src.data.read.datasource import TFRecordDatasource
from tests.filesystems import DelegatingHandler

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent

# Read tasks run in worker processes that cannot import this test module (or its helpers).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(sys.modules[DelegatingHandler.__module__])

FEATURES = {
    "id": tf.io.FixedLenFeature([], tf.int64),
    "label": tf.io.FixedLenFeature([], tf.float32),
    "name": tf.io.FixedLenFeature([], tf.string),
    "emb": tf.io.FixedLenFeature([3], tf.float32),
    "tokens": tf.io.VarLenFeature(tf.int64),
}


def make_example(i: int, rng: np.random.Generator, pad: int = 0) -> bytes:
    f = tf.train.Feature
    ex = tf.train.Example(
        features=tf.train.Features(
            feature={
                "id": f(int64_list=tf.train.Int64List(value=[i])),
                "label": f(float_list=tf.train.FloatList(value=[i / 4])),
                "name": f(bytes_list=tf.train.BytesList(value=[b"n%d" % i + b"x" * pad])),
                "emb": f(float_list=tf.train.FloatList(value=rng.standard_normal(3).tolist())),
                "tokens": f(
                    int64_list=tf.train.Int64List(
                        value=rng.integers(0, 1000, int(rng.integers(0, 5))).tolist()
                    )
                ),
            }
        )
    )
    return ex.SerializeToString()


def tf_write(path, records, compression: str = "") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options=compression or None) as w:
        for r in records:
            w.write(r)


def tf_rows(paths, compression: str = "") -> list:
    """Rows as tf.io.parse_example sees them, as Python values."""
    ds = tf.data.TFRecordDataset([str(p) for p in paths], compression_type=compression)
    rows = []
    for batch in ds.batch(256):
        parsed = tf.io.parse_example(batch, FEATURES)
        tokens = tf.sparse.to_dense(parsed["tokens"]).numpy()
        lengths = tf.math.bincount(
            tf.cast(parsed["tokens"].indices[:, 0], tf.int32), minlength=len(batch)
        ).numpy()
        for k in range(len(batch)):
            rows.append(
                {
                    "id": int(parsed["id"][k]),
                    "label": float(parsed["label"][k]),
                    "name": parsed["name"][k].numpy(),
                    "emb": parsed["emb"][k].numpy().tolist(),
                    "tokens": tokens[k, : lengths[k]].tolist(),
                }
            )
    return sorted(rows, key=lambda r: r["id"])


def our_rows(ds) -> list:
    rows = []
    for r in ds.take_all():
        r = dict(r)
        for k in ("emb", "tokens"):
            if k in r and r[k] is not None:
                r[k] = [float(v) if k == "emb" else int(v) for v in r[k]]
        rows.append(r)
    return sorted(rows, key=lambda r: r["id"])


def frame_offsets(path) -> list:
    """Header offsets of every record, by walking the length fields."""
    data = open(path, "rb").read()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 16 + length
    return offsets


@pytest.fixture
def tf_files(tmp_path):
    """Three TensorFlow-written files: plain, GZIP, ZLIB (ids 0..299)."""
    rng = np.random.default_rng(0)
    records = [make_example(i, rng) for i in range(300)]
    paths = {
        "": tmp_path / "data" / "a.tfrecord",
        "GZIP": tmp_path / "data" / "b.tfrecord.gz",
        "ZLIB": tmp_path / "data" / "c",
    }
    for k, (comp, p) in enumerate(paths.items()):
        tf_write(p, records[k * 100 : (k + 1) * 100], comp)
    return paths


def test_reads_tensorflow_files_as_parse_example_sees_them(ray_local, tf_files):
    expected = []
    for comp, p in tf_files.items():
        expected += tf_rows([p], comp)
    expected.sort(key=lambda r: r["id"])

    ds = read_tfrecords(str(next(iter(tf_files.values())).parent))
    assert ds.schema().base_schema == pa.schema(
        [
            ("emb", pa.list_(pa.float32())),
            ("id", pa.int64()),
            ("label", pa.float32()),
            ("name", pa.binary()),
            ("tokens", pa.list_(pa.int64())),
        ]
    )
    assert our_rows(ds) == expected
    assert len(expected) == 300


def test_columns_projection_and_select_pushdown(ray_local, tf_files):
    directory = str(tf_files[""].parent)
    ds = read_tfrecords(directory, columns=["label", "id"])
    assert ds.schema().names == ["label", "id"]
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    assert rows[7] == {"label": 7 / 4, "id": 7}

    pushed = read_tfrecords(directory).select_columns(["name", "id"])
    assert pushed.schema().names == ["name", "id"]
    assert sorted(pushed.take_all(), key=lambda r: r["id"])[5] == {"name": b"n5", "id": 5}
    assert read_tfrecords(directory).count() == 300

    with pytest.raises(ValueError, match="Unknown columns"):
        read_tfrecords(directory, columns=["nope"])


def test_explicit_schema_and_compression_override(ray_local, tf_files):
    schema = pa.schema([("id", pa.int32()), ("name", pa.string())])
    ds = read_tfrecords(str(tf_files["GZIP"]), schema=schema, compression="gzip")
    assert ds.schema().base_schema == schema
    assert sorted(r["id"] for r in ds.take_all()) == list(range(100, 200))
    assert ds.take(1)[0]["name"].startswith("n")

    # Forcing the wrong compression is an error naming the file, not garbage rows.
    with pytest.raises(CorruptRecordError, match=r"/c: corrupted GZIP stream"):
        read_tfrecords(str(tf_files["ZLIB"]), schema=schema, compression="gzip").take_all()
    with pytest.raises(NotTFRecordError, match=r"b\.tfrecord\.gz"):
        read_tfrecords(str(tf_files["GZIP"]), schema=schema, compression=None).take_all()


def _flip_byte_in_record(path, record: int) -> int:
    offsets = frame_offsets(path)
    data = bytearray(open(path, "rb").read())
    data[offsets[record] + 12 + 5] ^= 0xFF  # inside the payload: the data CRC fails
    open(path, "wb").write(bytes(data))
    return offsets[record]


def test_flipped_byte_raise_names_file_and_offset(ray_local, tf_files):
    path = tf_files[""]
    offset = _flip_byte_in_record(path, 42)
    with pytest.raises(CorruptRecordError) as info:
        read_tfrecords(str(path), schema=pa.schema([("id", pa.int64())])).take_all()
    assert str(path) in str(info.value) and f"offset {offset}" in str(info.value)
    # TensorFlow agrees the file is damaged.
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


def test_flipped_byte_skip_loses_exactly_that_record(ray_local, tf_files):
    path = tf_files[""]
    offset = _flip_byte_in_record(path, 42)
    source = TFRecordDatasource(str(path), on_corrupt="skip", schema=pa.schema([("id", pa.int64())]))
    ds = ray.data.read_datasource(source)
    assert sorted(r["id"] for r in ds.take_all()) == [i for i in range(100) if i != 42]
    report = source.corruption_report()
    assert report.count == 1
    assert report.samples[0][:2] == (str(path), offset)
    # Executing again re-reads the range; the count must not double.
    assert ds.count() == 99
    assert source.corruption_report().count == 1


def test_truncated_file(ray_local, tf_files):
    path = tf_files[""]
    last = frame_offsets(path)[-1]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    schema = pa.schema([("id", pa.int64())])
    with pytest.raises(CorruptRecordError, match=f"offset {last}"):
        read_tfrecords(str(path), schema=schema).take_all()
    source = TFRecordDatasource(str(path), schema=schema, on_corrupt="skip")
    assert sorted(r["id"] for r in ray.data.read_datasource(source).take_all()) == list(range(99))
    assert source.corruption_report().count == 1


def test_truncated_gzip_file_raises_naming_file(ray_local, tf_files):
    path = tf_files["GZIP"]
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(CorruptRecordError, match=r"b\.tfrecord\.gz"):
        read_tfrecords(str(path), schema=pa.schema([("id", pa.int64())])).take_all()


@pytest.fixture
def big_file(tmp_path):
    """~1.3 MB plain file of 3000 records of varied sizes (ids in order)."""
    rng = np.random.default_rng(1)
    records = [make_example(i, rng, pad=int(rng.integers(0, 800))) for i in range(3000)]
    path = tmp_path / "big" / "big.tfrecord"
    tf_write(path, records)
    return path


def _split_tasks(path, **kwargs):
    source = TFRecordDatasource(str(path), columns=["id", "name"], **kwargs)
    return source, source.get_read_tasks(7)


@pytest.mark.parametrize("indexed", [False, True])
def test_split_read_equals_whole_file_read(ray_local, big_file, monkeypatch, indexed):
    whole = our_rows(read_tfrecords(str(big_file), columns=["id", "name"]))
    assert [r["id"] for r in whole] == list(range(3000))
    if indexed:
        fs = pafs.LocalFileSystem()
        write_index(fs, str(big_file), build_index(fs, str(big_file), spacing_bytes=4096))

    monkeypatch.setattr(sizes, "MIN_SPLIT_BYTES", 64 << 10)
    for parallelism in (3, 7, 40):
        source = TFRecordDatasource(str(big_file), columns=["id", "name"])
        tasks = source.get_read_tasks(parallelism)
        assert len(tasks) >= min(parallelism, 3)
        rows = [r for t in tasks for block in t() for r in block.to_pylist()]
        # Exactly once each, in file order across tasks.
        assert [r["id"] for r in rows] == list(range(3000))
        counts = [t.metadata.num_rows for t in tasks]
        if indexed:
            assert counts == [sum(b.num_rows for b in t()) for t in tasks]
        else:
            assert counts == [None] * len(tasks)
    split = our_rows(ray.data.read_datasource(source, override_num_blocks=7))
    assert split == whole


def test_stale_index_is_ignored(ray_local, big_file, tmp_path, monkeypatch):
    fs = pafs.LocalFileSystem()
    write_index(fs, str(big_file), build_index(fs, str(big_file), spacing_bytes=4096))
    # Rewrite the file with different record sizes: the old offsets are no longer
    # record boundaries, so trusting the index would raise a CRC error.
    rng = np.random.default_rng(9)
    tf_write(big_file, [make_example(i, rng, pad=int(rng.integers(0, 500))) for i in range(2000)])
    assert os.path.exists(index_path(str(big_file)))
    monkeypatch.setattr(sizes, "MIN_SPLIT_BYTES", 64 << 10)
    source = TFRecordDatasource(str(big_file), columns=["id"])
    tasks = source.get_read_tasks(5)
    assert len(tasks) > 1 and all(t.metadata.num_rows is None for t in tasks)
    assert [r["id"] for t in tasks for b in t() for r in b.to_pylist()] == list(range(2000))


def test_compressed_files_are_whole_file_tasks(ray_local, tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    path = tmp_path / "z" / "big.gz"
    tf_write(path, [make_example(i, rng, pad=500) for i in range(1000)], "GZIP")
    monkeypatch.setattr(sizes, "MIN_SPLIT_BYTES", 1 << 10)
    source = TFRecordDatasource(str(path), columns=["id"])
    tasks = source.get_read_tasks(8)
    assert len(tasks) == 1
    assert sorted(r["id"] for b in tasks[0]() for r in b.to_pylist()) == list(range(1000))


def test_blocks_respect_target_max_block_size(ray_local, big_file):
    ctx = DataContext.get_current()
    old = ctx.target_max_block_size
    ctx.target_max_block_size = 128 << 10
    try:
        source = TFRecordDatasource(str(big_file), columns=["id", "name"])
        (task,) = source.get_read_tasks(1)
        blocks = list(task())
    finally:
        ctx.target_max_block_size = old
    assert len(blocks) > 5
    assert max(b.nbytes for b in blocks) <= 128 << 10
    assert sum(b.num_rows for b in blocks) == 3000


class RecordingHandler(DelegatingHandler):
    """A local filesystem that appends every opened path to a log file (read tasks
    run in other processes, so the log has to be on disk)."""

    def __init__(self, log: str):
        super().__init__(pafs.LocalFileSystem())
        self._log = log

    def _opened(self, path):
        with open(self._log, "a") as f:
            f.write(path + "\n")

    def __eq__(self, other):
        return isinstance(other, RecordingHandler) and other._log == self._log

    def __ne__(self, other):
        return not self == other

    def open_input_stream(self, path):
        self._opened(path)
        return super().open_input_stream(path)

    def open_input_file(self, path):
        self._opened(path)
        return super().open_input_file(path)


@pytest.fixture
def spark_layout(tmp_path):
    """The layout Spark-TFRecord writes: key=value dirs, part files, _SUCCESS, and
    Hadoop's hidden .crc files."""
    rng = np.random.default_rng(3)
    root = tmp_path / "spark"
    i = 0
    for year in (2020, 2021):
        for code in ("007", "us"):
            d = root / f"year={year}" / f"code={code}"
            for part in range(2):
                name = f"part-{part:05d}-3f1c2a.c000.tfrecord"
                tf_write(d / name, [make_example(i + k, rng) for k in range(10)])
                (d / f".{name}.crc").write_bytes(b"crc junk")
                i += 10
    (root / "_SUCCESS").write_bytes(b"")
    return root


def test_spark_layout_partitions_are_typed(ray_local, spark_layout):
    ds = read_tfrecords(str(spark_layout), columns=["id", "year", "code"])
    assert ds.schema().base_schema == pa.schema(
        [("id", pa.int64()), ("year", pa.int64()), ("code", pa.string())]
    )
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    assert len(rows) == 80
    assert rows[0] == {"id": 0, "year": 2020, "code": "007"}
    assert rows[79] == {"id": 79, "year": 2021, "code": "us"}

    explicit = read_tfrecords(
        str(spark_layout),
        columns=["id", "code"],
        partitioning=Partitioning("hive", field_types={"code": str}),
    )
    assert explicit.schema().base_schema.field("code").type == pa.string()
    none = read_tfrecords(str(spark_layout), partitioning=None)
    assert "year" not in none.schema().names


def test_partition_filter_never_opens_pruned_files(ray_local, spark_layout, tmp_path):
    log = tmp_path / "opened.log"
    fs = pafs.PyFileSystem(RecordingHandler(str(log)))
    keep = PathPartitionFilter.of(lambda d: d["year"] == "2021" and d["code"] == "us")
    ds = read_tfrecords(str(spark_layout), filesystem=fs, partition_filter=keep, columns=["id", "year"])
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(60, 80))
    # The dataset-level schema file (which a Spark-written dataset lacks) is looked for first.
    opened = set(log.read_text().split()) - {f"{spark_layout}/_tfrecord_schema.arrow"}
    assert opened, "the recording filesystem saw no opens: the test would prove nothing"
    assert all("year=2021/code=us" in p for p in opened), opened
    assert not any("year=2020" in p or "code=007" in p for p in opened)


def test_include_paths_extensions_missing_and_shuffle(ray_local, tf_files, tmp_path):
    directory = tf_files[""].parent
    (directory / "notes.txt").write_text("not a tfrecord")
    ds = read_tfrecords(str(directory), columns=["id", "path"], include_paths=True,
                        file_extensions=["tfrecord", "gz"])
    rows = ds.take_all()
    assert {r["path"] for r in rows} == {str(tf_files[""]), str(tf_files["GZIP"])}
    assert all((r["id"] < 100) == r["path"].endswith("a.tfrecord") for r in rows)

    with pytest.raises(ValueError, match="file extensions"):
        read_tfrecords(str(directory), file_extensions=["parquet"])
    with pytest.raises(FileNotFoundError, match="missing"):
        read_tfrecords([str(tf_files[""]), str(tmp_path / "missing")])
    ok = read_tfrecords([str(tf_files[""]), str(tmp_path / "missing")], ignore_missing_paths=True)
    assert ok.count() == 100

    files = [str(p) for p in tf_files.values()]
    for shuffle in ("files", FileShuffleConfig(seed=3)):
        shuffled = read_tfrecords(files, columns=["id"], shuffle=shuffle)
        assert sorted(r["id"] for r in shuffled.take_all()) == list(range(300))
    source = TFRecordDatasource(files, columns=["id"], shuffle=FileShuffleConfig(seed=3))
    orders = {tuple(t.metadata.input_files[0] for t in source.get_read_tasks(3)) for _ in range(2)}
    assert len(orders) == 1  # a fixed seed gives a fixed order


def test_sequence_example_and_byte_array(ray_local, tmp_path):
    path = tmp_path / "seq" / "s.tfrecord"
    payloads = []
    for i in range(20):
        ex = tf.train.SequenceExample()
        ex.context.feature["id"].int64_list.value.append(i)
        frames = ex.feature_lists.feature_list["frames"]
        for t in range(i % 4):
            frames.feature.add().float_list.value.extend([float(i), float(t)])
        payloads.append(ex.SerializeToString())
    tf_write(path, payloads)

    rows = sorted(read_tfrecords(str(path), record_type="SequenceExample").take_all(),
                  key=lambda r: r["id"])
    for i, r in enumerate(rows):
        context, lists = tf.io.parse_single_sequence_example(
            payloads[i],
            context_features={"id": tf.io.FixedLenFeature([], tf.int64)},
            sequence_features={"frames": tf.io.FixedLenSequenceFeature([2], tf.float32)},
        )
        assert r["id"] == int(context["id"])
        assert [list(map(float, f)) for f in r["frames"]] == lists["frames"].numpy().tolist()

    raw = read_tfrecords(str(path), record_type="ByteArray")
    assert raw.schema().names == ["record"]
    assert [r["record"] for r in raw.take_all()] == [
        t.numpy() for t in tf.data.TFRecordDataset(str(path))
    ]


def test_empty_listing_is_an_error(ray_local, tmp_path):
    (tmp_path / "empty" / "_SUCCESS").parent.mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_bytes(b"")
    with pytest.raises(ValueError, match="No TFRecord files"):
        read_tfrecords(str(tmp_path / "empty"))


def test_missing_feature_in_a_not_null_field_is_a_decode_error(ray_local, tmp_path):
    from ray_tfrecord import DecodeError

    path = str(tmp_path / "labels.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(3):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            if i != 1:
                feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[7]))
            record = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            w.write(record)
    # Record 1's header sits after record 0 (16 framing bytes plus its payload).
    first = tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[7]))})).ByteSize()
    strict = pa.schema([pa.field("id", pa.int64()), pa.field("label", pa.int64(), nullable=False)])
    with pytest.raises(DecodeError) as info:
        read_tfrecords(path, schema=strict).take_all()
    assert str(info.value) == (f"{path}, offset {16 + first}, column 'label': the record lacks this feature but the "
                               "schema declares the field not nullable; declare it nullable=True or write the "
                               "feature in every record")
    loose = pa.schema([pa.field("id", pa.int64()), pa.field("label", pa.int64())])
    rows = sorted(read_tfrecords(path, schema=loose).take_all(), key=lambda r: r["id"])
    assert [r["label"] for r in rows] == [7, None, 7]


def test_path_like_paths_read_like_strings(ray_local, tf_files):
    directory = tf_files[""].parent  # a pathlib.Path, as TensorFlow and Ray accept
    assert read_tfrecords(directory, columns=["id"]).count() == 300
    assert read_tfrecords([tf_files[""], tf_files["GZIP"]], columns=["id"]).count() == 200
    source = TFRecordDatasource(tf_files["ZLIB"], columns=["id"])
    assert sorted(r["id"] for r in ray.data.read_datasource(source).take_all()) == list(range(200, 300))


@pytest.mark.slow
def test_named_ray_options_reach_ray_and_no_deprecation_warning_comes_from_our_calls(tmp_path):
    """In a fresh process (a fresh DataContext, whose creation Ray 2.60 warns about) with Ray running: a read
    and a write with the read and write tasks' options given by name, deprecation warnings recorded."""
    code = """
import json, sys, warnings, ray
from ray_tfrecord import read_tfrecords, write_tfrecords
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, resources={"disk": 2},
         object_store_memory=200 << 20)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rows = read_tfrecords(sys.argv[1], columns=["id"], num_cpus=0.5, memory=1 << 20, resources={"disk": 1}).take_all()
    ds = read_tfrecords(sys.argv[1], columns=["id"], override_num_blocks=2, concurrency=1)
    result = write_tfrecords(ds, sys.argv[2], num_cpus=0.5, resources={"disk": 1}, concurrency=1)
deprecations = [w for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
print(json.dumps({"rows": len(rows), "written": result.num_rows,
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in deprecations]}))
"""
    src = tmp_path / "src"
    tf_write(src / "a.tfrecord", [make_example(i, np.random.default_rng(i)) for i in range(50)])
    out = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=240, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report == {"rows": 50, "written": 50, "warnings": []}


def test_read_tfrecords_leaves_starting_ray_to_ray_data(tf_files):
    """Without a running Ray the read asks for no task count (that would need the cluster's CPUs) and
    starts nothing itself; Ray Data decides (its read API starts Ray on first use). Only the options
    given reach Ray."""
    code = """
import functools, json, sys, ray, ray.data
real, calls = ray.data.read_datasource, []
ray.data.read_datasource = functools.wraps(real)(lambda source, **kw: calls.append([ray.is_initialized(), kw]))
from ray_tfrecord import read_tfrecords
read_tfrecords(sys.argv[1], num_cpus=0.5, ray_remote_args={"max_retries": 1})
print(json.dumps(calls))
"""
    out = subprocess.run([sys.executable, "-c", code, str(tf_files[""])], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    called = json.loads(out.stdout.splitlines()[-1])
    assert called == [[False, {"num_cpus": 0.5, "ray_remote_args": {"max_retries": 1}}]]
