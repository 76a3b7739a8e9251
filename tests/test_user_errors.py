"""A new user's first hour (issue 9): short errors from tasks, non-TFRecord files named, the
explicit schema checked on the driver, damaged GZIP files under ``on_corrupt="skip"``, and the CLI.

Each test follows the user's own steps; TensorFlow is the judge of what a file holds.
"""

import argparse
import gzip
import os
import subprocess
import sys
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import tensorflow as tf
from ray.exceptions import RayTaskError

import ray_tfrecord
from ray_tfrecord._src.cli import _in_cli_terms, _parser, main
from ray_tfrecord._src.core.errors import CorruptRecordError, DecodeError, NotTFRecordError, TFRecordError
from ray_tfrecord._src.core.framing import frame_records
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.read.datasource import TFRecordDatasource

pytestmark = pytest.mark.timeout(300)

# A few lines: Ray's task header, two frames, the library's one-line message.
MAX_LINES = 8
INT_SCHEMA = pa.schema([("a", pa.int64())])


def example(**features) -> bytes:
    ex = tf.train.Example()
    for name, value in features.items():
        if isinstance(value, int):
            ex.features.feature[name].int64_list.value.append(value)
        else:
            ex.features.feature[name].bytes_list.value.append(value)
    return ex.SerializeToString()


def tf_good_records(path: str, compression: str = "") -> int:
    """How many records TensorFlow reads before it reports damage: counted in batches (one eager step per
    record takes 18 s over ``big``), then record by record from the start of the batch that failed."""
    records = tf.data.TFRecordDataset(path, compression_type=compression)
    n = 0
    try:
        for batch in records.batch(4096):
            n += int(batch.shape[0])
        return n
    except tf.errors.DataLossError:
        pass
    try:
        for _ in records.skip(n):
            n += 1
    except tf.errors.DataLossError:
        pass
    return n


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """200,000 records (about 3 MiB): the driver's first-chunk check reads only the first MiB,
    so damage at the end is found by a read task."""
    return [example(a=i) for i in range(200_000)]


def assert_short(error: BaseException, message: str) -> None:
    text = str(error)
    assert text.endswith(message), text
    # Ray hides its Ray Data frames around an error it counts as the user's from 2.60 on; before, the task's
    # traceback stays in front of the message (write_tfrecords and the CLI still give the error alone).
    if compat.RAY_VERSION >= (2, 60):
        assert text.count("\n") < MAX_LINES and len(text) < 800, text
    assert "retried_io_errors" not in text  # Ray's retry advice is not ours to give


def test_corrupt_record_found_in_a_task_is_a_short_library_error(ray_local, tmp_path, big):
    data = bytearray(frame_records(big))
    data[len(data) - 5] ^= 0xFF  # the last payload byte of the last record
    path = str(tmp_path / "c.tfrecord")
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError) as e:
        ray_tfrecord.read_tfrecords(path, schema=INT_SCHEMA).take_all()
    assert isinstance(e.value, RayTaskError)  # it came from a task
    offset = len(data) - 16 - len(big[-1])
    assert (e.value.path, e.value.offset, e.value.column) == (path, offset, None)
    assert_short(e.value, f"CorruptRecordError: {path}, offset {offset}: corrupted record: data CRC mismatch "
                          f"over {len(big[-1])} bytes")
    assert tf_good_records(path) == len(big) - 1


def test_schema_contradiction_found_in_a_task_is_a_short_library_error(ray_local, tmp_path, big):
    path = str(tmp_path / "k.tfrecord")
    records = big + [example(a=b"zz")]
    open(path, "wb").write(frame_records(records))
    with pytest.raises(DecodeError) as e:
        ray_tfrecord.read_tfrecords(path, schema=INT_SCHEMA).take_all()
    offset = sum(16 + len(r) for r in big)
    assert (e.value.path, e.value.offset, e.value.column) == (path, offset, "a")
    assert_short(e.value, f"DecodeError: {path}, offset {offset}, column 'a': feature is bytes_list but the "
                          "schema says int64_list (int64)")


def test_explicit_schema_contradicting_the_first_records_fails_in_read_tfrecords(ray_local, tmp_path):
    path = str(tmp_path / "ints.tfrecord")
    open(path, "wb").write(frame_records([example(a=i) for i in range(10)]))
    with pytest.raises(DecodeError) as e:
        ray_tfrecord.read_tfrecords(path, schema=pa.schema([("a", pa.string())]))  # no task runs
    assert not isinstance(e.value, RayTaskError)
    assert str(e.value) == (f"{path}, offset 0, column 'a': feature is int64_list but the schema says "
                            "bytes_list (string)")


def test_schema_field_in_no_sampled_record_is_warned_about(ray_local, tmp_path):
    path = str(tmp_path / "labels.tfrecord")
    open(path, "wb").write(frame_records([example(label=i) for i in range(10)]))
    schema = pa.schema([("label", pa.int64()), ("lable", pa.int64())])
    with pytest.warns(UserWarning) as caught:
        ds = ray_tfrecord.read_tfrecords(path, schema=schema)
    (warning,) = [w for w in caught if "lable" in str(w.message)]
    assert str(warning.message) == (f"schema fields ['lable'] are in none of the first 10 records of {path} and "
                                    "will read as nulls; check their spelling (features there: ['label'])")
    assert warning.filename == __file__  # points at the user's call
    assert ds.take_all()[0] == {"label": 0, "lable": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a correct schema warns about nothing
        ray_tfrecord.read_tfrecords(path, schema=schema.remove(1))


def test_write_tfrecords_raises_the_library_error_not_rays(ray_local, tmp_path):
    with pytest.raises(TFRecordError) as e:
        ray_tfrecord.write_tfrecords(ray.data.from_items([{"x": 0.1}]), str(tmp_path / "w"))
    assert not isinstance(e.value, RayTaskError)
    assert e.value.column == "x"
    assert "allow_float64_narrowing=True" in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


@pytest.fixture
def not_tfrecord(tmp_path):
    parquet, csv = tmp_path / "x.parquet", tmp_path / "x.csv"
    pq.write_table(pa.table({"a": list(range(100)), "b": [0.5] * 100}), parquet)
    csv.write_text("a,b\n" + "".join(f"{i},0.5\n" for i in range(100)))
    return [str(parquet), str(csv)]


def test_a_parquet_or_csv_file_is_named_as_not_tfrecord(ray_local, not_tfrecord):
    for path in not_tfrecord:
        with pytest.raises(tf.errors.DataLossError):  # TensorFlow agrees it is no TFRecord file
            next(iter(tf.data.TFRecordDataset(path)))
        with pytest.raises(NotTFRecordError) as e:
            ray_tfrecord.read_tfrecords(path)
        assert (e.value.path, e.value.offset) == (path, 0)
        assert str(e.value) == (f"{path}, offset 0: corrupted record: length CRC mismatch; the file does not look "
                                "like TFRecord at all: if it is not data, leave it out of the read (read_tfrecords(..., "
                                "file_extensions=[...]) or a glob matching only the data files); if it is Parquet, CSV "
                                "or JSON, read it with ray.data.read_parquet/read_csv/read_json or `ray-tfrecord "
                                "convert` it")


def test_a_corrupt_first_record_later_in_a_real_file_stays_a_crc_error(tmp_path):
    records = [example(a=i) for i in range(5)]
    data = bytearray(frame_records(records))
    data[16 + len(records[0]) + 3] ^= 0xFF  # the second record's length
    path = str(tmp_path / "second.tfrecord")
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError) as e:
        TFRecordDatasource(path)
    assert not isinstance(e.value, NotTFRecordError)
    assert str(e.value) == f"{path}, offset {16 + len(records[0])}: corrupted record: length CRC mismatch"


@pytest.fixture
def truncated_gzip(tmp_path):
    records = [example(a=i, img=bytes(range(256)) * 4) for i in range(500)]
    z = gzip.compress(frame_records(records))
    path = str(tmp_path / "trunc.tfrecord.gz")
    open(path, "wb").write(z[: len(z) * 2 // 3])
    good = tf_good_records(path, "GZIP")
    assert 0 < good < len(records)
    return path, records, good


def test_skip_keeps_every_record_before_gzip_damage(ray_local, truncated_gzip):
    path, records, good = truncated_gzip
    source = TFRecordDatasource(path, on_corrupt="skip")
    rows = ray.data.read_datasource(source).take_all()
    assert [r["a"] for r in rows] == list(range(good))
    report = source.corruption_report()
    assert report.count == 1
    ((where, offset, reason),) = report.samples
    lost_at = sum(16 + len(r) for r in records[:good])
    assert (where, offset) == (path, lost_at)
    assert reason.startswith("truncated GZIP stream (compressed byte ")
    assert reason.endswith(f"the records from decompressed offset {lost_at} to the end are lost")
    with pytest.raises(CorruptRecordError, match="truncated GZIP stream"):  # raise mode still raises
        ray_tfrecord.read_tfrecords(path).take_all()


def test_verify_counts_the_good_records_of_a_damaged_gzip_file(ray_local, truncated_gzip, capsys):
    path, _, good = truncated_gzip
    assert main(["verify", path]) == 1
    out = capsys.readouterr().out
    assert f"verified 1 files, {good} good records, 1 corrupt" in out
    assert f"CORRUPT {path} offset " in out


def _last_line(err: str) -> str:
    return [line for line in err.splitlines() if line.strip()][-1]


def test_cli_errors_are_one_line(ray_local, tmp_path, not_tfrecord, capsys):
    assert main(["inspect", not_tfrecord[0]]) == 1
    err = capsys.readouterr().err
    assert err == f"ray-tfrecord inspect: {not_tfrecord[0]}, offset 0: corrupted record: length CRC mismatch; " \
                  "the file does not look like TFRecord at all: if it is not data, leave it out of the read " \
                  "(read_tfrecords(..., file_extensions=[...]) or a glob matching only the data files); if it is " \
                  "Parquet, CSV or JSON, read it with ray.data.read_parquet/read_csv/read_json or " \
                  "`ray-tfrecord convert` it\n"
    csv = tmp_path / "dec.csv"
    csv.write_text("x\n0.1\n")
    assert main(["convert", str(csv), str(tmp_path / "out")]) == 2
    line = _last_line(capsys.readouterr().err)
    assert line.startswith("ray-tfrecord convert: column 'x': ") and len(line) < 300, line
    assert "--allow-float64-narrowing" in line and "allow_float64_narrowing=True" not in line
    assert line.count("--allow-float64-narrowing") == 1, line


def test_cli_names_its_flag_for_a_library_keyword():
    flags = _parser().parse_args(["convert", "in.csv", "out"]).flags
    assert flags == {"allow_float64_narrowing": "--allow-float64-narrowing",
                     "allow_decimal_narrowing": "--allow-decimal-narrowing", "mode": "--mode",
                     "compression_level": "--compression-level", "min_rows_per_file": "--min-rows-per-file",
                     "max_rows_per_file": "--max-rows-per-file", "num_files": "--num-files",
                     "file_prefix": "--file-prefix"}
    # A keyword with a value, and a bare one (only names with an underscore: "mode" is also a word).
    assert _in_cli_terms("file_prefix='train': the mode, mode='overwrite'; leave file_prefix out", flags) == (
        "--file-prefix train: the mode, --mode overwrite; leave --file-prefix out")
    message = "column 'x': float64 value 0.1 is not exactly representable as float32; pass {} to round it"
    assert _in_cli_terms(message.format("allow_float64_narrowing=True"), flags) == message.format(
        "--allow-float64-narrowing")
    assert _parser().parse_args(["verify", "p"]).flags == {}  # no flag to name: the keyword stays
    assert _in_cli_terms("pass allow_float64_narrowing=True", {}) == "pass allow_float64_narrowing=True"


def test_inspect_reports_a_corrupt_record_and_exits_1(ray_local, tmp_path, capsys):
    records = [example(a=i) for i in range(500)]
    data = bytearray(frame_records(records))
    data[len(data) // 2] ^= 0xFF  # a data byte: the length still reads, the data CRC fails
    path = str(tmp_path / "bad.tfrecord")
    open(path, "wb").write(bytes(data))
    assert tf_good_records(path) < len(records)
    assert main(["inspect", path]) == 1
    captured = capsys.readouterr()
    assert "records: 500" not in captured.out
    line = _last_line(captured.err)
    assert line.startswith(f"ray-tfrecord inspect: {path}, offset ") and "CRC mismatch" in line


def test_inspect_shortens_long_values(ray_local, tmp_path, capsys):
    path = str(tmp_path / "img.tfrecord")
    open(path, "wb").write(frame_records([example(img=bytes(range(256)) * 40, name=b"x" * 100)]))
    assert main(["inspect", path, "--rows", "1"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("  {")]
    assert '"img": "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f... (10240 bytes)"' in row
    assert f'"name": "{"x" * 32}... (100 bytes)"' in row
    assert len(row) < 200


def test_cli_help_covers_every_argument_without_markup():
    parser = _parser()
    assert "``" not in parser.description and "::" not in parser.description
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help, f"{name} {action.dest} has no help"
    # Global options work on either side of the subcommand.
    assert parser.parse_args(["--num-cpus", "1", "verify", "p"]).num_cpus == 1
    assert parser.parse_args(["verify", "p", "--num-cpus", "1"]).num_cpus == 1


@pytest.mark.slow
def test_cli_shows_progress_and_no_tensorflow_banners(tmp_path):
    path = str(tmp_path / "one.tfrecord")
    open(path, "wb").write(frame_records([example(a=1)]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    result = subprocess.run([sys.executable, "-m", "ray_tfrecord._src.cli", "inspect", path, "--num-cpus", "1"],
                            capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    assert "records: 1" in result.stdout
    # Ray Data's progress: logged as lines when not on a terminal (Ray 2.60), a tqdm bar on Ray 2.50.
    assert "Running Dataset" in result.stderr or "row/s]" in result.stderr
    for banner in ("oneDNN", "cuda", "absl::InitializeLog", "cpu_feature_guard"):
        assert banner not in result.stderr
