"""The all-or-nothing commit of a TFRecord write, racing other writers, on any ``pyarrow.fs`` filesystem.

This module imports no Ray: ``Commit`` is the protocol alone, driven by the datasink, testable on a local disk.
ARCHITECTURE.md ("Write") and docs/cloud-storage.md ("How a write commits") give the account; in brief:

1. ``Commit.apply_mode`` and ``Commit.start`` (driver) apply the save mode. On local disk and HDFS the
   writers then write every file, and its index sidecar (``_index.<relative path>``), under
   ``<path>/_temporary/<write id>/``, which readers skip; on S3 and GCS they write each file at its
   final key, ``part-<task>-<write id>-<n>``, and return its size, rows and record index.
2. After every writer succeeded, ``Commit.finish`` (driver) renames the staged files into place,
   records the schema and commits the next version of the dataset's log (``log.commit``: a
   create-if-absent, retried on the latest version when another write took the number). That is the
   commit point: our readers read exactly the files of the latest version, so they see the dataset
   before or after, never a part. Then ``_SUCCESS``; then it deletes the files it replaced, with
   ``keep_replaced`` 0 (the default; ``log.delete_replaced``), and what commits kept longer ago than their
   ``keep_replaced`` (``log.expire``), so that readers that planned against an earlier version finish
   where the writer asked for it. A failed write calls ``Commit.abort``.

Under Ray's job checkpointing (``DataContext.checkpoint_config``, Ray 2.60) Ray records a task's ids as
done when the task returns, and a rerun skips them: the task's files must be in place by then. Ray writes
the ids as a pending record before the task writes; ``Commit.publish`` (in the task) records the task's
schemas and files (``<base>.files``) in the job's staging directory, then moves them into place (on local
disk; on an object store they are there), and Ray then commits the record. A job killed between the two
leaves a pending record; the rerun's recovery (Ray's) deletes the files (and records) named after it and
writes those rows again. Files are named ``part-<task>-<write id>-<n>`` so that Ray can match them. The
staging directory is ``_temporary/checkpoint-<key of the checkpoint path>/``, the same in every run of
the job; its presence after Ray deleted its checkpoint (on success) says the data is complete and only
this commit's last steps remain. ``Commit.apply_mode`` applies the save mode on the job's first run only
(an overwrite leaves a marker: the old files stay listed until the job's commit); ``Commit.finish`` then
commits every run's recorded files as one version.

Example (``staged`` and ``schemas`` are what the writers report)::

    >>> import pyarrow.fs as pafs
    >>> commit = Commit(pafs.LocalFileSystem(), "/tmp/words", "overwrite")  # doctest: +SKIP
    >>> if not commit.apply_mode():  # False: go ahead; True: mode="ignore" found data  # doctest: +SKIP
    ...     commit.start()
    ...     ...  # write files under commit.write_dir, one StagedFile each
    ...     result = commit.finish(staged, schemas)
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import logging
import os
import posixpath
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs

from ray_tfrecord._src.core import options
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.index import index_path
from ray_tfrecord._src.core.layout import (
    SCHEMA_FILE,
    STAGING_DIR,
    SUCCESS_MARKER,
    is_hidden_name,
)
from ray_tfrecord._src.core.manifest import (
    ConflictError,
    Entry,
    Manifest,
    is_object_store,
    list_versions,
    read_manifest,
    version_path,
    write_manifest,
)
from ray_tfrecord._src.core.schema import read_stored_schema
from ray_tfrecord._src.core.spec_export import record_tfmd
from ray_tfrecord._src.data.write.commit import log
from ray_tfrecord._src.data.write.dataset_files import (
    CHECKPOINT_STAGING,
    parallel,
    remove,
    remove_orphan_sidecars,
    unlisted_files,
)

logger = logging.getLogger(__name__)

# A checkpointed job's staging directory, ``_temporary/checkpoint-<key>``, and what it holds besides staged
# files: one record per schema a task wrote (``<task's file base>.<n>.schema``, so Ray's recovery deletes it
# with the task's files), one record of the task's files (``<base>.files``, a manifest of them), and a marker:
# the job overwrites (the old files stay listed until its commit).
_SCHEMA_RECORD = ".schema"
_FILES_RECORD = ".files"
_OVERWRITE = "_overwrite"
#: How long a commit keeps the files it replaced, by default: none, so that a reader globbing the directory
#: (``tf.data``) never sees old and new rows together; readers of ours that planned before it then fail, naming
#: the commit and ``keep_replaced_files``.
DEFAULT_KEEP_REPLACED_S = 0.0


def checkpoint_file_base(task_idx: int, write_uuid: str) -> str:
    """The start of every file name a write task uses under checkpointing; Ray's recovery deletes the files whose
    names start with a pending record's base, so no other task's may (the ``-`` after the task number)."""
    return f"part-{task_idx:05d}-{write_uuid}"


@dataclass(frozen=True)
class TFRecordWriteResult:
    """What a write produced: ``files``, the final paths of its data files (none when ``mode="ignore"`` skipped it);
    ``version``, the dataset's version it committed; ``retries``, the commits it lost to other writes first."""

    num_rows: int
    files: list[str] = field(default_factory=list)
    bytes_written: int = 0
    skipped: bool = False
    version: int | None = None
    retries: int = 0

    @property
    def num_files(self) -> int:
        return len(self.files)


class StagedFile(NamedTuple):
    """A data file a writer finished in the staging directory."""

    rel_path: str  # under the staging directory, and under the destination once committed
    rows: int
    size: int
    has_index: bool  # whether its index sidecar was staged too
    in_place: bool = False  # already at its final path (written there on an object store, or moved by publish)
    record_index: bytes | None = None  # its RecordIndex, kept in the manifest rather than a sidecar (object stores)


def make_dirs(filesystem: pafs.FileSystem, path: str, *, object_store: bool) -> None:
    """Create directory ``path`` and its parents, except on an object store: there directories do not exist,
    and creating marker objects only costs requests (and IAM permissions on parent prefixes)."""
    if not object_store:
        filesystem.create_dir(path, recursive=True)


def dataset_exists(filesystem: pafs.FileSystem, path: str) -> bool:
    """Whether ``path`` holds data: a file, or a directory with an entry readers read (not hidden: the staging
    directory, the log, and the ``.tmp-`` file a racing writer's local commit links into a version are not)."""
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.File:
        return True
    if info.type != pafs.FileType.Directory:
        return False
    entries = filesystem.get_file_info(pafs.FileSelector(path))
    return any(not is_hidden_name(posixpath.basename(e.path)) for e in entries)


class Commit:
    """One write's commit into the dataset directory ``path`` on ``filesystem``.

    Args:
        filesystem: Where the dataset is, possibly wrapped (Ray's retrying filesystem).
        path: The dataset directory.
        mode: What to do with data already at ``path``: ``"error"``, ``"overwrite"``,
            ``"append"`` or ``"ignore"``.
        underlying: The filesystem ``filesystem`` wraps, to tell the stores apart; ``filesystem`` when absent.
        caller_names: Whether the caller names the files (a ``FilenameProvider``): staged, as they could clash.
        partitions_only: For ``overwrite``: replace only the partition directories the write writes
            (Spark's dynamic partition overwrite), keeping the others.
        keep_replaced: Seconds the files this commit replaces stay, for readers that planned before it
            (recorded in its version, so later commits and ``ray-tfrecord clean`` honour it).

    The object is pickled into the writers along with the datasink; only ``staging``,
    ``object_store`` and ``filesystem`` matter there.
    """

    def __init__(self, filesystem: pafs.FileSystem, path: str, mode: options.Mode, *,
                 underlying: pafs.FileSystem | None = None, caller_names: bool = False,
                 partitions_only: bool = False, keep_replaced: float = DEFAULT_KEEP_REPLACED_S) -> None:
        self.filesystem = filesystem
        self.path = path.rstrip("/")
        self.mode = options.mode(mode)
        if partitions_only and self.mode != "overwrite":
            raise ValueError(f"partition_overwrite='dynamic' replaces partitions, so it needs mode='overwrite', "
                             f"not {self.mode!r}")
        if keep_replaced < 0:
            raise ValueError(f"keep_replaced_files must be 0 or more seconds, got {keep_replaced}")
        self.partitions_only = partitions_only
        self.keep_replaced = keep_replaced
        self._store = filesystem if underlying is None else underlying
        #: Whether ``filesystem`` is S3 or GCS: no directories, a move is a copy, so files go to their final keys.
        self.object_store = is_object_store(self._store)
        #: Whether write tasks write files at their final paths (object stores, unless the caller names them).
        self.direct = self.object_store and not caller_names
        self._local = isinstance(self._store, pafs.LocalFileSystem)
        #: This write's id, in the names of the files written directly.
        self.write_id = uuid.uuid4().hex
        #: Where writers put their files until ``finish`` moves them into place.
        self.staging = posixpath.join(self.path, STAGING_DIR, self.write_id)
        #: Set by ``apply_mode``: the schema recorded by the dataset this write appends to
        #: (appended rows must agree with it), and whether ``ignore`` skips the write.
        self.recorded: pa.Schema | None = None
        self.skipped = False
        #: Set by ``use_checkpoint``: the job checkpoint this write takes part in; and by
        #: ``apply_mode``: whether a rerun found the job's data complete (and completed its commit).
        self.checkpoint: str | None = None
        self.completed: TFRecordWriteResult | None = None
        self._created_root = False
        self._found_data = False  # apply_mode saw a dataset (for error and ignore: none must appear by the commit)

    @property
    def write_dir(self) -> str:
        """Where write tasks put their files: the dataset directory, or the staging directory."""
        return self.path if self.direct else self.staging

    def use_checkpoint(self, checkpoint_path: str, *, started: bool) -> None:
        """Take part in the job checkpoint at ``checkpoint_path`` (call before ``apply_mode``);
        ``started``: it holds records, so this run continues an earlier one."""
        self.checkpoint = hashlib.sha256(checkpoint_path.encode()).hexdigest()[:16]
        self.staging = posixpath.join(self.path, STAGING_DIR, CHECKPOINT_STAGING + self.checkpoint)
        self._checkpoint_started = started

    def apply_mode(self) -> bool:
        """Apply the save mode to what is at the destination: raise ``ValueError`` for ``error``,
        return ``True`` (write nothing) for ``ignore``, ``False`` to go ahead."""
        if self.checkpoint is not None:
            if self._checkpoint_started:  # a rerun continues what the earlier runs wrote, whatever the mode
                self.recorded = read_stored_schema(self.filesystem, self.path)
                return False
            if self._schema_records():  # Ray deleted its checkpoint on success: only our last steps remain
                self.completed = self.finish([], [])
                return True
        latest = read_manifest(self.filesystem, self.path)
        if not self._holds_data(latest):
            return False
        self._found_data = True
        if self.mode == "append":  # the schema of the version just read: one read of the log, not two
            self.recorded = read_stored_schema(self.filesystem, self.path, version=latest)
        if self.mode == "error":
            raise ValueError(
                f"Path {self.path} already exists. Use mode='overwrite', 'append' or "
                "'ignore' to write there anyway."
            )
        if self.mode == "ignore":
            logger.warning("[mode=ignore] %s exists; not writing.", self.path)
            self.skipped = True
            return True
        return False

    def _holds_data(self, latest: Manifest | None) -> bool:
        """Whether the dataset, whose ``latest`` version was just read, holds data; with a log, whether that
        version lists any file (what a killed write left is not data)."""
        if latest is not None:
            return bool(latest.entries)
        return dataset_exists(self.filesystem, self.path)

    def start(self) -> None:
        """Create the staging directory (after ``apply_mode`` said to go ahead)."""
        fs = self.filesystem
        self._created_root = fs.get_file_info(self.path).type == pafs.FileType.NotFound
        if read_manifest(fs, self.path) is None:
            # A first version, before any file of this write lands (at its final key, or renamed there): from
            # now on our readers and every writer read only committed files, never another write's in flight.
            log.commit(fs, self._store, self.path, log.Change("append", self.write_id, [], ()))
        if self.checkpoint is not None and not self._checkpoint_started:
            # The job's first run. Its files land task by task, unlisted until the job's commit, which replaces
            # the old ones (an overwrite) in one version.
            if self.mode == "overwrite":
                self._mark(_OVERWRITE)
        make_dirs(fs, self.staging, object_store=self.object_store)

    def _mark(self, name: str) -> None:
        make_dirs(self.filesystem, self.staging, object_store=self.object_store)
        self.filesystem.open_output_stream(posixpath.join(self.staging, name), compression=None).close()

    def _marked(self, name: str) -> bool:
        return self.filesystem.get_file_info(posixpath.join(self.staging, name)).type == pafs.FileType.File

    def publish(self, staged: Sequence[StagedFile], schemas: Sequence[pa.Schema], base: str) -> list[StagedFile]:
        """In a checkpointed write task: record the task's ``schemas`` and ``staged`` files, make them durable
        and move them into place (sidecar first), before Ray commits the task's ids. ``base``: the
        ``checkpoint_file_base`` of the task's files. Returns the files, marked in place."""
        fs = self.filesystem
        for n, schema in enumerate(schemas):
            with fs.open_output_stream(posixpath.join(self.staging, f"{base}.{n}{_SCHEMA_RECORD}"),
                                       compression=None) as out:
                out.write(schema.serialize())
        if staged:  # one record of the files, not a listing of them at the commit
            write_manifest(fs, self.staging, Manifest(_entries(staged)), name=base + _FILES_RECORD)
        if self.direct:  # the files are at their final keys already
            return [f._replace(in_place=True) for f in staged]
        moves = []
        for f in staged:
            src, dst = posixpath.join(self.staging, f.rel_path), posixpath.join(self.path, f.rel_path)
            if f.has_index:
                moves.append((index_path(src, self.staging), index_path(dst, self.path)))
            moves.append((src, dst))
        self._sync([*(src for src, _ in moves), self.staging])
        for src, dst in moves:
            make_dirs(fs, posixpath.dirname(dst), object_store=self.object_store)
            fs.move(src, dst)
        self._sync({posixpath.dirname(dst) for _, dst in moves})
        return [f._replace(in_place=True) for f in staged]

    def _sync(self, paths: Iterable[str]) -> None:
        """Flush files or directories to disk (local filesystems; a move elsewhere is a durable copy):
        Ray's record of the rows must not outlive them in a power loss."""
        if not self._local:
            return
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def finish(self, staged: Sequence[StagedFile], schemas: Sequence[pa.Schema], *,
               names_from_caller: bool = False) -> TFRecordWriteResult:
        """Move the ``staged`` files into place and commit them as the dataset's next version; ``schemas`` are
        the record schemas the writers wrote. ``names_from_caller``: the file names are the caller's (a
        ``filename_provider``), so they may clash; a clash fails the write before any file moves. Raises
        ``ConflictError`` when another write committed what this one cannot follow (``error``, ``ignore``:
        a dataset); nothing of this write is then visible."""
        if names_from_caller:
            self._refuse_name_clashes(staged)
        fs = self.filesystem
        moves = [f for f in staged if not f.in_place]
        if self.object_store:  # a filename_provider's files, staged: a copy each, in parallel
            parallel(lambda f: fs.move(posixpath.join(self.staging, f.rel_path),
                                       posixpath.join(self.path, f.rel_path)), moves)
        else:
            for f in moves:
                src, dst = posixpath.join(self.staging, f.rel_path), posixpath.join(self.path, f.rel_path)
                make_dirs(fs, posixpath.dirname(dst), object_store=False)
                if f.has_index:  # the sidecar first: a data file is splittable as soon as it is there
                    fs.move(index_path(src, self.staging), index_path(dst, self.path))
                fs.move(src, dst)
        new = _entries(staged)
        checkpointed = self.checkpoint is not None
        written = list(schemas)
        if checkpointed:
            # This run's tasks recorded their files and schemas too: each once.
            new = list({e.rel_path: e for e in [*self._task_files(), *new]}.values())
            replaces = self._marked(_OVERWRITE)
            written = [*self._schema_records(), *schemas]
        else:
            replaces = self.mode == "overwrite"
        scope = (None if not self.partitions_only else log.partitions_of(e.rel_path for e in new)) if replaces else ()
        change = log.Change(self.mode, self.write_id, new, scope,
                            must_be_first=self.mode in ("error", "ignore") and not checkpointed,
                            keep_replaced=self.keep_replaced, schemas=written)
        try:
            committed = log.commit(fs, self._store, self.path, change)
        except ConflictError:
            self._remove([posixpath.join(self.path, e.rel_path) for e in new])
            if self.mode != "ignore":
                raise
            # Ignore's serial outcome after the write that won: the dataset exists, so nothing is written.
            logger.warning("[mode=ignore] another write created %s while this one ran; not writing.", self.path)
            return TFRecordWriteResult(num_rows=0, skipped=True)
        self._publish_schema(committed.version)
        with fs.open_output_stream(posixpath.join(self.path, SUCCESS_MARKER), compression=None):
            pass
        if self.direct:  # a retried task's extra files, written at final keys that no version lists
            mine = f"part-*-{self.write_id}-*"
            log.delete_quietly(fs, [p for p in unlisted_files(fs, self.path, committed.version)
                                    if fnmatch.fnmatch(posixpath.basename(p), mine)])
        if self.keep_replaced == 0:
            log.delete_replaced(fs, self.path, committed.version, local=not self.object_store)
        log.expire(fs, self.path, self.keep_replaced, local=not self.object_store)
        if checkpointed:
            # Ray's recovery deletes a killed task's files, not their sidecars. The staging directory goes last:
            # while it is there, a rerun finds this commit to complete.
            remove_orphan_sidecars(fs, self.path)
        self._remove_staging()
        return TFRecordWriteResult(num_rows=sum(f.rows for f in staged),
                                   files=[posixpath.join(self.path, f.rel_path) for f in staged],
                                   bytes_written=sum(f.size for f in staged),
                                   version=committed.version.version, retries=committed.retries)

    def _task_files(self) -> list[Entry]:
        """Every checkpointed task's files, as the tasks recorded them, in every run so far."""
        entries = self.filesystem.get_file_info(pafs.FileSelector(self.staging, allow_not_found=True))
        names = sorted(posixpath.basename(e.path) for e in entries if e.is_file and e.path.endswith(_FILES_RECORD))
        found = parallel(lambda name: read_manifest(self.filesystem, self.staging, name=name), names)
        return [e for m in found if m is not None for e in m.entries]

    def _remove(self, paths: Sequence[str]) -> None:
        """Delete this write's data files (and sidecars, where there are), committed by no version."""
        sidecars = [] if self.object_store else [index_path(p, self.path) for p in paths]
        log.delete_quietly(self.filesystem, [*paths, *sidecars])

    def abort(self) -> None:
        """Remove what a failed write staged, and the dataset directory if this write created it
        and it holds nothing else. A checkpointed write keeps both: its tasks' files are in place and
        their ids recorded, and the rerun continues them. On an object store, the files this write wrote at
        their final keys go too (a task still running may yet add one: no version lists it)."""
        if self.checkpoint is not None:
            return
        if self.direct:
            version = read_manifest(self.filesystem, self.path) or Manifest()
            mine = f"part-*-{self.write_id}-*"
            self._remove([p for p in unlisted_files(self.filesystem, self.path, version)
                          if fnmatch.fnmatch(posixpath.basename(p), mine)])
        self._remove_staging()
        if self._created_root and self._only_our_first_version():
            self.filesystem.delete_file(version_path(self.path, 1))
            if not self.object_store:
                with contextlib.suppress(OSError):  # another write's files arrived meanwhile
                    os.rmdir(self.path) if self._local else self.filesystem.delete_dir(self.path)

    def _only_our_first_version(self) -> bool:
        """Whether the dataset holds nothing but the empty first version ``start`` committed."""
        version = read_manifest(self.filesystem, self.path)
        return (version is not None and version.version == 1 and version.commit is not None
                and version.commit.write_id == self.write_id and not dataset_exists(self.filesystem, self.path))

    def _refuse_name_clashes(self, staged: Sequence[StagedFile]) -> None:
        """A filename_provider's names are the caller's: two tasks may get the same one (both wrote the
        same staged path, so one file's rows are lost) or, appending, one already in the dataset.
        Either fails the write before any file moves, rather than replacing data."""
        seen = set()
        for f in staged:
            if f.rel_path in seen:
                raise TFRecordError(f"filename_provider gave two write tasks the same file name {f.rel_path!r}; "
                                    "make get_filename_for_task's name depend on task_index. Nothing was written",
                                    path=self.path)
            seen.add(f.rel_path)
        if self.mode == "append":
            for f in staged:
                dst = posixpath.join(self.path, f.rel_path)
                if self.filesystem.get_file_info(dst).type != pafs.FileType.NotFound:
                    raise TFRecordError("the file exists: filename_provider named an appended file like an existing "
                                        "one; put write_uuid in the name, or write with mode='overwrite'. Nothing "
                                        "was written", path=dst)

    def _publish_schema(self, version: Manifest) -> None:
        """Keep SCHEMA_FILE (and its TFMD text) the schema of the latest version, for readers that do not read
        the log: ``tf.data`` and TFX, through the TFMD file, and ray_tfrecord from before versions held their
        schema. Racing committers each write their version's, then list the log, and write a later version's
        if one is there: a commit after that listing writes after this write, so the last write is the latest."""
        fs = self.filesystem
        path = posixpath.join(self.path, SCHEMA_FILE)
        while True:
            if version.schema is not None:
                with fs.open_output_stream(path, compression=None) as f:
                    f.write(version.schema.serialize())
            else:
                log.delete_quietly(fs, [path])
            record_tfmd(fs, self.path, version.schema)
            versions = list_versions(fs, self.path)
            if not versions or versions[-1] <= version.version:
                return
            later = read_manifest(fs, self.path)
            if later is None or not later.states_schema:
                return
            version = later

    def _schema_records(self) -> list[pa.Schema]:
        """The schemas a checkpointed job's tasks recorded, in every run so far."""
        entries = self.filesystem.get_file_info(pafs.FileSelector(self.staging, allow_not_found=True))
        records = sorted(e.path for e in entries if e.is_file and e.path.endswith(_SCHEMA_RECORD))
        out = []
        for path in records:
            with self.filesystem.open_input_file(path) as f:
                out.append(pa.ipc.read_schema(pa.py_buffer(f.read())))
        return out

    def _remove_staging(self) -> None:
        if self.filesystem.get_file_info(self.staging).type != pafs.FileType.NotFound:
            remove(self.filesystem, [self.staging])
        # `_temporary` is shared with concurrent writers: a check-then-delete could wipe a staging
        # directory created in between, or fail on one another writer removed first. Locally an
        # rmdir is atomic and refuses a non-empty directory; elsewhere delete_dir removes a whole
        # prefix, so the (hidden, empty) prefix is left.
        if self._local:
            with contextlib.suppress(OSError):
                os.rmdir(posixpath.dirname(self.staging))


def _entries(files: Sequence[StagedFile]) -> list[Entry]:
    return [Entry(f.rel_path, f.size, f.rows, f.record_index) for f in files]

