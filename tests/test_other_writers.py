"""Directories other writers leave (tests/fixtures, made by tests/fixtures/make_fixtures.py with the
real Apache Beam, TensorFlow Datasets and tfrecord package), read by their directory path: exactly
the writer's data files, value for value what ``tf.data`` + ``tf.io.parse_example`` read from
them, with the staging output skipped (warned) and the sidecars left out (logged)."""

from __future__ import annotations

import json
import logging
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from ray_tfrecord import NotTFRecordError, TFRecordError, read_tfrecords
from ray_tfrecord._src.data.read.foreign import is_sidecar
from ray_tfrecord._src.data.read.listing import list_files

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "EXPECTED.json").read_text())
_DTYPES = {"int64_list": tf.int64, "float_list": tf.float32, "bytes_list": tf.string}


def tensorflow_rows(files: list[pathlib.Path]) -> list[dict]:
    """Each record of ``files`` as TensorFlow parses it: {feature: list of values}."""
    records = [r.numpy() for r in tf.data.TFRecordDataset([str(f) for f in files])]
    kinds: dict[str, str] = {}
    for r in records:
        for name, feature in tf.train.Example.FromString(r).features.feature.items():
            kinds.setdefault(name, feature.WhichOneof("kind"))
    parsed = tf.io.parse_example(records, {n: tf.io.VarLenFeature(_DTYPES[k]) for n, k in kinds.items()})
    columns = {n: tf.RaggedTensor.from_sparse(v).to_list() for n, v in parsed.items()}
    return [{n: columns[n][i] for n in kinds} for i in range(len(records))]


def as_lists(row: dict) -> dict:
    """A row read by read_tfrecords in TensorFlow's terms: every feature a list of values."""
    out = {}
    for name, value in row.items():
        if isinstance(value, np.ndarray):
            value = value.tolist()
        out[name] = [] if value is None else value if isinstance(value, list) else [value]
    return out


def canonical(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted((k, tuple(v)) for k, v in row.items())) for row in rows)


def read_and_compare(name: str) -> list[dict]:
    """Read fixture ``name`` by its directory; check it against TensorFlow on the writer's data files."""
    directory = FIXTURES / name
    expected = EXPECTED[name]
    ds = read_tfrecords(str(directory))
    assert ds.count() == expected["rows"]
    rows = ds.take_all()
    assert len(rows) == expected["rows"]
    ours = [as_lists({k: v for k, v in r.items() if k != "split"}) for r in rows]
    theirs = tensorflow_rows([directory / f for f in expected["data_files"]])
    assert canonical(ours) == canonical(theirs)
    return rows


def test_beam_retried_run_reads_each_row_once_and_warns_of_the_failed_run(ray_local):
    every_file = [p for p in (FIXTURES / "beam").rglob("*") if p.is_file()]
    # The failed run's temporary shards are valid records: read along, they duplicate every row.
    assert sum(1 for _ in tf.data.TFRecordDataset([str(p) for p in every_file])) == 2 * EXPECTED["beam"]["rows"]
    warning = (r"skipped the staging output of unfinished or failed jobs: .*/beam/beam-temp-part-[0-9a-f]+ "
               r"\(Apache Beam\); it holds another attempt's records, which would duplicate rows")
    with pytest.warns(UserWarning, match=warning):
        read_and_compare("beam")
    # A glob's wildcard matches the staging directory's name; it is skipped all the same.
    with pytest.warns(UserWarning, match=warning):
        assert read_tfrecords(str(FIXTURES / "beam" / "*")).count() == EXPECTED["beam"]["rows"]


def test_spark_directory_skips_the_crc_files_success_and_a_leftover_attempt(ray_local):
    with pytest.warns(UserWarning, match=r"skipped the staging output .*/spark/_temporary \(Hadoop/Spark"):
        read_and_compare("spark")


@pytest.mark.parametrize("name", ["tfrecord_pkg", "dali"])
def test_index_files_of_the_tfrecord_package_and_dali_are_left_out(ray_local, caplog, name):
    with caplog.at_level(logging.INFO, logger="ray_tfrecord._src.data.read.foreign"):
        read_and_compare(name)
    assert f"left out 2 index file(s), not records: {FIXTURES / name}/" in caplog.text


def test_tfds_dataset_reads_its_shards_with_their_split(ray_local, caplog):
    with caplog.at_level(logging.INFO, logger="ray_tfrecord._src.data.read.foreign"):
        rows = read_and_compare("tfds")
    assert "left out 3 TFDS metadata file(s), not records:" in caplog.text
    assert {s: sum(r["split"] == s for r in rows) for s in ("train", "test")} == {"train": 200, "test": 100}
    # A glob naming one split reads it alone, its column still there.
    train = read_tfrecords(str(FIXTURES / "tfds" / "*-train.tfrecord-*"))
    assert train.count() == 200 and set(train.unique("split")) == {"train"}
    assert list_files(str(FIXTURES / "tfds"), partitioning=None).partition_schema.names == []


def test_several_versions_of_a_tfds_dataset_stop_the_read(tmp_path):
    for version in ("1.0.0", "1.0.10", "1.0.2"):
        shutil.copytree(FIXTURES / "tfds", tmp_path / "toy_writers" / version)
    with pytest.raises(TFRecordError) as info:
        list_files(str(tmp_path))
    assert str(info.value) == (f"{tmp_path}: holds 3 versions of the TFDS dataset {tmp_path}/toy_writers (1.0.0, "
                               f"1.0.2, 1.0.10), each with every row; read one, such as "
                               f"'{tmp_path}/toy_writers/1.0.10'")
    assert len(list_files(str(tmp_path / "toy_writers" / "1.0.10")).files) == 2
    # Named one by one, they are read as asked.
    assert len(list_files([str(tmp_path / "toy_writers" / v) for v in ("1.0.0", "1.0.2")]).files) == 4


def test_an_unknown_file_stops_the_read_naming_it_and_the_fix(tmp_path):
    tfds = shutil.copytree(FIXTURES / "tfds", tmp_path / "tfds")
    (tfds / "notes.txt").write_text("made by hand\n")
    with pytest.raises(NotTFRecordError) as info:
        list_files(str(tfds))
    assert str(info.value) == (f"{tfds}/notes.txt: not TFRecord data, nor a sidecar this reader recognises; leave "
                               f"it out of the read with the glob '{tfds}/*.tfrecord*' as the path")
    assert len(list_files(f"{tfds}/*.tfrecord*").files) == 2

    beam = shutil.copytree(FIXTURES / "tfrecord_pkg", tmp_path / "pkg")
    (beam / "part-1.index").write_bytes(b"\x00\x01garbage")  # a sidecar's name, not its content
    with pytest.raises(NotTFRecordError, match=r"pkg/part-1.index: .* with file_extensions=\['tfrecord'\]$"):
        list_files(str(beam))
    assert len(list_files(str(beam), file_extensions=["tfrecord"]).files) == 2


def test_a_sidecar_name_on_tfrecord_data_is_read_as_data(tmp_path):
    # Content decides: records under an index's name are never skipped quietly.
    shutil.copy(FIXTURES / "dali" / "train-0.tfrecord", tmp_path / "train-0.idx")
    shutil.copy(FIXTURES / "dali" / "train-0.tfrecord", tmp_path / "dataset_info.json")
    assert sorted(f.path for f in list_files(str(tmp_path)).files) == [
        f"{tmp_path}/dataset_info.json", f"{tmp_path}/train-0.idx"]


def test_sidecar_content_rules():
    assert is_sidecar("index", b"0 120\n120 98\n")
    assert is_sidecar("index", b"0 120\n120 9", complete=False)  # a cut last line
    assert not is_sidecar("index", b"0 120\nabc\n")
    assert not is_sidecar("index", b"")
    assert is_sidecar("TFDS metadata", b'{"name": "toy"}')
    assert not is_sidecar("TFDS metadata", b'{"name": ')
    assert is_sidecar("TFDS metadata", b'{"name": "a very long', complete=False)
    assert is_sidecar("TFDS metadata", b"cat\ndog\n")
    assert not is_sidecar("TFDS metadata", b"\xff\xfe\x00")


def test_path_like_paths(tmp_path):
    dali = FIXTURES / "dali"
    assert list_files(dali).files == list_files(str(dali)).files
    assert [f.path for f in list_files([dali / "train-1.tfrecord", dali / "train-0.tfrecord"]).files] == [
        str(dali / "train-1.tfrecord"), str(dali / "train-0.tfrecord")]
