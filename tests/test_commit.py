"""The commit protocol on its own (ray_tfrecord._src.data.write.commit), on a local directory and without Ray:
staging, the save modes, moves with sidecars first, overwrite's deletions, the recorded schema,
``_SUCCESS`` last, name clashes refused before anything moves, and an aborted write."""

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.index import index_path
from ray_tfrecord._src.core.layout import LOG_PREFIX, SCHEMA_FILE, STAGING_DIR, SUCCESS_MARKER, TFMD_SCHEMA_FILE
from ray_tfrecord._src.core.manifest import list_versions, read_manifest, read_version, version_path
from ray_tfrecord._src.core.schema import read_stored_schema, stored_schema
from ray_tfrecord._src.data.write.commit import Commit, StagedFile, log
from tests.filesystems import DelegatingHandler

LOCAL = pafs.LocalFileSystem()


def _stage(commit: Commit, rel_path: str, data: bytes = b"records", *, index: bool = False) -> StagedFile:
    """Stand in for a writer: one staged data file (and its sidecar)."""
    path = os.path.join(commit.staging, rel_path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    if index:
        with open(index_path(path, commit.staging), "wb") as f:
            f.write(b"sidecar")
    return StagedFile(rel_path, rows=len(data), size=len(data), has_index=index)


def _schema(**types: pa.DataType) -> pa.Schema:
    return stored_schema([pa.field(name, t) for name, t in types.items()], "Example")


def _tree(root) -> list[str]:
    """Every file under ``root`` outside the staging directories and the log, relative, sorted."""
    files = [os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names]
    # The recorded schema's TFMD text goes with it (these schemas all have one; test_feature_specs reads it).
    assert (TFMD_SCHEMA_FILE in files) == (SCHEMA_FILE in files)
    return sorted(f for f in files if not f.startswith((f"{STAGING_DIR}/", LOG_PREFIX)) and f != TFMD_SCHEMA_FILE)


def _write(path, mode: str, *names: str, schema: pa.Schema | None = None, keep_replaced: float = 0) -> Commit:
    commit = Commit(LOCAL, str(path), mode, keep_replaced=keep_replaced)
    assert not commit.apply_mode()
    commit.start()
    staged = [_stage(commit, name) for name in names]
    commit.finish(staged, [schema or _schema(x=pa.int64())])
    return commit


class _Moves(DelegatingHandler):
    """The local filesystem, recording each move and when ``_SUCCESS`` is written."""

    def __init__(self) -> None:
        super().__init__(LOCAL)
        self.calls: list[tuple[str, str]] = []

    def move(self, src, dest):
        self.calls.append(("move", dest))
        super().move(src, dest)

    def open_output_stream(self, path, metadata):
        self.calls.append(("write", path))
        return super().open_output_stream(path, metadata)


def test_a_commit_moves_sidecars_first_and_writes_success_last(tmp_path):
    out = tmp_path / "out"
    handler = _Moves()
    commit = Commit(pafs.PyFileSystem(handler), str(out), "error", underlying=LOCAL)
    assert not commit.apply_mode()
    commit.start()
    assert commit.staging.startswith(f"{out}/{STAGING_DIR}/") and os.path.isdir(commit.staging)
    staged = [_stage(commit, "part-0.tfrecord", index=True), _stage(commit, "day=1/part-1.tfrecord", b"more")]
    assert _tree(out) == []  # staged files are hidden from readers
    result = commit.finish(staged, [_schema(x=pa.int64())])

    assert result.files == [f"{out}/part-0.tfrecord", f"{out}/day=1/part-1.tfrecord"]
    assert (result.num_rows, result.bytes_written, result.num_files, result.skipped) == (11, 11, 2, False)
    sidecar = index_path(f"{out}/part-0.tfrecord", str(out))
    assert _tree(out) == sorted([os.path.basename(sidecar), SCHEMA_FILE, SUCCESS_MARKER, "day=1/part-1.tfrecord",
                                 "part-0.tfrecord"])
    moves = [dest for call, dest in handler.calls if call == "move"]
    assert moves == [sidecar, f"{out}/part-0.tfrecord", f"{out}/day=1/part-1.tfrecord"]
    assert handler.calls[-1] == ("write", f"{out}/{SUCCESS_MARKER}")
    assert read_stored_schema(LOCAL, str(out)) == _schema(x=pa.int64())
    assert not os.path.exists(out / STAGING_DIR)


def test_overwrite_replaces_every_old_file_and_its_emptied_directories(tmp_path):
    out = tmp_path / "out"
    _write(out, "error", "day=1/old.tfrecord", "day=2/old.tfrecord")
    _write(out, "overwrite", "day=2/new.tfrecord", schema=_schema(y=pa.string()))
    assert _tree(out) == [SUCCESS_MARKER, SCHEMA_FILE, "day=2/new.tfrecord"]
    assert not os.path.exists(out / "day=1")
    assert read_stored_schema(LOCAL, str(out)) == _schema(y=pa.string())


def test_replaced_files_stay_the_replacing_writes_keep_replaced_whatever_later_commits_keep(tmp_path):
    """A write's ``keep_replaced_files`` is recorded in its version: a later commit (and ``ray-tfrecord clean``)
    with the default 0 keeps what it replaced until then, and deletes it (with its version) after."""
    out = tmp_path / "out"
    _write(out, "error", "old.tfrecord")
    _write(out, "overwrite", "new.tfrecord", keep_replaced=3600)
    _write(out, "append", "more.tfrecord")  # keep_replaced 0: deletes what is due, not the overwrite's files
    assert (out / "old.tfrecord").exists()
    versions = list_versions(LOCAL, str(out))
    assert [read_version(LOCAL, str(out), v).commit.keep_replaced for v in versions] == [0, 0, 3600, 0]
    assert log.replaced_recently(LOCAL, str(out), 0) == {str(out / "old.tfrecord")}
    assert log.expire(LOCAL, str(out), 0, local=True) == []  # versions stay log.LOG_KEEP_S, whatever keep says
    assert list_versions(LOCAL, str(out)) == versions
    assert log.expire(LOCAL, str(out), 0, local=True, now=time.time() + 3599) == []
    assert list_versions(LOCAL, str(out)) == versions[2:]  # the versions that kept nothing went
    assert log.expire(LOCAL, str(out), 0, local=True, now=time.time() + 3601) == [str(out / "old.tfrecord")]
    assert not (out / "old.tfrecord").exists() and list_versions(LOCAL, str(out)) == versions[-1:]
    assert _tree(out) == [SUCCESS_MARKER, SCHEMA_FILE, "more.tfrecord", "new.tfrecord"]


def test_append_keeps_the_old_files_and_merges_the_recorded_schema(tmp_path):
    out = tmp_path / "out"
    _write(out, "error", "part-old.tfrecord", schema=_schema(x=pa.int64()))
    commit = _write(out, "append", "part-new.tfrecord", schema=_schema(x=pa.int64(), y=pa.string()))
    assert commit.recorded == _schema(x=pa.int64())  # what appended rows were checked against
    assert _tree(out) == [SUCCESS_MARKER, SCHEMA_FILE, "part-new.tfrecord", "part-old.tfrecord"]
    # What readers read: the latest version lists both writes' files, not only the append's.
    latest = read_version(LOCAL, str(out), list_versions(LOCAL, str(out))[-1])
    assert sorted(e.rel_path for e in latest.entries) == ["part-new.tfrecord", "part-old.tfrecord"]
    merged = read_stored_schema(LOCAL, str(out))
    assert merged.field("x").type == pa.int64() and merged.field("y") == pa.field("y", pa.string(), nullable=True)


def test_each_version_states_its_schema_and_a_version_from_before_that_reads_the_file(tmp_path):
    """Versions hold their schema (readers plan with the version's, whatever a racing writer left in the file
    beside it); a version written before they did (no ``schema`` key) is read with that file, and the next
    commit states the merged schema."""
    out = tmp_path / "out"
    _write(out, "error", "part-0.tfrecord", schema=_schema(x=pa.int64()))
    first = read_manifest(LOCAL, str(out))
    assert first.states_schema and first.schema == _schema(x=pa.int64())
    (out / SCHEMA_FILE).write_bytes(_schema(y=pa.string()).serialize())  # a stale or foreign copy: not read
    assert read_stored_schema(LOCAL, str(out)) == _schema(x=pa.int64())
    # The same version as an older ray_tfrecord wrote it: no schema key, so the file beside it says.
    path = version_path(str(out), first.version)
    doc = json.loads(open(path, "rb").read())
    del doc["schema"]
    with open(path, "w") as f:
        json.dump(doc, f)
    old = read_manifest(LOCAL, str(out))
    assert not old.states_schema and old.schema is None
    assert read_stored_schema(LOCAL, str(out)) == _schema(y=pa.string())
    (out / SCHEMA_FILE).write_bytes(_schema(x=pa.int64()).serialize())
    _write(out, "append", "part-1.tfrecord", schema=_schema(x=pa.int64(), z=pa.float32()))
    assert read_manifest(LOCAL, str(out)).schema.names == ["x", "z"]
    assert read_stored_schema(LOCAL, str(out), version=None).names == ["x", "z"]  # the file follows the version


def test_the_save_modes_on_existing_data(tmp_path):
    out = tmp_path / "out"
    _write(out, "error", "part-0.tfrecord")
    with pytest.raises(ValueError, match=f"Path {out} already exists. Use mode='overwrite', 'append' or 'ignore'"):
        Commit(LOCAL, str(out), "error").apply_mode()
    ignore = Commit(LOCAL, str(out), "ignore")
    assert ignore.apply_mode() and ignore.skipped
    # A directory holding only another writer's staging is empty.
    (tmp_path / "empty" / STAGING_DIR / "other").mkdir(parents=True)
    assert not Commit(LOCAL, str(tmp_path / "empty"), "error").apply_mode()
    # Nor does the temporary file a racing writer's local commit links into its first version (a mode="error"
    # write beside it was told the path "already exists", and the race's ConflictError test failed 1 run in 6).
    (tmp_path / "empty" / ".tmp-0123abcd").write_bytes(b"{}")
    assert not Commit(LOCAL, str(tmp_path / "empty"), "error").apply_mode()


@pytest.mark.parametrize("mode", ["error", "append"])
def test_a_name_clash_is_refused_before_anything_moves(tmp_path, mode):
    out = tmp_path / "out"
    if mode == "append":
        _write(out, "error", "taken.tfrecord")
    before = _tree(out) if out.exists() else []
    commit = Commit(LOCAL, str(out), mode)
    assert not commit.apply_mode()
    commit.start()
    if mode == "error":
        # Two tasks named their files alike: one staged file overwrote the other.
        staged = [_stage(commit, "same.tfrecord", index=True), _stage(commit, "other.tfrecord"),
                  _stage(commit, "same.tfrecord", index=True)]
        message = (f"{out}: filename_provider gave two write tasks the same file name 'same.tfrecord'; make "
                   "get_filename_for_task's name depend on task_index. Nothing was written")
    else:
        staged = [_stage(commit, "new.tfrecord"), _stage(commit, "taken.tfrecord")]
        message = (f"{out}/taken.tfrecord: the file exists: filename_provider named an appended file like an "
                   "existing one; put write_uuid in the name, or write with mode='overwrite'. Nothing was written")
    with pytest.raises(TFRecordError) as error:
        commit.finish(staged, [_schema(x=pa.int64())], names_from_caller=True)
    assert str(error.value) == message
    assert _tree(out) == before  # nothing moved: the staged files are all still staged
    assert all(os.path.exists(os.path.join(commit.staging, f.rel_path)) for f in staged)
    commit.abort()
    assert _tree(out) == before and not os.path.exists(out / STAGING_DIR)


def test_an_aborted_write_leaves_nothing_visible(tmp_path):
    out = tmp_path / "new"
    commit = Commit(LOCAL, str(out), "error")
    assert not commit.apply_mode()
    commit.start()
    _stage(commit, "day=1/part-0.tfrecord", index=True)
    commit.abort()
    assert not out.exists()  # the write created the directory, so it goes too

    _write(out, "error", "part-0.tfrecord")
    before = _tree(out)
    commit = Commit(LOCAL, str(out), "overwrite")
    assert not commit.apply_mode()
    commit.start()
    _stage(commit, "part-1.tfrecord")
    commit.abort()
    assert _tree(out) == before and STAGING_DIR not in os.listdir(out)


def test_the_commit_protocol_imports_no_ray():
    code = "import sys, ray_tfrecord._src.data.write.commit; assert 'ray' not in sys.modules, sorted(sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-3000:]


# -- under Ray's job checkpointing (the commit per write task) -----------------------------------


def _checkpointed(path, mode: str, *, started: bool) -> Commit:
    commit = Commit(LOCAL, str(path), mode)
    commit.use_checkpoint("/ckpt/job-1", started=started)
    return commit


def _publish(commit: Commit, task: int, run: str, schema: pa.Schema, *, index: bool = True) -> list[StagedFile]:
    """A checkpointed write task: stage a file named for Ray's recovery, then publish it."""
    base = f"part-{task:05d}-{run}"
    return commit.publish([_stage(commit, f"{base}-0.tfrecord", index=index)], [schema], base)


def test_a_checkpointed_task_publishes_its_files_and_the_reruns_continue(tmp_path):
    out = tmp_path / "out"
    first = _checkpointed(out, "error", started=False)
    assert not first.apply_mode()
    first.start()
    assert first.staging == f"{out}/{STAGING_DIR}/checkpoint-{first.checkpoint}"
    published = _publish(first, 0, "a" * 32, _schema(x=pa.int64()))
    assert all(f.in_place for f in published)
    # In place before the task returns, sidecar included; its schema recorded in the staging directory.
    assert _tree(out) == [f"_index.part-00000-{'a' * 32}-0%2Etfrecord", f"part-00000-{'a' * 32}-0.tfrecord"]
    assert [n for n in os.listdir(first.staging) if n.endswith(".schema")] == [f"part-00000-{'a' * 32}.0.schema"]
    first.abort()  # a failed run keeps what its tasks published: Ray recorded their ids
    assert len(_tree(out)) == 2 and os.path.isdir(first.staging)

    # The rerun (Ray's checkpoint holds records): mode="error" does not refuse the first run's output.
    rerun = _checkpointed(out, "error", started=True)
    assert not rerun.apply_mode()
    rerun.start()
    second = _publish(rerun, 0, "b" * 32, _schema(x=pa.int64(), y=pa.string()))
    result = rerun.finish(second, [])
    assert result.num_rows == second[0].rows  # this run's rows
    assert read_stored_schema(LOCAL, str(out)) == _schema(x=pa.int64(), y=pa.string())  # both runs' schemas
    assert SUCCESS_MARKER in os.listdir(out) and STAGING_DIR not in os.listdir(out)


def test_a_checkpointed_overwrite_replaces_the_old_files_at_the_jobs_commit_only(tmp_path):
    out = tmp_path / "out"
    _write(out, "error", "old-0.tfrecord", "k=1/old-1.tfrecord")
    old = _tree(out)
    first = _checkpointed(out, "overwrite", started=False)
    assert not first.apply_mode()
    first.start()
    assert _tree(out) == old  # readers read the old dataset until the job commits
    _publish(first, 0, "a" * 32, _schema(x=pa.int64()))
    rerun = _checkpointed(out, "overwrite", started=True)
    assert not rerun.apply_mode()
    rerun.start()
    assert len(_tree(out)) == len(old) + 2  # the first run's file and sidecar stay, and the old files
    result = rerun.finish([], [])
    assert read_stored_schema(LOCAL, str(out)) == _schema(x=pa.int64())
    version = read_manifest(LOCAL, str(out))
    assert version is not None and version.version == result.version
    assert [e.rel_path for e in version.entries] == [f"part-00000-{'a' * 32}-0.tfrecord"]
    assert sorted(version.commit.removed) == ["k=1/old-1.tfrecord", "old-0.tfrecord"]
    assert not (out / "old-0.tfrecord").exists()  # replaced at the job's commit: deleted then (keep_replaced 0)


def test_a_rerun_after_ray_deleted_its_checkpoint_only_completes_the_commit(tmp_path):
    """Ray deletes its checkpoint on success, before the driver's final commit: the staging directory
    still holding task records then says the data is complete."""
    out = tmp_path / "out"
    first = _checkpointed(out, "append", started=False)
    assert not first.apply_mode()
    first.start()
    _publish(first, 0, "a" * 32, _schema(x=pa.int64()))
    rerun = _checkpointed(out, "append", started=False)
    assert rerun.apply_mode()  # nothing to write
    assert rerun.completed is not None and rerun.completed.num_rows == 0
    assert sorted(n for n in os.listdir(out) if not n.startswith(LOG_PREFIX)) == sorted([SCHEMA_FILE, SUCCESS_MARKER,
                                              TFMD_SCHEMA_FILE, f"_index.part-00000-{'a' * 32}-0%2Etfrecord",
                                              f"part-00000-{'a' * 32}-0.tfrecord"])


def test_the_final_commit_removes_sidecars_whose_file_ray_deleted(tmp_path):
    """Ray's recovery deletes a killed task's files by name; their sidecars (``_index.``) and emptied
    partition directories go in the final commit."""
    out = tmp_path / "out"
    commit = _checkpointed(out, "error", started=False)
    assert not commit.apply_mode()
    commit.start()
    kept = _publish(commit, 0, "a" * 32, _schema(x=pa.int64()))
    base = f"part-00001-{'a' * 32}"
    gone = commit.publish([_stage(commit, f"k=1/{base}-0.tfrecord", index=True)], [_schema(x=pa.int64())], base)
    os.remove(out / "k=1" / f"{base}-0.tfrecord")  # what Ray's recovery does
    for name in os.listdir(commit.staging):
        if name.startswith(base):
            os.remove(os.path.join(commit.staging, name))
    commit.finish([], [])
    assert _tree(out) == sorted([SCHEMA_FILE, SUCCESS_MARKER, f"_index.{kept[0].rel_path.replace('.', '%2E')}",
                                 kept[0].rel_path])
    assert gone and not (out / "k=1").exists()


def test_appending_to_files_with_no_recorded_schema_stays_unrecorded_across_runs(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old-0.tfrecord").write_bytes(b"records")  # another writer's: no log, no schema
    first = _checkpointed(out, "append", started=False)
    assert not first.apply_mode()
    first.start()
    _publish(first, 0, "a" * 32, _schema(x=pa.int64()))
    rerun = _checkpointed(out, "append", started=True)
    assert not rerun.apply_mode()
    rerun.start()
    rerun.finish([], [])
    assert SCHEMA_FILE not in os.listdir(out)  # the old files' schema is unknown: nothing is recorded
    latest = read_manifest(LOCAL, str(out))
    assert latest.states_schema and latest.schema is None


def test_checkpointed_error_and_ignore_apply_to_the_first_run_only(tmp_path):
    out = tmp_path / "out"
    _write(out, "error", "old-0.tfrecord")
    with pytest.raises(ValueError, match="already exists"):
        _checkpointed(out, "error", started=False).apply_mode()
    ignore = _checkpointed(out, "ignore", started=False)
    assert ignore.apply_mode() and ignore.skipped
    # A rerun (its checkpoint holds records) writes into what the first run started, whatever the mode.
    for mode in ("error", "ignore"):
        rerun = _checkpointed(out, mode, started=True)
        assert not rerun.apply_mode() and not rerun.skipped
