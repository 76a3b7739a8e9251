"""TFRecordSource: records by global index over files TensorFlow wrote, checked against TensorFlow's
own parser; batched reads against single ones; damaged, compressed and mistyped files; pickling; Grain's
global shuffle with a checkpoint mid-epoch; the calls PyTorch's map-style DataLoader makes."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_tfrecord import CorruptRecordError, DecodeError, TFRecordError, TFRecordSource
from tests.reference import encode_example

tf = pytest.importorskip("tensorflow")

COUNTS = (300, 1, 500)  # records per file: a file of one record between two of several blocks
SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32())), ("name", pa.binary()),
                    ("opt", pa.int64())])
SPEC = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.VarLenFeature(tf.float32),
        "name": tf.io.FixedLenFeature([], tf.string), "opt": tf.io.VarLenFeature(tf.int64)}
BLOCK = 2048  # a few dozen records a block: every file but the one-record one has several


def _record(i: int) -> bytes:
    features = {"id": ("int64_list", [i]), "x": ("float_list", [i / 4] * (i % 7)), "name": ("bytes_list", [b"n%d" % i])}
    if i % 3:
        features["opt"] = ("int64_list", [-i])
    return encode_example(features)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Files tf.io.TFRecordWriter wrote (no index sidecar: the source's plan scans them), and every
    record's serialized bytes in global order."""
    root = tmp_path_factory.mktemp("tf_written")
    records, paths, i = [], [], 0
    for k, count in enumerate(COUNTS):
        paths.append(str(root / f"part-{k}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as w:
            for _ in range(count):
                records.append(_record(i))
                w.write(records[-1])
                i += 1
    return paths, records


@pytest.fixture(scope="module")
def source(written):
    return TFRecordSource(written[0], schema=SCHEMA, block_bytes=BLOCK)


def _same(row: dict, expected: dict) -> None:
    assert list(row) == ["id", "x", "name", "opt"]
    assert row["id"] == expected["id"].numpy() and isinstance(row["id"], np.int64)
    np.testing.assert_array_equal(row["x"], expected["x"].values.numpy())
    assert row["x"].dtype == np.float32
    assert row["name"] == expected["name"].numpy()
    opt = expected["opt"].values.numpy()
    # A missing feature is None (TensorFlow's VarLenFeature gives an empty list for it).
    assert row["opt"] is None if len(opt) == 0 else row["opt"] == opt[0]


def test_records_at_random_indices_are_tensorflows(source, written):
    _, records = written
    assert len(source) == len(records) == sum(COUNTS)
    for i in [0, 299, 300, 301, len(records) - 1, *np.random.default_rng(0).integers(0, len(records), 40)]:
        _same(source[int(i)], tf.io.parse_single_example(records[i], SPEC))
    assert source[-1]["id"] == len(records) - 1


def test_raw_records_are_the_serialized_bytes(written):
    paths, records = written
    raw = TFRecordSource(paths, schema=SCHEMA, raw=True, block_bytes=BLOCK)
    wanted = [5, 300, 799, 5, 0]
    assert raw.__getitems__(wanted) == [records[i] for i in wanted]
    assert raw[300] == records[300]
    assert raw.take(wanted).column("record").to_pylist() == [records[i] for i in wanted]


@settings(max_examples=60, deadline=None)
@given(indices=st.lists(st.integers(-sum(COUNTS), sum(COUNTS) - 1), max_size=40), cache=st.sampled_from([0, 1 << 20]))
def test_a_batch_is_the_records_one_by_one(written, indices, cache):
    paths, records = written
    # A fresh source each time: first touches, misses, the cache and the gather all take turns.
    source = TFRecordSource(paths, schema=SCHEMA, block_bytes=BLOCK, cache_bytes=cache)
    batch = source.__getitems__(indices)
    assert [int(r["id"]) for r in batch] == [i % len(records) for i in indices]
    single = [source[i] for i in indices]
    for a, b in zip(batch, single):
        assert a.keys() == b.keys() and a["name"] == b["name"] and a["opt"] == b["opt"]
        np.testing.assert_array_equal(a["x"], b["x"])
    assert source.take(indices).column("id").to_pylist() == [i % len(records) for i in indices]


def test_columns_select_and_order(written):
    source = TFRecordSource(written[0], schema=SCHEMA, columns=["name", "id"], block_bytes=BLOCK)
    assert source[7] == {"name": b"n7", "id": 7}
    with pytest.raises(ValueError, match=r"columns=\['nope'\]"):
        TFRecordSource(written[0], schema=SCHEMA, columns=["nope"])


def test_partition_columns_come_with_each_record(tmp_path):
    for year, first in ((2020, 0), (2021, 10)):
        (tmp_path / f"year={year}").mkdir()
        with tf.io.TFRecordWriter(str(tmp_path / f"year={year}" / "part.tfrecord")) as w:
            for i in range(first, first + 10):
                w.write(_record(i))
    source = TFRecordSource(str(tmp_path), schema=SCHEMA, columns=["id", "year"])
    assert [(int(r["id"]), int(r["year"])) for r in source.__getitems__([12, 3, 19])] == [
        (12, 2021), (3, 2020), (19, 2021)]


def test_an_index_out_of_range_is_an_index_error(source):
    n = len(source)
    for bad in (n, -n - 1, [0, n]):
        with pytest.raises(IndexError, match=f"out of range: the source holds {n} records"):
            source.__getitems__(bad if isinstance(bad, list) else [bad])
    with pytest.raises(IndexError):
        source[n]
    with pytest.raises(TypeError, match="integers"):
        source.__getitems__([1.5])
    assert source.__getitems__([]) == [] and source.take([]).num_rows == 0


def test_a_compressed_file_is_refused_naming_it_and_the_fix(tmp_path):
    path = str(tmp_path / "part.tfrecord.gz")
    with tf.io.TFRecordWriter(path, options="GZIP") as w:
        w.write(_record(0))
    with pytest.raises(TFRecordError, match="GZIP/ZLIB-compressed file.*write the dataset again uncompressed") as e:
        TFRecordSource(path, schema=SCHEMA)
    assert e.value.path == path


def _offsets(records: list[bytes]) -> list[int]:
    return [int(o) for o in np.cumsum([0] + [len(r) + 16 for r in records])]


@pytest.mark.parametrize("touched", [False, True], ids=["first-touch", "record-read"])
def test_a_damaged_record_names_its_file_and_offset(written, tmp_path, touched):
    paths, records = written
    mine = tmp_path / "part.tfrecord"
    data = bytearray(open(paths[0], "rb").read())
    mine.write_bytes(data)
    source = TFRecordSource(str(mine), schema=SCHEMA, block_bytes=BLOCK, cache_bytes=0)
    if touched:
        source.__getitems__(range(len(source)))  # every block's offsets known: a record is then read alone
    at = _offsets(records[:300])[123]
    data[at + 16] ^= 0xFF  # the record's first payload byte
    mine.write_bytes(data)
    with pytest.raises(CorruptRecordError) as e:
        source[123]
    assert (e.value.path, e.value.offset) == (str(mine), at)


def test_a_mistyped_feature_names_file_offset_and_column(tmp_path):
    good, bad = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    with tf.io.TFRecordWriter(str(good)) as w:
        for i in range(4):
            w.write(_record(i))
    wrong = encode_example({"id": ("float_list", [1.0]), "x": ("float_list", []), "name": ("bytes_list", [b""])})
    with tf.io.TFRecordWriter(str(bad)) as w:
        w.write(_record(4))
        w.write(wrong)
    source = TFRecordSource([str(good), str(bad)], schema=SCHEMA)
    second = len(_record(4)) + 16
    for indices in ([5], [0, 5, 2]):  # one file's buffer, and records gathered from two files
        with pytest.raises(DecodeError) as e:
            source.__getitems__(indices)
        assert (e.value.path, e.value.offset, e.value.column) == (str(bad), second, "id")


def test_pickles_small_without_its_open_files(source, written):
    source[1]
    shipped = pickle.dumps(source)
    assert len(shipped) < 4096 and b"part-0" in shipped
    copy = pickle.loads(shipped)
    assert copy._local is None and copy[500]["id"] == 500 and repr(copy) == repr(source)


def test_grain_global_shuffle_resumes_mid_epoch_exactly_once(written):
    grain = pytest.importorskip("grain", reason="grain has no wheel for this Python")
    paths, records = written
    n, epochs, batch = len(records), 3, 32

    def pipeline():
        # A fresh source, as a resumed job would make it.
        source = TFRecordSource(paths, schema=SCHEMA, columns=["id"], block_bytes=BLOCK)
        return grain.MapDataset.source(source).shuffle(seed=7).repeat(epochs).batch(batch).to_iter_dataset()

    def ids(iterator, count=None):
        out = []
        for b in iterator:
            out += b["id"].tolist()
            if count is not None and len(out) >= count:
                break
        return out

    it = iter(pipeline())
    head = ids(it, n + n // 2)  # half way through the second epoch
    state = it.get_state()
    tail = ids(it)
    resumed = iter(pipeline())
    resumed.set_state(state)
    assert ids(resumed) == tail
    stream = head + tail
    assert len(stream) == epochs * n
    orders = [stream[k * n:(k + 1) * n] for k in range(epochs)]
    for order in orders:
        assert sorted(order) == list(range(n))
    assert len({tuple(o) for o in orders}) == epochs and orders[0] != list(range(n))


def test_pytorch_map_style_fetches(source, written):
    """What ``torch.utils.data._utils.fetch._MapDatasetFetcher.fetch`` calls, without torch (its Linux
    wheels are gigabytes): with a batch sampler, ``dataset.__getitems__(indices)`` if the dataset has
    one, which must return one sample per index; without, ``dataset[index]``; and ``len(dataset)``
    for its samplers. The dataset is pickled to worker processes."""
    indices = [int(i) for i in np.random.default_rng(1).permutation(len(source))[:64]]
    assert getattr(source, "__getitems__", None)
    batch = pickle.loads(pickle.dumps(source)).__getitems__(indices)
    assert isinstance(batch, list) and [int(r["id"]) for r in batch] == indices
    assert int(source[indices[0]]["id"]) == indices[0] and len(source) == sum(COUNTS)


@pytest.mark.slow  # a local S3 server
@pytest.mark.timeout(300)
def test_on_s3_a_random_record_is_one_request_and_records_in_order_one_a_block(written):
    from bench.proxy import LatencyProxy
    from tests.filesystems import moto_s3, s3_filesystem

    paths, records = written
    with moto_s3("random") as endpoint, LatencyProxy(endpoint) as proxy:
        fs = s3_filesystem(proxy.endpoint)
        keys = [f"random/data/part-{k}.tfrecord" for k in range(len(paths))]
        for path, key in zip(paths, keys):
            with open(path, "rb") as src, fs.open_output_stream(key) as dst:
                dst.write(src.read())
        source = TFRecordSource([f"s3://{k}" for k in keys], schema=SCHEMA, raw=True, filesystem=fs,
                                block_bytes=BLOCK, cache_bytes=0)
        wanted = [int(i) for i in np.random.default_rng(2).permutation(len(records))[:30]]
        source.__getitems__(range(len(records)))  # every block touched, every file open
        proxy.reset()
        assert [source[i] for i in wanted] == [records[i] for i in wanted]
        assert proxy.count() == len(wanted)  # one ranged GET a record
        proxy.reset()
        assert source.__getitems__(list(range(40, 90))) == records[40:90]
        blocks = set(np.searchsorted(source._first, range(40, 90), side="right"))
        assert len(blocks) > 1 and proxy.count() == len(blocks)  # adjacent records: one request a block
        # In order, one by one, with a cache of about two blocks (each evicted before it comes round again):
        # a block's first miss reads its record, the second the block, which serves the rest.
        ordered = TFRecordSource([f"s3://{k}" for k in keys], schema=SCHEMA, raw=True, filesystem=fs,
                                 block_bytes=BLOCK, cache_bytes=2 * BLOCK + 1024)
        ordered.__getitems__(range(len(records)))
        proxy.reset()
        assert [ordered[i] for i in range(300, len(records))] == records[300:]
        blocks = set(np.searchsorted(ordered._first, range(300, len(records)), side="right"))
        assert proxy.count() <= 2 * len(blocks) < len(records) - 300
