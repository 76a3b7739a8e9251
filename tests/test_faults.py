"""Faults under Ray: killed read and write workers, a killed driver, an object store much
smaller than the dataset, and concurrent appenders to one destination.

Faults are injected at exact points (no sleeps, no timing guesses): read and write tasks are
wrapped so that, the first time only (a marker file records it), they SIGKILL their own worker
or the driver after a known number of blocks. Ray retries a task whose worker died, so the
second attempt finds the marker and runs through. Tests that need their own cluster
configuration (a killed driver, a small object store) run it in a subprocess with its own
``ray.init``; the rest share the session's ``ray_local``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest
import ray
import ray.cloudpickle
from ray.data.context import DataContext
from ray.data.datasource import ReadTask

from ray_tfrecord import encode, read_tfrecords, write_tfrecords
from ray_tfrecord._src.cli import main as cli
from ray_tfrecord._src.core.framing import RecordWriter
from ray_tfrecord._src.core.index import index_path
from ray_tfrecord._src.core.manifest import read_manifest, version_path
from ray_tfrecord._src.data.read.datasource import TFRecordDatasource
from ray_tfrecord._src.data.write.datasink import TFRecordDatasink

pytestmark = pytest.mark.timeout(300)
# Workers cannot import this module (tests/ is not installed); ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parent.parent
N_FILES = 24
ROWS_PER_FILE = 500
# Small blocks, so that one read task yields many blocks and one write task consumes many:
# the faults below land in the middle of a task, after it has produced (or staged) data.
SMALL_BLOCK_BYTES = 32 << 10


# -- data and checks ---------------------------------------------------------------------


def id_table(ids: np.ndarray) -> pa.Table:
    # The payload is a function of the id, so a checksum over (id, payload) catches a
    # row that came back with another row's bytes, not only lost or repeated ids.
    return pa.table({"id": ids, "payload": [int(i).to_bytes(8, "little", signed=True) * 8 for i in ids]})


def write_id_files(directory: Path, first_id: int = 0) -> List[int]:
    """``N_FILES`` TFRecord files of ``ROWS_PER_FILE`` rows each, written with the codec
    (no Ray); returns the ids."""
    directory.mkdir(parents=True)
    ids = np.arange(first_id, first_id + N_FILES * ROWS_PER_FILE, dtype=np.int64)
    for k in range(N_FILES):
        with RecordWriter(open(directory / f"part-{k:03d}.tfrecord", "wb")) as w:
            w.write(encode(id_table(ids[k * ROWS_PER_FILE : (k + 1) * ROWS_PER_FILE])).data)
    return ids.tolist()


def checksum(rows: Iterable[Dict]) -> int:
    return sum(zlib.crc32(int(r["id"]).to_bytes(8, "little", signed=True) + r["payload"]) for r in rows)


def expected_checksum(ids: List[int]) -> int:
    return checksum(id_table(np.asarray(ids, dtype=np.int64)).to_pylist())


def assert_rows_exactly_once(rows: List[Dict], ids: List[int]) -> None:
    assert len(rows) == len(ids)
    assert sorted(r["id"] for r in rows) == sorted(ids)  # none lost, none repeated
    assert checksum(rows) == expected_checksum(ids)  # and each with its own payload


def log_entries(root) -> list[str]:
    """The names of the log's versions 1 to the latest: none has expired (younger than ``log.LOG_KEEP_S``)."""
    latest = read_manifest(pafs.LocalFileSystem(), str(root))
    assert latest is not None and latest.commit is not None
    return [os.path.basename(version_path(str(root), v)) for v in range(1, latest.version + 1)]


def visible_files(root: Path) -> List[str]:
    """Data files a Hadoop-convention reader sees (no '.'/'_' names at any depth)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(("_", "."))]
        out += [os.path.join(d, f) for f in files if not f.startswith(("_", "."))]
    return sorted(out)


def files_under(root: str) -> List[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


def read_back(path: Path) -> List[Dict]:
    return read_tfrecords(str(path)).take_all()


class small_blocks:
    """Sets ``DataContext.target_max_block_size`` for the block and restores it (the
    session's DataContext is shared by every test)."""

    def __enter__(self):
        ctx = DataContext.get_current()
        self._saved = ctx.target_max_block_size
        ctx.target_max_block_size = SMALL_BLOCK_BYTES

    def __exit__(self, *exc):
        DataContext.get_current().target_max_block_size = self._saved


# -- fault injection -------------------------------------------------------------------


def _kill_once(marker: str, note: object, pid: Optional[int] = None) -> None:
    """SIGKILL ``pid`` (default: this process) unless ``marker`` exists; the marker,
    written first, records ``note`` and makes the retried task run through."""
    if os.path.exists(marker):
        return
    Path(marker).write_text(json.dumps(note))
    os.kill(pid or os.getpid(), signal.SIGKILL)


class KillingReadSource(TFRecordDatasource):
    """Each read task logs the blocks it yields and, on its first attempt, kills its own
    worker right before yielding block ``kill_at``."""

    def __init__(self, paths, *, marker: str, log: str, kill_at: int, **kwargs):
        super().__init__(paths, **kwargs)
        self._marker, self._log, self._kill_at = marker, log, kill_at

    def get_read_tasks(self, parallelism, **kwargs) -> List[ReadTask]:
        return [
            ReadTask(self._wrap(t.read_fn), t.metadata, schema=t.schema, per_task_row_limit=t.per_task_row_limit)
            for t in super().get_read_tasks(parallelism, **kwargs)
        ]

    def _wrap(self, read_fn):
        marker, log, kill_at = self._marker, self._log, self._kill_at

        def read_then_die() -> Iterator[pa.Table]:
            for i, block in enumerate(read_fn()):
                if i == kill_at:
                    _kill_once(marker, {"pid": os.getpid()})
                with open(log, "a") as f:
                    f.write(f"{os.getpid()} {block.num_rows}\n")
                yield block

        return read_then_die


class KillingSink(TFRecordDatasink):
    """A write task that, on its first attempt, kills ``victim_pid`` (default: its own
    worker) after writing ``kill_after`` blocks into staging; the marker lists the files
    staged at that moment."""

    def __init__(self, path, *, marker: str, kill_after: int, victim_pid: Optional[int] = None, **kwargs):
        super().__init__(path, **kwargs)
        self._marker, self._kill_after, self._victim = marker, kill_after, victim_pid

    def write(self, blocks, ctx):
        return super().write(self._kill_midway(blocks), ctx)

    def _kill_midway(self, blocks):
        for i, block in enumerate(blocks):
            if i == self._kill_after:
                _kill_once(self._marker, files_under(self.commit.staging), self._victim)
            yield block


# -- killed read worker ------------------------------------------------------------------


def test_killed_read_worker_yields_every_row_once(ray_local, tmp_path):
    ids = write_id_files(tmp_path / "src")
    marker, log = tmp_path / "killed", tmp_path / "yielded"
    with small_blocks():
        source = KillingReadSource(str(tmp_path / "src"), marker=str(marker), log=str(log), kill_at=N_FILES)
        rows = ray.data.read_datasource(source).take_all()

    # The kill happened mid-read: the killed worker had yielded blocks before it died.
    killed = json.loads(marker.read_text())["pid"]
    yielded = [line.split() for line in log.read_text().splitlines()]
    assert sum(int(n) for pid, n in yielded if int(pid) == killed) >= ROWS_PER_FILE
    assert {int(pid) for pid, _ in yielded} - {killed}  # and a retry on another worker ran
    assert_rows_exactly_once(rows, ids)


# -- killed write worker ------------------------------------------------------------------


@pytest.mark.slow
def test_killed_write_worker_is_retried_and_commits_once(ray_local, tmp_path):
    out = tmp_path / "out"
    old_ids = list(range(-10, 0))
    write_tfrecords(ray.data.from_items(id_table(np.array(old_ids)).to_pylist()), str(out))
    old_files = visible_files(out)
    ids = write_id_files(tmp_path / "src")
    marker = tmp_path / "killed"
    with small_blocks():
        sink = KillingSink(str(out), marker=str(marker), kill_after=12, mode="overwrite", max_rows_per_file=2000)
        read_tfrecords(str(tmp_path / "src")).write_datasink(sink)

    # The first attempt had staged files (some complete, one half-written) when it died...
    staged_by_killed_attempt = json.loads(marker.read_text())
    assert any("/_temporary/" in f and f.endswith(".tfrecord") for f in staged_by_killed_attempt)
    # ...none of which survives: the commit moved only what the successful attempt
    # returned and then removed the whole staging directory.
    assert not any(os.path.exists(f) for f in staged_by_killed_attempt)
    bookkeeping = ["_SUCCESS", "_tfrecord_schema.arrow", "_tfrecord_schema.pbtxt", *log_entries(out)]
    assert sorted(os.listdir(out)) == sorted(bookkeeping
                                             + [os.path.basename(p) for p in sink.result.files]
                                             + [os.path.basename(index_path(p)) for p in sink.result.files])
    assert visible_files(out) == sorted(sink.result.files)
    assert not set(old_files) & set(visible_files(out))
    assert sink.result.num_rows == len(ids)
    assert_rows_exactly_once(read_back(out), ids)


# -- killed driver ------------------------------------------------------------------------


def run_driver(function: str, *args, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``function(*args)`` of this module as its own Ray driver, in a new session so
    that every process of its cluster can be found (and reaped) afterwards."""
    code = f"import json, sys; from tests.test_faults import {function}; {function}(*json.loads(sys.argv[1]))"
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        reap_session(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _session_pids(sid: int) -> List[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def reap_session(sid: int) -> None:
    """SIGKILL, by pid, whatever is left of a finished subprocess's session (its Ray
    cluster). After a killed driver, Ray's agents are orphaned and never exit by
    themselves; workers and the raylet would follow the driver within seconds, and are
    killed here at once instead: a worker still running writes only into its own staging
    directory, which every assertion below allows for."""
    for pid in _session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def write_in_own_cluster(src: str, out: str, mode: str, marker: Optional[str]) -> None:
    """Driver for the killed-driver test: read ``src``, write ``out``. With ``marker``,
    a write task SIGKILLs this driver after staging 12 blocks."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 << 20)
    DataContext.get_current().target_max_block_size = SMALL_BLOCK_BYTES
    if marker:
        sink = KillingSink(out, marker=marker, kill_after=12, victim_pid=os.getpid(), mode=mode,
                           max_rows_per_file=2000)
    else:
        sink = TFRecordDatasink(out, mode=mode, max_rows_per_file=2000)
    read_tfrecords(src).write_datasink(sink)
    print(json.dumps({"rows": sink.result.num_rows, "files": sink.result.files, "version": sink.result.version}))
    ray.shutdown()


@pytest.mark.parametrize("mode", ["overwrite", "error"])
@pytest.mark.slow
def test_killed_driver_leaves_old_dataset_and_retry_succeeds(ray_local, tmp_path, mode):
    """``overwrite`` over an existing dataset, and ``error`` (the default) into a new
    directory; the driver dies while a write task is staging files."""
    out = tmp_path / "out"
    old_ids = list(range(-10, 0))
    if mode == "overwrite":
        write_tfrecords(ray.data.from_items(id_table(np.array(old_ids)).to_pylist()), str(out))
    old_files = visible_files(out)
    old_success = (out / "_SUCCESS").stat().st_mtime_ns if mode == "overwrite" else None
    ids = write_id_files(tmp_path / "src")
    marker = tmp_path / "killed"

    killed = run_driver("write_in_own_cluster", str(tmp_path / "src"), str(out), mode, str(marker))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    staged = json.loads(marker.read_text())
    assert any(f.endswith(".tfrecord") for f in staged)  # it died with files staged
    # Nothing of the killed write is visible: the old dataset is exactly as it was.
    assert visible_files(out) == old_files
    assert all(f.startswith(str(out / "_temporary") + "/") and os.path.exists(f) for f in staged)
    if mode == "overwrite":
        assert (out / "_SUCCESS").stat().st_mtime_ns == old_success
        assert_rows_exactly_once(read_back(out), old_ids)
    else:  # the first version start() committed, before any file landed: an empty dataset
        assert sorted(os.listdir(out)) == ["_temporary", os.path.basename(version_path(str(out), 1))]
        assert read_manifest(pafs.LocalFileSystem(), str(out)).entries == []

    retry = run_driver("write_in_own_cluster", str(tmp_path / "src"), str(out), mode, None)
    assert retry.returncode == 0, retry.stderr[-3000:]
    result = json.loads(retry.stdout.strip().splitlines()[-1])
    assert result["rows"] == len(ids)
    assert visible_files(out) == sorted(result["files"])
    assert (out / "_SUCCESS").exists()
    assert_rows_exactly_once(read_back(out), ids)
    # The killed write's staging stays behind, hidden; the retry removed only its own.
    killed_write_id = Path(staged[0]).relative_to(out / "_temporary").parts[0]
    assert os.listdir(out / "_temporary") == [killed_write_id]
    # `ray-tfrecord clean` removes it, and every version but the retry's.
    assert cli(["clean", str(out)]) == 0
    assert result["version"] == read_manifest(pafs.LocalFileSystem(), str(out)).version
    assert sorted(os.listdir(out)) == sorted(["_SUCCESS", "_tfrecord_schema.arrow", "_tfrecord_schema.pbtxt",
                                              *log_entries(out),
                                              *{os.path.relpath(f, out).split("/")[0] for f in result["files"]},
                                              *(os.path.basename(index_path(f)) for f in result["files"])])
    assert_rows_exactly_once(read_back(out), ids)


# -- object store much smaller than the data ---------------------------------------------

PIXELS = 784
STORE_BYTES = 100 << 20
# Decoded, each row holds 784 int64 pixels (6.3 KB): 240,000 rows are ~1.5 GB in Arrow,
# 15x the object store (~290 MB on disk: pixel values are 1-2 byte varints).
IMAGE_ROWS = 240_000
IMAGE_FILES = 24


def image_schema() -> pa.Schema:
    return pa.schema([("id", pa.int64()), ("label", pa.int64()), ("pixels", pa.list_(pa.int64(), PIXELS))])


def write_image_files(directory: Path) -> None:
    directory.mkdir(parents=True)
    per_file = IMAGE_ROWS // IMAGE_FILES
    rng = np.random.default_rng(0)
    for k in range(IMAGE_FILES):
        ids = np.arange(k * per_file, (k + 1) * per_file, dtype=np.int64)
        pixels = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 256, per_file * PIXELS)), PIXELS)
        table = pa.table([ids, ids % 10, pixels], schema=image_schema())
        with RecordWriter(open(directory / f"part-{k:03d}.tfrecord", "wb")) as w:
            w.write(encode(table).data)


def _peak_rss_bytes(pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def pipeline_in_small_store(src: str, out: str, pid_dir: str) -> None:
    """Driver for the small-object-store test: read -> map_batches -> write with a
    ``STORE_BYTES`` object store; prints the rows written, whether the ids read back are
    each row exactly once, and the peak RSS of the driver and of every worker that ran
    the transform (read once the write is done, so that it covers the read and write
    tasks those processes ran too)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=STORE_BYTES)
    # Blocks sized for this store, as Ray advises: at the default 128 MiB one block alone
    # would not fit in it.
    DataContext.get_current().target_max_block_size = STORE_BYTES // 8

    def invert(batch: pa.Table) -> pa.Table:
        Path(pid_dir, str(os.getpid())).touch()
        # Arrow in and out: a numpy batch would turn the pixels into a tensor column.
        pixels = batch.column("pixels").combine_chunks()
        inverted = pa.FixedSizeListArray.from_arrays(pc.subtract(255, pixels.flatten()), PIXELS)
        return batch.set_column(batch.schema.get_field_index("pixels"), "pixels", inverted)

    ds = read_tfrecords(src, schema=image_schema()).map_batches(invert, batch_format="pyarrow")
    result = write_tfrecords(ds, out)
    workers = {pid: _peak_rss_bytes(pid) for pid in os.listdir(pid_dir)}
    back = read_tfrecords(out, schema=image_schema(), columns=["id"])
    ids = np.sort(np.concatenate([b["id"] for b in back.iter_batches(batch_format="numpy")]))
    print(json.dumps({"rows": result.num_rows, "each_row_once": bool(np.array_equal(ids, np.arange(IMAGE_ROWS))),
                      "worker_peak_rss": workers, "driver_peak_rss": _peak_rss_bytes()}))
    ray.shutdown()


@pytest.mark.slow
def test_pipeline_with_object_store_much_smaller_than_the_data(tmp_path):
    write_image_files(tmp_path / "src")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    done = run_driver("pipeline_in_small_store", str(tmp_path / "src"), str(tmp_path / "out"), str(pid_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["rows"] == IMAGE_ROWS and got["each_row_once"]  # rows in == rows out
    peaks = got["worker_peak_rss"]
    assert peaks  # the transform ran, in these workers
    # Bounded: no worker, nor the driver, comes near holding the decoded dataset (a
    # worker's RSS also counts the object-store pages it mapped, up to STORE_BYTES).
    # Measured: ~470 MB per worker, the same at 2/3 of this size.
    decoded_bytes = IMAGE_ROWS * (PIXELS + 2) * 8
    assert max(peaks.values()) < decoded_bytes / 2, peaks
    assert got["driver_peak_rss"] < decoded_bytes / 2, got


# -- concurrent appenders -----------------------------------------------------------------

APPENDERS = 3


def _barrier(directory: str, name: str, parties: int, timeout_s: float = 120) -> None:
    """Wait until ``parties`` processes have arrived (one marker file each)."""
    Path(directory, name).touch()
    deadline = time.monotonic() + timeout_s
    while len(os.listdir(directory)) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {os.listdir(directory)} reached the barrier")
        time.sleep(0.01)


class CommitTogetherSink(TFRecordDatasink):
    """Holds its commit until every appender has staged its files, so that the commits
    (moves, ``_SUCCESS``, staging clean-up) of all writers run at the same time."""

    def __init__(self, path, *, barrier_dir: str, name: str, **kwargs):
        super().__init__(path, **kwargs)
        self._barrier_dir, self._name = barrier_dir, name

    def on_write_complete(self, write_result):
        _barrier(self._barrier_dir, self._name, APPENDERS)
        super().on_write_complete(write_result)


@ray.remote(num_cpus=0)  # a driver only: its write tasks take the CPUs
def append_from_own_process(out: str, ids: List[int], barrier_dir: str, name: str) -> Dict:
    ds = ray.data.from_items(id_table(np.array(ids)).to_pylist(), override_num_blocks=4)
    sink = CommitTogetherSink(out, barrier_dir=barrier_dir, name=name, mode="append", max_rows_per_file=100)
    ds.write_datasink(sink)
    return {"pid": os.getpid(), "rows": sink.result.num_rows, "files": sink.result.files}


def test_concurrent_appenders_lose_and_collide_nothing(ray_local, tmp_path):
    out = tmp_path / "out"
    first = list(range(-10, 0))
    write_tfrecords(ray.data.from_items(id_table(np.array(first)).to_pylist()), str(out))
    before = visible_files(out)
    barrier_dir = tmp_path / "barrier"
    barrier_dir.mkdir()
    batches = [list(range(k * 1000, k * 1000 + 400)) for k in range(APPENDERS)]
    results = ray.get([append_from_own_process.remote(str(out), ids, str(barrier_dir), f"w{k}")
                       for k, ids in enumerate(batches)])

    assert len({r["pid"] for r in results}) == APPENDERS  # separate driver processes
    files = [f for r in results for f in r["files"]]
    assert len(files) == len(set(files)) == APPENDERS * 4  # no name collision
    assert visible_files(out) == sorted(before + files)  # no lost file, nothing extra
    assert [r["rows"] for r in results] == [len(b) for b in batches]
    assert_rows_exactly_once(read_back(out), first + [i for b in batches for i in b])
    assert (out / "_SUCCESS").exists() and not (out / "_temporary").exists()
