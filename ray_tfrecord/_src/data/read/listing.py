"""Listing a TFRecord dataset: which files, how large, in which partition.

Paths (strings or path-like objects) are resolved like every Ray reader's; directories are
listed recursively with one ``FileSelector`` call each and sorted. Files or directories whose
name starts with ``.`` or ``_`` are skipped at any depth (Hadoop convention: ``_SUCCESS``,
``.crc`` files and this package's ``_index.*`` sidecars). What other writers leave in a directory
is sorted out by ``ray_tfrecord._src.data.read.foreign``: another job's staging output (``_temporary/``,
``beam-temp-*/`` ...) is skipped with a warning, known sidecars (index files, TFDS metadata) are
left out with a log line, and a file named and shaped like something else stops the listing.
``partition_filter`` and ``file_extensions`` are then applied, so a pruned file is never
opened. TFDS shards get a ``split`` partition column.

Under a dataset root that holds a log (``ray_tfrecord._src.core.manifest``; or the manifest of a dataset
from before it), only the files of its latest version are read, read once: the read is planned against
that one version, so what a write in flight or killed put there is not read, nor what a later commit adds;
what it replaced stays for the writer's ``keep_replaced_files``. A directory read at its root also gets the
listed files that its listing missed (committed after the listing), so a committed file is never skipped.

A path that does not exist as written but holds a glob character is a Hadoop glob
(``ray_tfrecord._src.data.read.globs``). It is walked from its base directory (the components before the
first wildcard), listing one level per wildcard component, only in directories that matched so
far: on S3 a glob lists its prefix, never the bucket. A matched directory is read recursively,
like a directory path. The glob's dataset root is its base directory less trailing
``key=value`` directories: its files' partition values are read below it, and the schema
``write_tfrecords`` recorded there is found.

Example::

    >>> from ray_tfrecord._src.data.read.listing import list_files
    >>> listing = list_files("/data/spark_output")  # doctest: +SKIP
    >>> listing.files[0]  # doctest: +SKIP
    DataFile(path='/data/spark_output/year=2021/part-00000.tfrecord', size=52311,
             partitions=(('year', 2021),), has_index=False)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
from ray.data.datasource import Partitioning, PartitionStyle, PathPartitionFilter

from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.index import dataset_root, index_candidates, is_index_path
from ray_tfrecord._src.core.layout import MANIFEST_FILE, is_hidden
from ray_tfrecord._src.core.manifest import (
    Entry,
    Manifest,
    missing_file_error,
    read_manifest,
    read_version,
    versions_listed,
)
from ray_tfrecord._src.data import compat, filesystems
from ray_tfrecord._src.data.partitioning import PartitionValues, parse_partitions
from ray_tfrecord._src.data.read import foreign
from ray_tfrecord._src.data.read.globs import Component, Glob, is_glob, parse_glob

# Directories listed at once (each listing is a round trip on an object store).
_LIST_THREADS = 16


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset."""

    path: str
    size: int
    partitions: PartitionValues  # ((column, typed value), ...); empty when unpartitioned
    # Whether the listing saw an index sidecar of the file: known for files found by listing
    # the directory that holds their sidecars, None otherwise (a file named directly, or a
    # partition directory read on its own: its sidecars are at the dataset root).
    has_index: bool | None = None
    index: bytes | None = None  # the RecordIndex a manifest holds for it (object stores: no sidecar)
    rows: int | None = None  # its records, as the manifest that lists it says (None: not known)


@dataclass(frozen=True)
class Listing:
    """The files of a dataset and what they were found with."""

    files: list[DataFile]
    partition_schema: pa.Schema  # the partition columns, typed from every file's values
    filesystem: pafs.FileSystem  # resolved from the paths, retrying transient errors
    # The dataset roots, each once: a file or directory path as given (resolved), a glob's
    # base directory less trailing ``key=value`` directories.
    roots: list[str]
    # The version of each dataset root (with a log) that ``files`` are of, less its file list: its number,
    # commit and schema (``read_stored_schema(..., version=)``).
    versions: dict[str, Manifest] = field(default_factory=dict)

    def version_of(self, root: str) -> Manifest | None:
        """The version planned for the dataset at ``root``; None when it has no log."""
        return self.versions.get(root.rstrip("/"))


def list_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    filesystem: pafs.FileSystem | None = None,
    file_extensions: list[str] | None = None,
    ignore_missing_paths: bool = False,
    partitioning: Partitioning | None = Partitioning(PartitionStyle.HIVE),
    partition_filter: PathPartitionFilter | None = None,
) -> Listing:
    """List the visible files under ``paths``: files, directories (read recursively) and
    Hadoop globs (``ray_tfrecord._src.data.read.globs``). A file matched by several paths is listed once.

    Raises ``TFRecordError`` for a malformed glob; ``FileNotFoundError`` for a missing
    path and ``TFRecordError`` for a glob that matches no file, unless
    ``ignore_missing_paths``; ``ValueError`` when no file is left to read.
    """
    given, fs = _resolve(paths, filesystem)
    fs = compat.retrying_filesystem(fs)
    seen = _Seen()
    found, roots = _expand(given, fs, ignore_missing_paths, seen)
    found, committed, versions = _committed(found, fs, seen)
    foreign.warn_staging(seen.staged, set(versions))
    if not found:
        raise ValueError(
            f"No TFRecord files found under {roots}. Note that names starting "
            "with '.' or '_' are skipped."
        )
    if partition_filter is not None:
        keep = set(partition_filter([f.path for f in found]))
        found = [f for f in found if f.path in keep]
        if not found:
            raise ValueError(
                "No input files left after applying 'partition_filter'. "
                "Please double check that it is set properly."
            )
    if file_extensions is not None:
        found = [f for f in found if compat.has_file_extension(f.path, file_extensions)]
        if not found:
            raise ValueError(f"No input files found with the file extensions {file_extensions}.")
    # Last, so that what the caller's filters leave out is never opened.
    sidecars = foreign.screen([f.path for f in found if f.listed], fs, [f.path for f in found])
    if sidecars:
        found = [f for f in found if f.path not in sidecars]
        if not found:
            raise ValueError(f"No TFRecord files found under {roots}, only index or metadata files.")
    # A glob's files are partitioned below its dataset root, unless the caller set a base_dir.
    below_root = partitioning is not None and not partitioning.base_dir
    partition_schema, partitions = parse_partitions(
        [_below(f.path, f.root) if below_root else f.path for f in found], partitioning
    )
    splits = foreign.tfds_splits([f.path for f in found], fs, roots)  # raises for several TFDS versions
    if splits and partitioning is not None and _SPLIT not in partition_schema.names:
        partition_schema = partition_schema.append(pa.field(_SPLIT, pa.string()))
        partitions = [parts + ((_SPLIT, splits.get(f.path)),) for f, parts in zip(found, partitions)]
    files = [DataFile(f.path, f.size, parts, f.has_index, *_known(committed.get(f.path), f.size))
             for f, parts in zip(found, partitions)]
    return Listing(files, partition_schema, fs, roots, versions)


# The partition column of a TFDS shard's split (train, test, ...).
_SPLIT = "split"


def _resolve(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
             filesystem: pafs.FileSystem | None) -> tuple[list[str], pafs.FileSystem]:
    """Ray's path resolution, less one loss: it parses paths as URLs, and a "?" ending a path (an
    empty URL query) is dropped, which in a glob is a wildcard."""
    raw = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    resolved, fs = filesystems.resolve_paths(raw, filesystem)
    if len(resolved) == len(raw):  # else Ray skipped a path it could not resolve, and warned
        resolved = [r + "?" if p.endswith("?") and not r.endswith("?") else r for p, r in zip(raw, resolved)]
    return resolved, fs


class _Found(NamedTuple):
    path: str
    size: int
    has_index: bool | None
    root: str | None  # the directory the partition values are read below; None: the whole path
    listed: bool  # found by listing a directory, not named by the caller


def _expand(paths: list[str], fs: pafs.FileSystem, ignore_missing: bool,
            seen: _Seen) -> tuple[list[_Found], list[str]]:
    """The files each path names, in the order of the paths (sorted within a directory or a
    glob), each once; and the dataset roots."""
    found: dict[str, tuple[int, bool, str | None]] = {}  # path: (size, listed, partition root)
    roots: list[str] = []
    for path, info in zip(paths, fs.get_file_info(paths)):
        # A path that exists as written is literal, even with glob characters in its name.
        if info.type == pafs.FileType.NotFound and is_glob(path):
            glob = parse_glob(path)
            matches = _glob_files(glob, fs, seen)
            if not matches and not ignore_missing:
                raise _no_match(glob, fs)
            # A relative glob starting with a wildcard: its root is the current directory.
            root = dataset_root(posixpath.join(glob.base, "")) or _current(fs)
            roots.append(root)
            for p, size in matches:
                found.setdefault(p, (size, True, root))
        elif info.type == pafs.FileType.File:
            roots.append(path)
            found.setdefault(path, (info.size, False, None))
        elif info.type == pafs.FileType.Directory:
            roots.append(path)
            for p, size in _visible_files(path, _list(fs, [path], seen, recursive=True)[0], seen):
                found.setdefault(p, (size, True, None))
        elif not ignore_missing:
            raise FileNotFoundError(f"No such file or directory: {path}")
        else:
            roots.append(path)
    files = [_Found(p, size, seen.has_index(p) if listed else None, root, listed)
             for p, (size, listed, root) in found.items()]
    return files, list(dict.fromkeys(roots))


def _glob_files(glob: Glob, fs: pafs.FileSystem, seen: _Seen) -> list[tuple[str, int]]:
    """``(path, size)`` of the files ``glob`` matches and of the visible files under the
    directories it matches, sorted."""
    matched = [info for branch in glob.branches for info in _walk(branch, fs, seen)]
    matched = [info for info in matched if not seen.staging(_below(info.path, glob.base), info)]
    files = {info.path: info.size for info in matched if info.is_file}
    directories = sorted({info.path for info in matched if info.type == pafs.FileType.Directory})
    for directory, entries in zip(directories, _list(fs, directories, seen, recursive=True)):
        files.update(_visible_files(directory, entries, seen))
    return sorted(files.items())


def _walk(components: tuple[Component, ...], fs: pafs.FileSystem, seen: _Seen) -> list[pafs.FileInfo]:
    """What the component patterns match, walking down from their literal prefix: each
    pattern lists the directories the components before it matched, one level each."""
    start: list[str] = []  # the literal prefix
    for c in components:
        if not isinstance(c, str):
            break
        start.append(c)
    literal = len(start)
    frontier = ["/" + "/".join(start[1:]) if start[:1] == [""] else "/".join(start)]
    matched: list[pafs.FileInfo] | None = None
    for k in range(literal, len(components)):
        component = components[k]
        if isinstance(component, str):
            frontier, matched = [_child(d, component) for d in frontier], None
            continue
        last = k == len(components) - 1
        matched = [
            e for entries in _list(fs, frontier, seen, recursive=False) for e in entries
            if component.fullmatch(_name(e.path)) and (last or e.type == pafs.FileType.Directory)
        ]
        frontier = [e.path for e in matched]
    if matched is None:  # the pattern ends with literal components: look them up
        matched = [i for i in fs.get_file_info(frontier) if i.type != pafs.FileType.NotFound]
    return matched


def _list(fs: pafs.FileSystem, directories: list[str], seen: _Seen, *, recursive: bool) -> list[list[pafs.FileInfo]]:
    """The entries of each directory (a missing one has none), listed concurrently: on an
    object store each listing is a round trip."""

    def entries(directory: str) -> list[pafs.FileInfo]:
        where = directory or _current(fs)
        try:
            found = fs.get_file_info(pafs.FileSelector(where, recursive=recursive, allow_not_found=True))
        except NotADirectoryError:  # a file named by a literal component that a glob continues below
            return []
        if where != directory:  # "./x" is "x", as the relative glob's other paths are written
            found = [pafs.FileInfo(e.path[2:], e.type, size=e.size) for e in found]
        return found

    if len(directories) <= 1:
        listed = [entries(d) for d in directories]
    else:
        with ThreadPoolExecutor(min(len(directories), _LIST_THREADS)) as pool:
            listed = list(pool.map(entries, directories))
    for directory, found in zip(directories, listed):
        seen.record(directory, found, recursive=recursive)
    return listed


class _Seen:
    """The directories whose listings were seen, and the index sidecars in them: whether a
    file has a sidecar is then known without another request. Also the staging output skipped."""

    def __init__(self) -> None:
        self._sidecars: set[str] = set()
        self._directories: set[str] = set()  # listed one level
        self._trees: set[str] = set()  # listed recursively
        self.staged: dict[str, str] = {}  # staging directory or file: the tool that stages there
        self.manifests: set[str] = set()  # directories seen to hold a manifest
        self.latest: dict[str, int] = {}  # the highest version of the log each listing showed, by root
        self.given: set[str] = set()  # directories listed whole (a directory path, or one a glob matched)

    def staging(self, relative: str, entry: pafs.FileInfo) -> bool:
        """Whether ``entry`` (at ``relative`` below the path read) is staging output; noted if so."""
        found = foreign.staging_tool(relative)
        if found is not None:
            self.staged.setdefault(entry.path[:len(entry.path) - len(relative)] + found[0], found[1])
        return found is not None

    def record(self, directory: str, entries: list[pafs.FileInfo], *, recursive: bool) -> None:
        (self._trees if recursive else self._directories).add(directory.rstrip("/") or directory)
        self._sidecars.update(e.path for e in entries if e.is_file and is_index_path(e.path))
        self.manifests.update(posixpath.dirname(e.path) for e in entries
                              if e.is_file and posixpath.basename(e.path) == MANIFEST_FILE)
        for path, version in versions_listed(entries).items():
            root = posixpath.dirname(path)
            self.manifests.add(root)
            self.latest[root] = max(version, self.latest.get(root, 0))
        if recursive:
            self.given.add(directory.rstrip("/") or directory)

    def has_index(self, path: str) -> bool | None:
        """True or False when the listings show it, None when a sidecar could sit in a
        directory that was not listed (a dataset root above the paths given)."""
        candidates = index_candidates(path)
        if any(c in self._sidecars for c in candidates):
            return True
        return False if all(self._covers(posixpath.dirname(c)) for c in candidates) else None

    def covers(self, directory: str) -> bool:
        """Whether a listing seen shows ``directory``'s own entries."""
        return self._covers(directory)

    def _covers(self, directory: str) -> bool:
        if directory in self._directories:
            return True
        while directory not in self._trees:
            parent = posixpath.dirname(directory)
            if parent == directory:
                return False
            directory = parent
        return True


def _seen_manifest(fs: pafs.FileSystem, root: str, seen: _Seen) -> Manifest | None:
    """The manifest of a root whose listing was seen: the latest version that listing showed, read without
    listing the root again (or, expired by newer commits since, the log's latest)."""
    if root in seen.latest:
        with contextlib.suppress(FileNotFoundError):
            return read_version(fs, root, seen.latest[root])
    return read_manifest(fs, root)


def _committed(found: list[_Found], fs: pafs.FileSystem,
               seen: _Seen) -> tuple[list[_Found], dict[str, Entry], dict[str, Manifest]]:
    """``found`` less the listed files that the manifest of their dataset root does not list (plus those it
    lists that a whole listing of the root missed), its entries, by path, and the manifest of each root that
    holds one, less its entries."""
    roots = sorted({dataset_root(f.path) for f in found if f.listed} | (seen.given & seen.manifests))
    unseen = [r for r in roots if not seen.covers(r)]
    with ThreadPoolExecutor(max(1, min(len(unseen), _LIST_THREADS))) as pool:
        fetched = dict(zip(unseen, pool.map(lambda r: read_manifest(fs, r), unseen)))
    manifests = {r: fetched[r] if r in fetched else _seen_manifest(fs, r, seen) if r in seen.manifests else None
                 for r in roots}
    if not any(m is not None for m in manifests.values()):
        return found, {}, {}
    committed: dict[str, Entry] = {}
    for root, m in manifests.items():
        for e in m.entries if m is not None else ():
            committed[posixpath.join(root, e.rel_path)] = e
    kept = [f._replace(has_index=True) if f.path in committed and committed[f.path].index is not None else f
            for f in found if not f.listed or f.path in committed or manifests.get(dataset_root(f.path)) is None]
    have = {f.path for f in kept}
    unlisted = [p for p in sorted(committed) if p not in have and dataset_root(p) in seen.given]
    infos = fs.get_file_info(unlisted) if unlisted else []
    gone = [i.path for i in infos if i.type == pafs.FileType.NotFound]
    if gone:
        cause = missing_file_error(fs, gone[0])
        raise TFRecordError(f"the dataset's latest version lists this file ({len(gone)} of {len(committed)} listed "
                            f"files are gone): {cause.reason}", path=gone[0])
    kept += [_Found(i.path, i.size, committed[i.path].index is not None, None, True) for i in infos]
    return kept, committed, {r.rstrip("/"): dataclasses.replace(m, entries=[]) for r, m in manifests.items()
                             if m is not None}


def _known(entry: Entry | None, size: int) -> tuple[bytes | None, int | None]:
    """The index and row count the manifest gives a file, where it lists the file at the size found."""
    if entry is None:
        return None, None
    return entry.index, entry.rows if entry.size == size else None


def _visible_files(directory: str, entries: list[pafs.FileInfo], seen: _Seen) -> list[tuple[str, int]]:
    base = directory.rstrip("/") + "/"
    return sorted(
        (e.path, e.size)
        for e in entries
        if e.is_file and not seen.staging(relative := e.path[len(base):] if e.path.startswith(base) else e.path, e)
        and not is_hidden(relative)
    )




def _no_match(glob: Glob, fs: pafs.FileSystem) -> TFRecordError:
    base = glob.base or "."
    exists = fs.get_file_info(base).type == pafs.FileType.Directory
    where = f"listed {base.rstrip('/')}/" if exists else f"{base.rstrip('/')}/ does not exist"
    return TFRecordError(
        f"no file matches this glob ({where}); check the pattern, or pass ignore_missing_paths=True to skip it",
        path=glob.pattern,
    )


def _current(fs: pafs.FileSystem) -> str:
    """The current directory: pyarrow's local filesystem cannot list or join "", others
    (a ``SubTreeFileSystem``) take "" as their root."""
    return "." if compat.unwrap_filesystem(fs).type_name == "local" else ""


def _child(directory: str, name: str) -> str:
    return f"{directory}{name}" if directory.endswith("/") or not directory else f"{directory}/{name}"


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _below(path: str, root: str | None) -> str:
    """``path`` relative to ``root`` (``path`` itself when ``root`` is None or "")."""
    if not root:
        return path
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path
