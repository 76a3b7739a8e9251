"""The ray-tfrecord console script: inspect, verify, index, convert."""

import os
import struct
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from ray_tfrecord import read_tfrecords
from ray_tfrecord._src.cli import main
from ray_tfrecord._src.core.index import RecordIndex, index_path
from ray_tfrecord._src.core.manifest import read_manifest
from ray_tfrecord._src.data.write.commit import Commit

pytestmark = pytest.mark.timeout(300)


def _write(path, n, start=0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(start, start + n):
            ex = tf.train.Example()
            ex.features.feature["id"].int64_list.value.append(i)
            ex.features.feature["text"].bytes_list.value.append(b"row%d" % i)
            w.write(ex.SerializeToString())


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    _write(root / "split=train" / "part-0.tfrecord", 30)
    _write(root / "split=test" / "part-0.tfrecord", 10, start=30)
    (root / "_SUCCESS").write_bytes(b"")
    return root


def test_inspect(ray_local, dataset, capsys):
    assert main(["inspect", str(dataset), "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert "files: 2" in out
    assert "split: string (2 values: 'test', 'train')" in out
    assert "id: int64" in out and "text: binary" in out
    assert "records: 40" in out
    assert out.count('"id":') == 2


def _schema_block(out: str) -> str:
    return out[out.index("schema ("):out.index("records:")]


def test_inspect_of_a_file_or_partition_shows_the_datasets_recorded_schema(ray_local, tmp_path, capsys):
    import ray

    from ray_tfrecord import write_tfrecords

    root = tmp_path / "ds"
    # "note" is in part=1's rows only: part=0's file lacks the feature altogether.
    table = pa.table({"name": ["a", "b", "c"], "note": [None, "x", "y"], "part": [0, 1, 1]})
    write_tfrecords(ray.data.from_arrow(table), str(root), partition_cols=["part"])
    (file,) = (root / "part=0").iterdir()
    blocks = []
    for path in (root, root / "part=0", file):  # path-like, as a caller may pass them
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["inspect", path]) == 0
        # Ray 2.50 leaks its Ray Data log files' handles (ResourceWarning): not ours to fix.
        assert [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)] == []
        blocks.append(_schema_block(capsys.readouterr().out))
    # TFRecord stores strings as bytes: read alone, the file would show "name: binary".
    assert blocks[0] == f"schema (recorded for the dataset at {root}):\n  name: string\n  note: string\n  part: int64\n"
    assert blocks[1] == blocks[2] == blocks[0]


def test_inspect_says_when_the_schema_is_inferred(ray_local, dataset, capsys):
    assert main(["inspect", dataset / "split=test" / "part-0.tfrecord"]) == 0
    assert _schema_block(capsys.readouterr().out).startswith(
        "schema (inferred from a sample of the records; none recorded):\n")


@pytest.mark.slow
def test_inspect_prints_no_deprecation_warning(dataset):
    # A process of its own: Ray warns when a process creates its first Ray Data context.
    env = {**os.environ, "RAY_ADDRESS": "local"}
    run = subprocess.run(
        [sys.executable, "-W", "default", "-m", "ray_tfrecord._src.cli", "inspect", str(dataset), "--num-cpus", "1"],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "records: 40" in run.stdout
    # Ray 2.50 leaks file handles at start-up (ResourceWarning under -W default) and tips every ray.init()
    # about GPU variables (a FutureWarning): its own, whoever starts it.
    warned = [line for line in run.stderr.splitlines() if "Warning" in line and "ResourceWarning" not in line
              and "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO" not in line]
    assert warned == [], run.stderr


def test_shorten_long_lists_in_shown_rows():
    from ray_tfrecord._src.cli import _shorten

    assert _shorten(list(range(784))) == [0, 1, 2, 3, 4, 5, 6, 7, "... (784 values)"]
    assert _shorten([[1] * 9, [2]]) == [[1] * 8 + ["... (9 values)"], [2]]
    assert _shorten(b"x") == b"x"


def test_verify_reports_bad_offsets(ray_local, dataset, capsys):
    assert main(["verify", str(dataset)]) == 0
    assert "40 good records, 0 corrupt" in capsys.readouterr().out

    bad = dataset / "split=train" / "part-0.tfrecord"
    data = bytearray(bad.read_bytes())
    pos = 0
    for _ in range(3):  # header offset of record 3
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    data[pos + 14] ^= 0x01
    bad.write_bytes(bytes(data))
    assert main(["verify", str(dataset)]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT {bad} offset {pos}: " in out
    assert "39 good records, 1 corrupt" in out


def test_index_writes_sidecars(ray_local, dataset, capsys):
    assert main(["index", str(dataset), "--spacing", "100"]) == 0
    out = capsys.readouterr().out
    assert out.count("indexed: ") == 2
    f = dataset / "split=train" / "part-0.tfrecord"
    index = RecordIndex.from_bytes(open(index_path(str(f)), "rb").read(), path="x")
    assert index.num_records == 30 and len(index.offsets) > 1


def test_convert_parquet_partitioned(ray_local, tmp_path, capsys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"day": [1, 1, 2, 3], "v": [0.1, 1.5, 2.5, 3.5], "s": ["a", "b", "c", "d"]}), src)
    dst = tmp_path / "out"
    argv = ["convert", str(src), str(dst), "--partition-by", "day", "--compression", "gzip"]
    # 0.1 has no exact float32 form: refused unless narrowing is allowed.
    assert main(argv) == 2
    assert "v" in capsys.readouterr().err
    assert main(argv + ["--allow-float64-narrowing"]) == 0
    assert "wrote 4 records" in capsys.readouterr().out
    latest = read_manifest(pafs.LocalFileSystem(), str(dst))  # the log: the empty first version, then the files
    assert sorted(os.listdir(dst)) == ["_SUCCESS", "_tfrecord_log.00000000000000000001.json",
                                       "_tfrecord_log.00000000000000000002.json", "_tfrecord_schema.arrow",
                                       "_tfrecord_schema.pbtxt", "day=1", "day=2", "day=3"]
    # Every row in a file the version lists (how many files a partition gets is Ray's bundling: 3 on
    # Ray 2.60, 4 on 2.50), each under its partition's directory.
    assert latest is not None and latest.version == 2 and sum(e.rows for e in latest.entries) == 4
    assert {e.rel_path.split('/')[0] for e in latest.entries} == {'day=1', 'day=2', 'day=3'}
    (f,) = os.listdir(dst / "day=2")
    (rec,) = list(tf.data.TFRecordDataset(str(dst / "day=2" / f), compression_type="GZIP"))
    ex = tf.train.Example.FromString(rec.numpy())
    assert ex.features.feature["s"].bytes_list.value == [b"c"]
    assert np.isclose(ex.features.feature["v"].float_list.value[0], 2.5)


def test_console_script_entry_point():
    script = os.path.join(os.path.dirname(sys.executable), "ray-tfrecord")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for command in ("inspect", "verify", "convert", "index"):
        assert command in result.stdout


def test_convert_compression_level_and_min_rows_per_file(ray_local, tmp_path, capsys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(300)), "s": ["the same words again"] * 300}), src)
    base = ["convert", str(src), "--compression", "zlib", "--min-rows-per-file", "300"]
    assert main(base[:2] + [str(tmp_path / "fast")] + base[2:] + ["--compression-level", "0"]) == 0
    assert main(base[:2] + [str(tmp_path / "small")] + base[2:] + ["--compression-level", "9"]) == 0
    sizes = {}
    for name in ("fast", "small"):
        (f,) = [p for p in os.listdir(tmp_path / name) if not p.startswith("_")]  # 300 rows: one file
        path = str(tmp_path / name / f)
        ids = [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0]
               for r in tf.data.TFRecordDataset(path, compression_type="ZLIB")]
        assert sorted(ids) == list(range(300))
        sizes[name] = os.path.getsize(path)
    assert sizes["small"] < sizes["fast"] / 4  # level 0 stores, level 9 compresses: the flag reached zlib


def test_convert_compression_level_needs_compression_and_a_zlib_level(tmp_path, capsys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1]}), src)
    assert main(["convert", str(src), str(tmp_path / "out"), "--compression-level", "9"]) == 2
    assert capsys.readouterr().err.strip() == (
        "ray-tfrecord convert: --compression-level applies to compressed files only; add --compression gzip or "
        "--compression zlib")
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(src), str(tmp_path / "out"), "--compression", "gzip", "--compression-level", "10"])
    assert exit_.value.code == 2
    assert "argument --compression-level: expected 0 (fastest) to 9 (smallest), or -1 for zlib's default; got '10'" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(src), str(tmp_path / "out"), "--min-rows-per-file", "0"])
    assert exit_.value.code == 2
    assert "argument --min-rows-per-file: expected a positive integer; got '0'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_clean_removes_what_a_killed_first_write_left(tmp_path, capsys):
    """A first write killed before its commit leaves its staging and the empty version 1 its start committed;
    clean removes both, so the directory is as before the write."""
    out = tmp_path / "new"
    killed = Commit(pafs.LocalFileSystem(), str(out), "error")
    assert not killed.apply_mode()
    killed.start()
    _write(out / "_temporary" / killed.write_id / "part-0.tfrecord", 3)
    assert sorted(os.listdir(out)) == ["_temporary", "_tfrecord_log.00000000000000000001.json"]
    assert main(["clean", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith("1 left by killed or failed writes")
    assert os.listdir(out) == []


def test_clean_refuses_a_missing_path_and_a_file(tmp_path, capsys):
    # orphans() of a path that is not there finds nothing, which "0 left" would report as a clean dataset.
    assert main(["clean", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ray-tfrecord clean: {tmp_path / 'missing'} does not exist, so there is nothing to clean; check the path")
    file = tmp_path / "ds" / "part-0.tfrecord"
    _write(file, 3)
    assert main(["clean", str(file)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ray-tfrecord clean: {file} is a file; pass the dataset directory that holds it")
    assert main(["clean", str(tmp_path / "ds")]) == 0
    assert capsys.readouterr().out.strip() == "0 left by killed or failed writes"


@pytest.mark.parametrize(("num_cpus", "expected"), [
    (1, {"address": "local", "num_cpus": 1}),  # a new local Ray of that size, even beside a `ray start` one
    (None, {"address": None, "num_cpus": None}),  # RAY_ADDRESS or a cluster started on this machine, as Ray's commands do
])
def test_num_cpus_starts_a_local_ray_of_its_own(monkeypatch, num_cpus, expected):
    """Beside a cluster that `ray start --head` left on the machine, ``ray.init(num_cpus=1)`` would join
    it and refuse: "When connecting to an existing cluster, num_cpus and num_gpus must not be provided"."""
    import ray

    from ray_tfrecord._src import cli

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    cli._ensure_ray(num_cpus)
    assert [{k: v for k, v in call.items() if k in ("address", "num_cpus")} for call in calls] == [expected]


def test_convert_num_files(ray_local, tmp_path, capsys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(300))}), src)
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--num-files", "3", "--file-prefix", "train"]) == 0
    assert "wrote 300 records in 3 files" in capsys.readouterr().out
    names = sorted(p for p in os.listdir(dst) if not p.startswith("_"))
    assert names == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert [sum(1 for _ in tf.data.TFRecordDataset(str(dst / n))) for n in names] == [100] * 3
    assert main(["convert", str(src), str(tmp_path / "o2"), "--num-files", "3", "--max-rows-per-file", "10"]) == 2
    # The library's message, its keywords named as the command's flags; it is the last line, after whatever
    # progress bars the source's read printed (Ray 2.50 draws one while it samples a Parquet file).
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ray-tfrecord convert: --num-files 3 writes exactly 3 files of balanced rows, which --max-rows-per-file "
        "would cut, bundle or name otherwise; leave it out, or leave --num-files out")


def test_convert_to_an_existing_dataset_names_the_mode_flag_and_its_values(ray_local, tmp_path, capsys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), src)
    assert main(["convert", str(src), str(tmp_path / "out")]) == 0
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ray-tfrecord convert: Path {tmp_path / 'out'} already exists. Use --mode overwrite, append or ignore "
        "to write there anyway.")
    assert main(["convert", str(src), str(tmp_path / "out"), "--mode", "append"]) == 0  # what it says works
    assert sorted(r["id"] for r in read_tfrecords(str(tmp_path / "out")).take_all()) == [1, 1, 2, 2]
