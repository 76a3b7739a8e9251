"""The files of a dataset directory, as a commit sees them: what is there, what a manifest does not list,
and many deleted at once (on an object store each request is a round trip, so they run in parallel)."""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow.fs as pafs

from ray_tfrecord._src.core.index import index_candidates
from ray_tfrecord._src.core.layout import (
    INDEX_PREFIX,
    LOG_PREFIX,
    MANIFEST_FILE,
    SCHEMA_FILE,
    STAGING_DIR,
    SUCCESS_MARKER,
    TFMD_SCHEMA_FILE,
    is_hidden,
)
from ray_tfrecord._src.core.manifest import Entry, Manifest, read_manifest, version_path

_T = TypeVar("_T")
_R = TypeVar("_R")
# Requests in flight at once (each is one round trip on an object store).
_THREADS = 32
#: A checkpointed job's staging directory under ``_temporary/`` starts so (commit.Commit.use_checkpoint).
CHECKPOINT_STAGING = "checkpoint-"
# What a dataset root holds besides data files and sidecars, kept by an object store's commit.
_BOOKKEEPING = {INDEX_PREFIX, MANIFEST_FILE, SCHEMA_FILE, TFMD_SCHEMA_FILE, SUCCESS_MARKER}
# The data files of checkpointed tasks (commit.checkpoint_file_base), as an index sidecar names them.
_CHECKPOINTED_FILE = re.compile(r"part-\d{5,}-[0-9a-f]+-\d+")


def remove_empty_dirs(fs: pafs.FileSystem, root: str, dirs: Iterable[str]) -> None:
    # Deepest first, so a parent emptied by removing its children goes too.
    candidates = set()
    for d in dirs:
        while d.startswith(root + "/"):
            candidates.add(d)
            d = posixpath.dirname(d)
    for d in sorted(candidates, key=lambda p: p.count("/"), reverse=True):
        info = fs.get_file_info(d)
        if info.type == pafs.FileType.Directory and not fs.get_file_info(pafs.FileSelector(d)):
            fs.delete_dir(d)


def listed_entries(fs: pafs.FileSystem, path: str) -> list[Entry]:
    """The visible files under ``path`` as manifest entries (rows and indexes unknown): the first manifest
    of a dataset whose files were written without one."""
    listing = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    prefix = path + "/"
    return [Entry(e.path[len(prefix):], e.size, None) for e in listing
            if e.is_file and not is_hidden(e.path[len(prefix):])]


def unlisted_files(fs: pafs.FileSystem, path: str, manifest: Manifest) -> list[str]:
    """The files under dataset ``path`` that ``manifest`` does not list, nor the sidecar of a file it lists:
    other writes' data files and sidecars (``_temporary/``, the log and the dataset's own bookkeeping are not
    counted)."""
    listed = manifest.paths(path)
    keep = listed | {c for p in listed for c in index_candidates(p)}
    hidden = (posixpath.join(path, STAGING_DIR) + "/", posixpath.join(path, LOG_PREFIX))
    listing = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return [e.path for e in listing if e.is_file and e.path not in keep and not e.path.startswith(hidden)
            and posixpath.relpath(e.path, path) not in _BOOKKEEPING]


def orphans(fs: pafs.FileSystem, path: str, *, kept: frozenset[str] = frozenset()) -> list[str]:
    """What killed or failed writes left in dataset ``path``: files that its latest version does not list (none
    when it has no log or manifest: then every visible file is data), less ``kept`` (replaced files that readers
    may still read), and staging directories, except those of a checkpointed job, whose rerun continues them
    (and the files their records name)."""
    staging = posixpath.join(path, STAGING_DIR)
    entries = fs.get_file_info(pafs.FileSelector(staging, allow_not_found=True))
    jobs = [e.path for e in entries if e.type == pafs.FileType.Directory
            and posixpath.basename(e.path).startswith(CHECKPOINT_STAGING)]
    found = [e.path for e in entries if e.path not in jobs]
    manifest = read_manifest(fs, path)
    if manifest is None:
        return found
    records = [posixpath.basename(e.path) for job in jobs
               for e in fs.get_file_info(pafs.FileSelector(job, allow_not_found=True)) if e.is_file]
    bases = tuple(b.split(".", 1)[0] + "-" for b in records if b.startswith("part-"))
    return found + [p for p in unlisted_files(fs, path, manifest)
                    if p not in kept and not posixpath.basename(p).startswith(bases)]


def remove(fs: pafs.FileSystem, paths: Sequence[str]) -> None:
    """Delete files and directories, the files in parallel. A directory's files go first: on an object store
    a directory is only their common prefix, and GCS's ``delete_dir`` fails on one without a marker object."""
    directories = [e.path for e in fs.get_file_info(list(paths)) if e.type == pafs.FileType.Directory]
    inside = [e.path for d in directories for e in fs.get_file_info(pafs.FileSelector(d, recursive=True))
              if e.is_file]
    parallel(fs.delete_file, [p for p in paths if p not in directories] + inside)
    for d in directories:
        if fs.get_file_info(d).type == pafs.FileType.Directory:
            fs.delete_dir(d)


def parallel(call: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``call`` on each item, a few dozen at a time: on an object store each is a round trip."""
    if len(items) <= 1:
        return [call(i) for i in items]
    with ThreadPoolExecutor(min(len(items), _THREADS)) as pool:
        return list(pool.map(call, items))


def remove_orphan_sidecars(fs: pafs.FileSystem, path: str) -> None:
    """Ray's recovery deletes the files of a task killed before its ids were committed, not their index
    sidecars (whose names start ``_index.``); remove those, and the partition directories left empty."""
    top = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    sidecars = {e.path: urllib.parse.unquote(posixpath.basename(e.path)[len(INDEX_PREFIX):]) for e in top
                if e.is_file and posixpath.basename(e.path).startswith(INDEX_PREFIX)}
    ours = {p: rel for p, rel in sidecars.items() if _CHECKPOINTED_FILE.match(posixpath.basename(rel))}
    if not ours:
        return
    staging = posixpath.join(path, STAGING_DIR) + "/"
    listing = [e for e in fs.get_file_info(pafs.FileSelector(path, recursive=True))
               if not e.path.startswith(staging)]
    present = {posixpath.relpath(e.path, path) for e in listing if e.is_file}
    for sidecar, rel in ours.items():
        if rel not in present:
            fs.delete_file(sidecar)
    remove_empty_dirs(fs, path, {e.path for e in listing if e.type == pafs.FileType.Directory})


def remove_empty_first_version(fs: pafs.FileSystem, path: str, *, local: bool) -> None:
    """After ``orphans`` went: remove an empty ``_temporary`` (on a filesystem with directories, ``local``), and
    the log's empty version 1 when it is all the dataset holds: a killed first write's (``Commit.start`` commits
    it before any file lands). Kept while a checkpointed job's staging remains: its rerun continues there."""
    staging = posixpath.join(path, STAGING_DIR)
    if fs.get_file_info(pafs.FileSelector(staging, allow_not_found=True)):
        return
    if local and fs.get_file_info(staging).type == pafs.FileType.Directory:
        fs.delete_dir(staging)
    entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    first = version_path(path, 1)
    if [e.path for e in entries] == [first] and (m := read_manifest(fs, path)) is not None and not m.entries:
        fs.delete_file(first)
