"""Reading and writing on S3, against a real local S3 server (moto) started here."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray
from ray.data.datasource.partitioning import PathPartitionFilter

from ray_tfrecord import read_tfrecords, write_tfrecords
from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.framing import RecordWriter, frame_records
from ray_tfrecord._src.core.index import build_index, is_index_path, write_index
from ray_tfrecord._src.core.manifest import version_path
from ray_tfrecord._src.data.read.datasource import TFRecordDatasource
from tests.filesystems import moto_s3, s3_filesystem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a local S3 server: the full tier
BUCKET = "tfr"


@pytest.fixture(scope="module")
def s3():
    with moto_s3(BUCKET) as endpoint:
        yield s3_filesystem(endpoint)


def _keys(fs, prefix):
    return sorted(
        i.path for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
        if i.is_file
    )


def test_partitioned_write_and_read_on_s3(ray_local, s3):
    ds = ray.data.from_items([{"number": [1, 2, 8][n % 3], "word": f"w{n}"} for n in range(30)])
    result = write_tfrecords(ds, f"s3://{BUCKET}/words", filesystem=s3, partition_cols=["number"])
    keys = _keys(s3, f"{BUCKET}/words")
    assert f"{BUCKET}/words/_SUCCESS" in keys
    assert not any("_temporary" in k for k in keys)
    assert {k.split("/")[2] for k in keys if k.count("/") == 3} == {"number=1", "number=2", "number=8"}
    # No sidecars on an object store: the write's version of the log holds every file's index, and lists
    # exactly the files; no manifest of the layout before the log.
    assert not any(is_index_path(k) for k in keys)
    assert f"{BUCKET}/words/_tfrecord_manifest.json" not in keys
    with s3.open_input_stream(version_path(f"{BUCKET}/words", result.version)) as f:
        manifest = json.loads(f.read())["files"]
    assert sorted(f"{BUCKET}/words/{e['path']}" for e in manifest) == sorted(result.files)
    assert all(e["index"] for e in manifest) and sum(e["rows"] for e in manifest) == 30
    assert result.num_rows == 30

    back = read_tfrecords(f"s3://{BUCKET}/words", filesystem=s3, schema=pa.schema([("word", pa.string())]))
    assert sorted(back.take_all(), key=lambda r: r["word"]) == sorted(ds.take_all(), key=lambda r: r["word"])

    only_8 = PathPartitionFilter.of(lambda d: d["number"] == "8")
    assert {r["number"] for r in read_tfrecords(f"s3://{BUCKET}/words", filesystem=s3,
                                                 partition_filter=only_8).take_all()} == {8}

    with pytest.raises(ValueError, match="already exists"):
        write_tfrecords(ds, f"s3://{BUCKET}/words", filesystem=s3)
    write_tfrecords(ds.limit(3), f"s3://{BUCKET}/words", filesystem=s3, mode="overwrite")
    assert read_tfrecords(f"s3://{BUCKET}/words", filesystem=s3).count() == 3


@pytest.mark.parametrize("indexed", [False, True])
def test_split_read_on_s3(ray_local, s3, monkeypatch, indexed):
    rng = np.random.default_rng(4)
    payloads = [rng.bytes(int(rng.integers(1, 2000))) for _ in range(800)]
    path = f"{BUCKET}/big{int(indexed)}/file.tfrecord"
    with RecordWriter(s3.open_output_stream(path)) as w:
        w.write(frame_records(payloads))
    if indexed:
        write_index(s3, path, build_index(s3, path, spacing_bytes=8192))
    monkeypatch.setattr(sizes, "MIN_SPLIT_BYTES", 64 << 10)
    source = TFRecordDatasource(f"s3://{BUCKET}/big{int(indexed)}", filesystem=s3, record_type="ByteArray")
    tasks = source.get_read_tasks(6)
    assert len(tasks) >= 4
    assert (tasks[0].metadata.num_rows is not None) == indexed
    records = [r["record"] for t in tasks for b in t() for r in b.to_pylist()]
    assert records == payloads
    assert sorted(r["record"] for r in ray.data.read_datasource(source).take_all()) == sorted(payloads)
