"""The committed versions of a dataset: which files each holds, with their indexes, and which write made it.

Every write commits a new version, ``<root>/_tfrecord_log.<version, 20 digits>.json`` (``LOG_PREFIX``), an
object created once by a put-if-absent and never replaced (``ray_tfrecord._src.data.write.commit`` says how
writers race for the next number). A version lists every data file of the dataset at that version (its
path below the root, size, rows and record index, which replaces the ``_index.*`` sidecar on object
stores), the schema of its records (``Manifest.schema``) and the commit that made it: the write's mode,
time and id, the partitions it replaced and the files it removed. The highest version is the dataset.
A reader reads it once and then exactly its files, with its schema: what a write in flight or killed put
there is never seen, and since a version is never rewritten, a read of one is never torn.

A dataset committed before the log has ``_tfrecord_manifest.json`` (``MANIFEST_FILE``: the same list,
without a version), read where there is no log; its next write moves it to the log.

>>> m = Manifest([Entry("a=1/part-0.tfrecord", 10, 2, b"ix")])
>>> Manifest.from_bytes(m.to_bytes(), path="m").entries[0].index
b'ix'
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

from .errors import TFRecordError
from .index import dataset_root
from .layout import LOG_PREFIX, MANIFEST_FILE
from .public import public

# 1: the manifest before the log, and a checkpointed task's record of its files; 2: a version of the log.
_READABLE = (1, 2)
_FORMAT = 2
_DIGITS = 20
# Listings of the log a read of the latest version may take, each version expired (by writes that committed
# after it) between the listing and the read.
_RELISTS = 20
_VERSION_NAME = re.compile(rf"{re.escape(LOG_PREFIX)}(\d{{{_DIGITS}}})\.json")
# pyarrow's type names of the filesystems without directories or renames.
_OBJECT_STORES = ("s3", "gcs")


def is_object_store(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` (not a wrapper: pass what it wraps) is S3 or GCS, where files are written at their final keys."""
    return fs.type_name in _OBJECT_STORES


@dataclass(frozen=True)
class Entry:
    """One committed data file."""

    rel_path: str  # below the dataset root
    size: int
    rows: int | None  # None: not known (a file that was there before the first manifest)
    index: bytes | None = None  # its RecordIndex, for an uncompressed file this package wrote


@dataclass(frozen=True)
class CommitInfo:
    """How a version came about."""

    version: int
    mode: str  # the write's save mode
    time: float  # seconds since the epoch, when the writer committed
    write_id: str
    # What the write replaced: None, the whole dataset (an overwrite); else these partition directories
    # (a partition overwrite); none for an append.
    replaced: tuple[str, ...] | None
    removed: tuple[str, ...] = ()  # the files of the version before that it no longer lists
    keep_replaced: float = 0.0  # the write's keep_replaced_files: seconds ``removed`` stay for reads planned before

    def describe(self) -> str:
        """The commit in a message: ``version 7 (mode='overwrite' of every partition, committed ... by write ...)``."""
        when = datetime.datetime.fromtimestamp(self.time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        what = ("" if not self.replaced and self.replaced is not None else
                " of every partition" if self.replaced is None else f" of {', '.join(self.replaced)}")
        return f"version {self.version} (mode={self.mode!r}{what}, committed {when} by write {self.write_id})"

    def replaces(self, rel_path: str) -> bool:
        """Whether this commit replaced the file at ``rel_path`` (its partition, for a partition overwrite)."""
        if self.replaced is None:
            return True
        return any(rel_path.startswith(p + "/") for p in self.replaced)


@public("ray_tfrecord")
class ConflictError(TFRecordError):
    """A write lost a race with another write to the same dataset that no order of the two resolves (two
    overwrites of one partition, a ``mode="error"`` write to a dataset another write created meanwhile).
    Nothing of the losing write is visible. ``other`` is the commit it lost to."""

    def __init__(self, message: str, *, path: str, other: CommitInfo | None = None) -> None:
        super().__init__(message, path=path)
        self.other = other

    def __reduce__(self):  # Ray pickles an exception leaving a task or a job by its arguments
        return (_conflict, (self.reason, self.path, self.other))


def _conflict(reason: str, path: str, other: CommitInfo | None) -> ConflictError:
    return ConflictError(reason, path=path, other=other)


@dataclass(frozen=True)
class Manifest:
    entries: list[Entry] = field(default_factory=list)
    commit: CommitInfo | None = None  # None: a manifest from before the log, or a task's record
    # The schema of every file the version lists, in the version itself, so that the schema a reader plans
    # with is the one its files were committed with, whatever writes raced (a file beside the versions would
    # be the last writer's). ``states_schema`` False: a version from before versions held it (the dataset's
    # _tfrecord_schema.arrow then says); True with ``schema`` None: no schema holds for all its files.
    schema: pa.Schema | None = None
    states_schema: bool = False

    @property
    def version(self) -> int:
        """The version's number; 0 for a dataset without a log."""
        return 0 if self.commit is None else self.commit.version

    def to_bytes(self) -> bytes:
        files = [{"path": e.rel_path, "size": e.size, "rows": e.rows,
                  "index": None if e.index is None else base64.b64encode(e.index).decode()} for e in self.entries]
        doc: dict = {"version": 1 if self.commit is None else _FORMAT, "files": files}
        if self.commit is not None:
            c = self.commit
            doc["commit"] = {"version": c.version, "mode": c.mode, "time": c.time, "write_id": c.write_id,
                             "replaced": None if c.replaced is None else list(c.replaced), "removed": list(c.removed),
                             "keep_replaced": c.keep_replaced}
        if self.states_schema:  # an optional key: older readers of format 2 skip it
            doc["schema"] = None if self.schema is None else base64.b64encode(self.schema.serialize()).decode()
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str) -> Manifest:
        try:
            doc = json.loads(data)
            if doc.get("version") not in _READABLE:
                raise ValueError(f"format {doc.get('version')!r}, this package reads {_READABLE}")
            commit = None
            if (c := doc.get("commit")) is not None:
                commit = CommitInfo(int(c["version"]), str(c["mode"]), float(c["time"]), str(c["write_id"]),
                                    None if c["replaced"] is None else tuple(c["replaced"]), tuple(c["removed"]),
                                    float(c.get("keep_replaced", 0.0)))
            schema = None
            if (stated := doc.get("schema")) is not None:
                schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(stated)))
            return cls([Entry(f["path"], int(f["size"]), f["rows"],
                              None if f["index"] is None else base64.b64decode(f["index"])) for f in doc["files"]],
                       commit, schema, "schema" in doc)
        except (ValueError, KeyError, TypeError) as e:  # pyarrow.ArrowInvalid is a ValueError
            # Versions are written whole and never replaced, so this is not a race: a newer writer, or damage.
            raise TFRecordError(f"the dataset's list of committed files is unreadable ({e}); upgrade ray_tfrecord "
                                "if a newer one wrote it, else restore this object from the store's versioning or "
                                "a backup", path=path) from None

    def paths(self, root: str) -> set[str]:
        return {posixpath.join(root, e.rel_path) for e in self.entries}


def version_path(root: str, version: int) -> str:
    return posixpath.join(root, f"{LOG_PREFIX}{version:0{_DIGITS}d}.json")


def list_versions(fs: pafs.FileSystem, root: str) -> list[int]:
    """The versions in the dataset's log, ascending (one listing of the root; none without a log)."""
    return sorted(versions_listed(fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))).values())


def versions_listed(entries: list[pafs.FileInfo]) -> dict[str, int]:
    """The log's versions among listed ``entries``, by path."""
    return {e.path: int(m.group(1)) for e in entries if e.is_file
            and (m := _VERSION_NAME.fullmatch(posixpath.basename(e.path)))}


def read_version(fs: pafs.FileSystem, root: str, version: int) -> Manifest:
    """Version ``version`` of the dataset at ``root``; ``FileNotFoundError`` when vacuumed."""
    return _read(fs, version_path(root, version))


def read_manifest(fs: pafs.FileSystem, root: str, *, name: str | None = None) -> Manifest | None:
    """The dataset at ``root``: its latest version, or the manifest of a dataset from before the log;
    ``None`` if it has neither. ``name``: a checkpointed task's record of its files instead, in the same form."""
    if name is None:
        for _ in range(_RELISTS):
            versions = list_versions(fs, root)
            if not versions:
                break
            try:
                return read_version(fs, root, versions[-1])
            except FileNotFoundError:
                # Expired between the listing and the read: a version goes only once a later one is committed,
                # so the next listing finds that one.
                continue
        else:
            raise TFRecordError(f"the dataset's latest version was expired by newer commits {_RELISTS} times while "
                                "this read listed the log; read it again", path=root)
        name = MANIFEST_FILE
    try:
        return _read(fs, posixpath.join(root, name))
    except FileNotFoundError:
        return None


def _read(fs: pafs.FileSystem, path: str) -> Manifest:
    with fs.open_input_stream(path, compression=None) as f:
        data = f.read()
    return Manifest.from_bytes(data, path=path)


def write_manifest(fs: pafs.FileSystem, root: str, manifest: Manifest, *, name: str) -> None:
    """Write a record of files that only its writer replaces (a checkpointed task's ``<base>.files``)."""
    with fs.open_output_stream(posixpath.join(root, name), compression=None) as f:
        f.write(manifest.to_bytes())


def removed_by(fs: pafs.FileSystem, root: str, rel_path: str) -> CommitInfo | None:
    """The commit that removed ``rel_path`` from the dataset, if its version is still in the log (one read per
    version: for an error message only)."""
    for version in list_versions(fs, root):
        try:
            commit = read_version(fs, root, version).commit
        except FileNotFoundError:  # vacuumed meanwhile
            continue
        if commit is not None and rel_path in commit.removed:
            return commit
    return None


def missing_file_error(fs: pafs.FileSystem, path: str) -> TFRecordError:
    """What to tell a reader that planned to read ``path`` and found it gone."""
    root = dataset_root(path)
    rel = posixpath.relpath(path, root)
    commit = removed_by(fs, root, rel)
    if commit is not None:
        when = "at that commit" if commit.keep_replaced == 0 else f"{commit.keep_replaced:g} s after it"
        return TFRecordError(f"this read was planned against an earlier version of the dataset; {commit.describe()} "
                             f"replaced this file, and it was deleted {when} (that write's keep_replaced_files="
                             f"{commit.keep_replaced:g}); read the dataset again, or give the writer "
                             "keep_replaced_files=<seconds a read takes> where reads run while the dataset is "
                             "overwritten: replaced files then stay that long for reads already planned", path=path)
    return TFRecordError("the file is gone, and no commit still in the dataset's log removed it: either a commit "
                         "replaced it and its version has expired since (the log keeps a version as long as its "
                         "write's keep_replaced_files keeps the files it replaced, then the next commit deletes "
                         "both), or something other than ray_tfrecord deleted it; read the dataset again, and if "
                         "its latest version still lists the file, restore it (the store's object versioning, a "
                         "backup); where reads run while the dataset is overwritten, give the writer "
                         "keep_replaced_files=<seconds a read takes>", path=path)


@contextlib.contextmanager
def explain_missing(fs: pafs.FileSystem, path: str) -> Iterator[None]:
    """Opening ``path`` inside, a missing file raises ``missing_file_error`` (pyarrow's GCS raises a bare
    ``OSError`` reading ``google::cloud::Status(NOT_FOUND ...)``, naming no file)."""
    try:
        yield
    except OSError as e:
        if isinstance(e, FileNotFoundError) or "NOT_FOUND" in str(e):
            raise missing_file_error(fs, path) from None
        raise
