"""The commit protocol on its own (ray_tfrecord.io.commit), on a local directory and without Ray:
staging, the save modes, moves with sidecars first, overwrite's deletions, the recorded schema,
``_SUCCESS`` last, name clashes refused before anything moves, and an aborted write."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from ray_tfrecord.core.errors import TFRecordError
from ray_tfrecord.core.index import index_path
from ray_tfrecord.core.layout import SCHEMA_FILE, STAGING_DIR, SUCCESS_MARKER
from ray_tfrecord.core.schema import read_stored_schema, stored_schema
from ray_tfrecord.io.commit import Commit, StagedFile
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
    """Every file under ``root`` outside the staging directories, relative, sorted."""
    files = (os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)
    return sorted(f for f in files if not f.startswith(f"{STAGING_DIR}/"))


def _write(path, mode: str, *names: str, schema: pa.Schema | None = None) -> Commit:
    commit = Commit(LOCAL, str(path), mode)
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


def test_append_keeps_the_old_files_and_merges_the_recorded_schema(tmp_path):
    out = tmp_path / "out"
    _write(out, "error", "part-old.tfrecord", schema=_schema(x=pa.int64()))
    commit = _write(out, "append", "part-new.tfrecord", schema=_schema(x=pa.int64(), y=pa.string()))
    assert commit.recorded == _schema(x=pa.int64())  # what appended rows were checked against
    assert _tree(out) == [SUCCESS_MARKER, SCHEMA_FILE, "part-new.tfrecord", "part-old.tfrecord"]
    merged = read_stored_schema(LOCAL, str(out))
    assert merged.field("x").type == pa.int64() and merged.field("y") == pa.field("y", pa.string(), nullable=True)


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
    code = "import sys, ray_tfrecord.io.commit; assert 'ray' not in sys.modules, sorted(sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-3000:]
