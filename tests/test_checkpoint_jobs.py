"""Ray's job checkpointing through ``write_tfrecords``: killed jobs, run again, write every row once.

Each job is a read -> map -> write driver in its own process session with
``DataContext.checkpoint_config`` set. A fault stops one process at an exact point (a write task
midway through its blocks; a write task whose files are in place, before Ray commits its ids; the
driver inside its final commit) and signals it with a marker file; the test then SIGKILLs the
driver's whole process group, as an operator's ``kill -9`` or a lost head node would, and runs
the job again. Every case ends with every id exactly once, each with its own payload, the recorded
schema, ``_SUCCESS`` and index sidecars as an uninterrupted run leaves them, and no ``_temporary``.
While killed, our readers see exactly the dataset's last committed version: the job's files in place are
listed by no version of the log until the job's commit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import ray
import ray.cloudpickle
from ray.data.context import DataContext

from ray_tfrecord import read_tfrecords, write_tfrecords
from ray_tfrecord._src.core.index import index_path
from ray_tfrecord._src.core.layout import STAGING_DIR, SUCCESS_MARKER
from ray_tfrecord._src.core.manifest import read_manifest
from ray_tfrecord._src.core.schema import read_stored_schema, stored_schema
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.write.commit import Commit
from ray_tfrecord._src.data.write.datasink import TFRecordDatasink
from tests.test_faults import assert_rows_exactly_once, id_table, reap_session, visible_files

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not compat.CHECKPOINTS,
                       reason=f"Ray {ray.__version__} has no job checkpointing (DataContext.checkpoint_config)"),
]
# Workers cannot import this module (tests/ is not installed); ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parent.parent
ROWS = 4000
SRC_FILES = 8
# Small blocks: a read task yields several, so a fault lands in the middle of a write task.
BLOCK_BYTES = 8 << 10


def write_source(directory: Path) -> list[int]:
    ids = np.arange(ROWS, dtype=np.int64)
    ray_free_write = ray.data.from_arrow(id_table(ids)).repartition(SRC_FILES)
    write_tfrecords(ray_free_write, str(directory), max_rows_per_file=ROWS // SRC_FILES)
    return ids.tolist()


def add_columns(batch: pa.Table) -> pa.Table:
    """The job's model: a score and a bucket (the partition column) per row."""
    ids = batch["id"].to_numpy()
    return (batch.append_column("score", pa.array((ids * 0.5).astype(np.float32)))
            .append_column("bucket", pa.array(ids % 3)))


# -- faults --------------------------------------------------------------------------------


def _halt(marker: str, note: object, nth: int = 1) -> None:
    """Stop the ``nth`` process to get here (the others go on): tell the test, and wait to be killed."""
    n = 1
    while True:
        try:
            os.close(os.open(f"{marker}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            n += 1
    if n != nth:
        return
    Path(marker + ".tmp").write_text(json.dumps(note))
    os.rename(marker + ".tmp", marker)
    time.sleep(600)


class _HaltingCommit(Commit):
    """The driver's final commit, stopped once it has read every task's record of its files, before it commits
    them as the dataset's next version."""

    marker = ""

    def _task_files(self):
        files = super()._task_files()
        _halt(self.marker, {"point": "final commit", "pid": os.getpid()})
        return files


class FaultSink(TFRecordDatasink):
    """``fault``: ``"write"`` stops the third write task to stage a block after its first; ``"published"``
    stops the third write task whose files are in place, before Ray commits its ids (the tasks before
    it commit theirs); ``"final"`` stops the driver in its final commit."""

    def __init__(self, path, *, fault: str, marker: str, **kwargs):
        super().__init__(path, **kwargs)
        self._fault, self._marker = fault, marker
        if fault == "final":
            self.commit.__class__ = _HaltingCommit
            _HaltingCommit.marker = marker

    def write(self, blocks, ctx):
        if self._fault == "write":
            blocks = self._halt_midway(blocks, ctx.task_idx)
        result = super().write(blocks, ctx)
        if self._fault == "published" and result["files"]:
            _halt(self._marker, {"point": "published", "task": ctx.task_idx,
                                 "files": [os.path.join(self.path, f.rel_path) for f in result["files"]]}, nth=3)
        return result

    def _halt_midway(self, blocks, task_idx):
        for i, block in enumerate(blocks):
            if i == 1:
                _halt(self._marker, {"point": "write", "task": task_idx}, nth=3)
            yield block


# -- the job -------------------------------------------------------------------------------


def start_ray(num_cpus: int) -> None:
    """A local Ray of its own; a start that times out on a loaded machine is tried again."""
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     object_store_memory=200 << 20)
            return
        except Exception as e:  # Ray raises a bare Exception for a node that did not start in time
            if "timed out during startup" not in str(e) or attempt == 2:
                raise
            ray.shutdown()


def start_job_ray(checkpoint: str, num_cpus: int) -> None:
    """:func:`start_ray` for a job's ``num_cpus`` tasks: on a rerun, Ray's CheckpointFilter actor holds
    one CPU more (Ray reserves a whole CPU for it, so a rerun on a 1-CPU cluster would wait forever)."""
    start_ray(num_cpus=num_cpus + (1 if os.path.isdir(checkpoint) and os.listdir(checkpoint) else 0))


def job(src: str, out: str, checkpoint: str, options: dict) -> None:
    """A user's batch job: read ``src``, score, write ``out`` under a checkpoint."""
    from ray.data.checkpoint import CheckpointConfig

    start_job_ray(checkpoint, options.pop("num_cpus"))
    ctx = DataContext.get_current()
    ctx.target_max_block_size = BLOCK_BYTES
    ctx.checkpoint_config = CheckpointConfig(id_column="id", checkpoint_path=checkpoint)
    fault, marker = options.pop("fault", None), options.pop("marker", None)
    options.setdefault("min_rows_per_file", ROWS // SRC_FILES)  # about 8 write tasks, each of several blocks
    ds = read_tfrecords(src, override_num_blocks=SRC_FILES).map_batches(add_columns, batch_format="pyarrow")
    if fault:
        sink = FaultSink(out, fault=fault, marker=marker, **options)
        ds.write_datasink(sink)
        result = sink.result
    else:
        result = write_tfrecords(ds, out, **options)
    print("RESULT " + json.dumps({"rows": result.num_rows, "files": len(result.files), "skipped": result.skipped}))
    ray.shutdown()


def run_job(tmp_path: Path, options: dict, *, fault: str | None = None, timeout: float = 240) -> dict | None:
    """Run :func:`job` as its own driver; with ``fault``, SIGKILL its process group once a process has
    stopped at the fault (returns ``None``), else return its result."""
    marker = tmp_path / f"halted-{time.monotonic_ns()}"
    if fault:
        options = {**options, "fault": fault, "marker": str(marker)}
    args = [str(tmp_path / "src"), str(tmp_path / "out"), str(tmp_path / "checkpoint"), options]
    return run_driver("tests.test_checkpoint_jobs", "job", args, kill_when=marker.exists if fault else None,
                      what=repr(fault), timeout=timeout)


def run_driver(module: str, function: str, args: list, *, kill_when: Callable[[], bool] | None = None,
               what: str = "", timeout: float = 240) -> dict | None:
    """Run ``module.function(*args)`` as its own driver, in its own process session and local Ray. With
    ``kill_when``, SIGKILL the driver's process group once it holds (returns ``None``; ``what`` names the
    point in the failure message); else return the JSON the driver printed after ``RESULT ``."""
    code = f"import json, sys; from {module} import {function}; {function}(*json.loads(sys.argv[1]))"
    env = {**os.environ, "RAY_ADDRESS": "local"}
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], cwd=REPO, start_new_session=True,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if kill_when is not None:
            deadline = time.monotonic() + timeout
            while not kill_when():
                assert proc.poll() is None, f"the job ended before reaching {what}:\n{proc.stdout.read()[-3000:]}"
                assert time.monotonic() < deadline, f"the job did not reach {what} in {timeout}s"
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            assert proc.returncode == -signal.SIGKILL
            return None
        output, _ = proc.communicate(timeout=timeout)
    finally:
        reap_session(proc.pid)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    return json.loads(output.split("RESULT ", 1)[1].splitlines()[0])


# -- checks --------------------------------------------------------------------------------


def check_readers_see_the_committed_version(out: Path, committed: list[int]) -> list[dict]:
    """What our readers find in a killed job's output: exactly the ids of the dataset's latest committed version,
    each once (none of the killed job's)."""
    latest = read_manifest(ray_fs(), str(out))
    rows = read_tfrecords(str(out)).take_all() if latest is not None and latest.entries else []
    assert sorted(r["id"] for r in rows) == sorted(committed)
    return rows


def check_complete(out: Path, ids: list[int], *, compressed: bool = False, partitioned: bool = False) -> list[dict]:
    """The end state of an uninterrupted run: every id once, the schema recorded, ``_SUCCESS``,
    a sidecar for each uncompressed file and none for a file that is gone, no staging."""
    rows = read_tfrecords(str(out)).take_all()
    assert_rows_exactly_once(rows, ids)
    for r in rows:
        assert r["score"] == np.float32(r["id"] * 0.5)
        if "bucket" in r and partitioned:
            assert r["bucket"] == r["id"] % 3
    assert (out / SUCCESS_MARKER).is_file()
    assert not (out / STAGING_DIR).exists()
    columns = [pa.field("id", pa.int64()), pa.field("payload", pa.binary()), pa.field("score", pa.float32())]
    if not partitioned:
        columns.append(pa.field("bucket", pa.int64()))
    assert read_stored_schema(ray_fs(), str(out)) == stored_schema(columns, "Example")
    data = visible_files(out)
    sidecars = sorted(str(p) for p in out.glob("_index.*"))
    assert sidecars == ([] if compressed else sorted(index_path(p, str(out)) for p in data))
    for d, dirs, files in os.walk(out):
        assert files or dirs, f"empty directory {d}"
    return rows


def ray_fs():
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


def report(name: str, ids: list[int], rows: list[dict], killed: list[dict], rerun: dict | None) -> None:
    """One line for the record: the ids expected and found, what a reader saw while the job was dead,
    and how many rows the last run wrote."""
    found = [r["id"] for r in rows]
    print(f"\nFAULT {name}: ids expected {len(ids)}, found {len(found)}, distinct {len(set(found))}, "
          f"missing {len(set(ids) - set(found))}, extra {len(set(found) - set(ids))}; visible while killed "
          f"{len(killed)}; last run wrote {rerun and rerun['rows']}")


# -- the faults ----------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_between_files_and_checkpoint_record(ray_local, tmp_path):
    """``overwrite`` over an older dataset, files cut by ``max_rows_per_file`` and gathered by
    ``min_rows_per_file``; killed with a task's files in place and its ids still pending. The rerun
    removes those files (Ray's recovery), writes their rows again and keeps the first run's other files."""
    ids = write_source(tmp_path / "src")
    out = tmp_path / "out"
    write_tfrecords(ray.data.from_arrow(id_table(np.arange(-20, 0))), str(out))
    old_files = visible_files(out)
    options = {"mode": "overwrite", "max_rows_per_file": 300, "min_rows_per_file": 200}
    run_job(tmp_path, {**options, "num_cpus": 2}, fault="published")
    killed = check_readers_see_the_committed_version(out, list(range(-20, 0)))  # the old dataset, whole
    assert set(visible_files(out)) > set(old_files)  # the killed run's files are in place, unlisted
    rerun = run_job(tmp_path, {**options, "num_cpus": 2})
    report("between a task's files and Ray's checkpoint record (overwrite; rerun 2 CPUs)", ids,
           check_complete(out, ids), killed, rerun)


@pytest.mark.slow
def test_killed_in_the_final_commit(ray_local, tmp_path):
    """``append`` to a dataset with a recorded schema; killed in the driver's final commit, after Ray
    deleted its checkpoint (the job had succeeded): the rerun writes no row again and completes the commit."""
    ids = write_source(tmp_path / "src")
    out = tmp_path / "out"
    old = id_table(np.arange(-20, 0))
    old = add_columns(old)
    write_tfrecords(ray.data.from_arrow(old), str(out))
    old_files = visible_files(out)
    run_job(tmp_path, {"mode": "append", "num_cpus": 2}, fault="final")
    assert not (tmp_path / "checkpoint").exists()  # Ray deleted it on success, before our commit ran
    killed = check_readers_see_the_committed_version(out, list(range(-20, 0)))  # the commit had not happened
    assert set(visible_files(out)) > set(old_files)  # every task's files were in place when it died
    rerun = run_job(tmp_path, {"mode": "append", "num_cpus": 1})
    assert rerun == {"rows": 0, "files": 0, "skipped": False}
    report("in the driver's final commit (append; rerun 1 CPU)", ids + list(range(-20, 0)),
           check_complete(out, list(range(-20, 0)) + ids), killed, rerun)


@pytest.mark.slow
def test_killed_twice_in_a_row(ray_local, tmp_path):
    """Default ``mode="error"`` into a new directory, partitioned and gzip-compressed: killed with files in
    place, killed again while a write task of the rerun (on 1 CPU) is staging, then run to completion."""
    ids = write_source(tmp_path / "src")
    options = {"partition_cols": ["bucket"], "compression": "gzip"}
    run_job(tmp_path, {**options, "num_cpus": 2}, fault="published")
    run_job(tmp_path, {**options, "num_cpus": 1}, fault="write")
    killed = check_readers_see_the_committed_version(tmp_path / "out", [])  # version 1 only: empty
    rerun = run_job(tmp_path, {**options, "num_cpus": 2})
    report("twice in a row (partitioned, gzip; published, then write; reruns 1 and 2 CPUs)", ids,
           check_complete(tmp_path / "out", ids, compressed=True, partitioned=True), killed, rerun)
