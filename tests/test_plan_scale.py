"""Planning at scale: plan_splits scans unindexed files in Ray tasks, keeps what it found (sidecars in
a dataset this package wrote, else the index cache), plans the same files again without reading their
records, and a plan of thousands of splits travels as an object reference."""

import hashlib
import os
import pickle

import numpy as np
import pyarrow as pa
import pytest
import ray
import tensorflow as tf

import ray_tfrecord
from ray_tfrecord._src.core.errors import CorruptRecordError
from ray_tfrecord._src.core.index import FINGERPRINT_BYTES, index_candidates
from ray_tfrecord._src.data.feed import indexing
from ray_tfrecord._src.data.feed.by_reference import BY_REFERENCE_ITEMS, StoredTuple
from ray_tfrecord.tf import plan_splits

pytestmark = pytest.mark.timeout(300)

SCHEMA = pa.schema([("id", pa.int64()), ("pad", pa.binary())])


def _noise(i: int) -> bytes:
    return np.random.default_rng(i).bytes(100)  # GZIP cannot shrink it: every file spans its fingerprints


def _write_tf(directory, files: int = 3, rows: int = 200, gzip_last: bool = False) -> list[str]:
    """Files of TensorFlow's own writer, each well over two fingerprints long (ids in order)."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for f in range(files):
        path = os.path.join(directory, f"part-{f}.tfrecord")
        options = tf.io.TFRecordOptions(compression_type="GZIP") if gzip_last and f == files - 1 else None
        with tf.io.TFRecordWriter(path, options) as w:
            for i in range(f * rows, (f + 1) * rows):
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "pad": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_noise(i)])),
                })).SerializeToString())
        paths.append(path)
    return paths


def _spoil_records(path: str) -> None:
    """Zero every byte between the file's fingerprints: a scan fails on them, an index does not read them."""
    size = os.path.getsize(path)
    assert size > 2 * FINGERPRINT_BYTES + 1000
    with open(path, "r+b") as f:
        f.seek(FINGERPRINT_BYTES)
        f.write(bytes(size - 2 * FINGERPRINT_BYTES))


def _bounds(plan):
    return [(os.path.basename(s.path), s.start, s.end, s.rows) for s in plan.splits]


def test_a_second_plan_of_another_writers_files_reads_no_records(ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv(indexing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    paths = _write_tf(tmp_path / "tf", gzip_last=True)
    # The scans run in Ray tasks: this process could not do them.
    monkeypatch.setattr(indexing, "build_index", None)
    first = plan_splits(str(tmp_path / "tf"), schema=SCHEMA, split_bytes=4096)
    monkeypatch.undo()
    monkeypatch.setenv(indexing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert first.rows == 600 and len(first.splits) > 6
    assert [s.rows for s in first.splits if s.end is None] == [200]  # the GZIP file, whole
    # TensorFlow's directory stays as TensorFlow left it: the indexes went to the cache.
    assert sorted(os.listdir(tmp_path / "tf")) == ["part-0.tfrecord", "part-1.tfrecord", "part-2.tfrecord"]
    assert sum(len(files) for _, _, files in os.walk(tmp_path / "cache")) == 3
    for path in paths:
        _spoil_records(path)
    assert _bounds(plan_splits(str(tmp_path / "tf"), schema=SCHEMA, split_bytes=4096)) == _bounds(first)
    # Without what the first plan kept, the spoiled records are read, and refused, naming file and offset.
    monkeypatch.setenv(indexing.CACHE_DIR_ENV, str(tmp_path / "empty"))
    with pytest.raises(CorruptRecordError) as raised:
        plan_splits(str(tmp_path / "tf"), schema=SCHEMA, split_bytes=4096)
    assert raised.value.path in paths and raised.value.offset is not None


def test_a_changed_file_is_scanned_again(ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv(indexing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    (path,) = _write_tf(tmp_path / "tf", files=1)
    plan_splits(str(tmp_path / "tf"), schema=SCHEMA, split_bytes=4096)
    (again,) = _write_tf(tmp_path / "other", files=2)[1:]
    os.replace(again, path)  # same size, other records
    plan = plan_splits(str(tmp_path / "tf"), schema=SCHEMA, split_bytes=4096)
    assert plan.rows == 200
    table = ray_tfrecord.read_tfrecords(str(tmp_path / "tf"), schema=SCHEMA).to_arrow_refs()
    assert sorted(pa.concat_tables(ray.get(table)).column("id").to_pylist()) == list(range(200, 400))


def test_a_dataset_this_package_wrote_gets_sidecars(ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv(indexing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    _write_tf(tmp_path / "tf")
    written = str(tmp_path / "written")
    ray_tfrecord.write_tfrecords(ray_tfrecord.read_tfrecords(str(tmp_path / "tf"), schema=SCHEMA), written)
    data = sorted(os.path.join(written, n) for n in os.listdir(written) if not n.startswith(("_", ".")))
    for path in data:  # as a writer without sidecars would leave it (files this small get none anyway)
        for sidecar in index_candidates(path):
            if os.path.exists(sidecar):
                os.remove(sidecar)
    first = plan_splits(written, split_bytes=4096)
    assert all(any(os.path.exists(s) for s in index_candidates(p)) for p in data)
    assert not os.path.exists(tmp_path / "cache")
    for path in data:
        if os.path.getsize(path) > 2 * FINGERPRINT_BYTES + 1000:
            _spoil_records(path)
    assert _bounds(plan_splits(written, split_bytes=4096)) == _bounds(first)


def _digest(plan) -> str:
    return hashlib.sha256(repr(tuple(plan.splits)).encode()).hexdigest()


def test_a_plan_of_thousands_of_splits_travels_by_reference(ray_local, tmp_path):
    _write_tf(tmp_path / "tf", files=1, rows=3000)
    plan = plan_splits(str(tmp_path / "tf"), schema=SCHEMA, split_bytes=200)
    assert isinstance(plan.splits, StoredTuple) and len(plan.splits) >= BY_REFERENCE_ITEMS
    inline = len(pickle.dumps(tuple(plan.splits)))
    config = {"plan": plan}
    assert len(ray.cloudpickle.dumps(config)) < inline / 20

    @ray.remote
    def in_a_worker(config):
        plan = config["plan"]
        return plan.fingerprint(), _digest(plan), len(ray.cloudpickle.dumps(plan))

    fingerprint, digest, again = ray.get(in_a_worker.remote(config))
    assert fingerprint == plan.fingerprint() and digest == _digest(plan)
    assert again < inline / 20  # pickled again there (for its read tasks): still the reference
    small = StoredTuple(range(10))
    assert pickle.loads(pickle.dumps(small)) == small and len(pickle.dumps(small)) < 100
