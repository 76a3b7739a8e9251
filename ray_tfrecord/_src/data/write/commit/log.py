"""Committing a version to the dataset's log (``ray_tfrecord._src.core.manifest``) against other writers,
and expiring what replaced versions left.

A write commits by creating ``_tfrecord_log.<n + 1>.json`` where ``n`` is the latest version, if absent
(``stores.create_if_absent``). A writer that loses the race for ``n + 1`` lists the log again and rebases
its change on the version that won: an append adds its files to it; an overwrite removes the files of the
latest version in the partitions it replaces (all, or those it wrote), so the outcome is that of the two
commits in their log order, whatever ran when. Only a write that wants no dataset there (``mode="error"``
or ``"ignore"``) can lose for good: another write created one meanwhile; and an append whose column types
contradict those an append committed meanwhile, as it would have been refused after it.

The schema is rebased too (``_schema_after``): a version states the schema of the files it lists, merged from
the version before (where it keeps any of its files) and what the write wrote, so that two appends adding
different columns both keep theirs, and a partition overwrite keeps the columns of the partitions it left.

Replaced files stay the replacing write's ``keep_replaced_files`` seconds (recorded in its version), for
readers that planned against an earlier version; with 0, the default, the write deletes them right after its
commit (``delete_replaced``). Each commit (and ``ray-tfrecord clean``) deletes the files kept longer than that,
and the log's versions older than ``LOG_KEEP_S`` (and than the files they kept), except the latest.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.core.index import index_candidates
from ray_tfrecord._src.core.layout import MANIFEST_FILE
from ray_tfrecord._src.core.manifest import (
    CommitInfo,
    ConflictError,
    Entry,
    Manifest,
    list_versions,
    read_manifest,
    read_version,
    version_path,
    versions_listed,
)
from ray_tfrecord._src.core.schema import merge_recorded, read_stored_schema
from ray_tfrecord._src.data.write.commit.stores import create_if_absent
from ray_tfrecord._src.data.write.dataset_files import listed_entries, parallel, remove_empty_dirs

logger = logging.getLogger(__name__)

# Tries for the next version; each lost try means another write committed, so only a writer outrun this many
# times in a row gives up. The wait between tries grows to _MAX_WAIT_S, jittered so that losers spread out.
_ATTEMPTS = 200
_MAX_WAIT_S = 2.0
#: How long a version of the log stays at least, whatever ``keep_replaced_files`` says. A writer that listed the
#: log (finding n the latest) creates n + 1 within half of it, or lists again (``commit``): it must never re-create
#: a number another write committed and a later commit expired meanwhile, a version no reader would read.
LOG_KEEP_S = 600.0


@dataclass(frozen=True)
class Change:
    """What one write commits."""

    mode: str
    write_id: str
    added: Sequence[Entry]
    # What it replaces in the latest version: None, every file; else the files under these partition
    # directories ("" for files at the root); () for an append.
    replaces: tuple[str, ...] | None
    must_be_first: bool = False  # mode="error"/"ignore": there must be no dataset when it commits
    keep_replaced: float = 0.0  # seconds what it replaces stays for reads planned before (keep_replaced_files)
    schemas: Sequence[pa.Schema] = ()  # the record schemas its writers wrote


@dataclass(frozen=True)
class Committed:
    version: Manifest
    retries: int  # tries lost to other writers


def commit(fs: pafs.FileSystem, store: pafs.FileSystem, root: str, change: Change) -> Committed:
    """Commit ``change`` as the next version of the dataset at ``root``. ``fs`` reads (possibly Ray's
    retrying wrapper), ``store`` is what it wraps (its type picks the precondition). Raises ``ConflictError``
    when ``change.must_be_first`` and another write committed a dataset first."""
    for attempt in range(_ATTEMPTS):
        listed_at = time.monotonic()
        latest = read_manifest(fs, root)
        if latest is None:  # the first version: the files written before the log (none for a new dataset)
            latest = Manifest(listed_entries(fs, root))
        ours = {e.rel_path for e in change.added}  # renamed into place already, before the first version
        if change.must_be_first and any(e.rel_path not in ours for e in latest.entries):
            raise ConflictError(
                f"another write created this dataset while this {change.mode!r} write ran: "
                f"{_described(latest)}; nothing of this write is visible. Write again with mode='append' or "
                "mode='overwrite' to write there anyway", path=root, other=latest.commit)
        version = _rebased(change, latest, fs, root)
        if time.monotonic() - listed_at > LOG_KEEP_S / 2:
            continue  # stalled: n + 1 may have been committed and expired since the listing
        if create_if_absent(store, version_path(root, version.version), version.to_bytes()):
            if latest.commit is None and latest.entries:
                # The dataset moved to the log: a manifest left beside it would be stale for readers of before.
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(posixpath.join(root, MANIFEST_FILE))
            return Committed(version, attempt)
        time.sleep(random.uniform(0, min(_MAX_WAIT_S, 0.01 * 2 ** min(attempt, 8))))
    raise ConflictError(f"this write lost the race for the dataset's next version {_ATTEMPTS} times in a row to other "
                        "writes; nothing of it is visible. Write again, or give fewer writes the same path at once",
                        path=root)


def _described(version: Manifest) -> str:
    return version.commit.describe() if version.commit is not None else "files written there before"


def _rebased(change: Change, latest: Manifest, fs: pafs.FileSystem, root: str) -> Manifest:
    ours = {e.rel_path for e in change.added}
    removed = [e.rel_path for e in latest.entries if e.rel_path not in ours and _replaced(change.replaces, e.rel_path)]
    gone = set(removed) | ours
    kept = [e for e in latest.entries if e.rel_path not in gone]
    info = CommitInfo(latest.version + 1, change.mode, time.time(), change.write_id, change.replaces, tuple(removed),
                      change.keep_replaced)
    schema = _schema_after(change, latest, bool(kept), fs, root)
    return Manifest(kept + list(change.added), info, schema, states_schema=True)


def _schema_after(change: Change, latest: Manifest, keeps_files: bool, fs: pafs.FileSystem,
                  root: str) -> pa.Schema | None:
    """The schema of the version ``change`` makes of ``latest``: what it wrote, merged into ``latest``'s where
    it keeps files of it; None where no schema holds for them all (kept files of no recorded schema, or a column
    of two types after a partition overwrite: readers then infer it). Raises ``ConflictError`` for an append whose
    types contradict ``latest``'s, which an append started after that commit would have been refused for."""
    merged = None
    if keeps_files:
        merged = read_stored_schema(fs, root, version=latest)  # a version from before the log: the file
        if merged is None:
            return None
    try:
        for schema in change.schemas:
            merged = schema if merged is None else merge_recorded(merged, schema, path=root)
    except SchemaError as e:
        if change.replaces == () and latest.commit is not None:
            column = f"column {e.column!r}: " if e.column is not None else ""
            raise ConflictError(f"{column}{e.reason}; {_described(latest)} committed it so while this append ran, "
                                "and nothing of this append is visible", path=root, other=latest.commit) from None
        return None
    return merged


def _replaced(replaces: tuple[str, ...] | None, rel_path: str) -> bool:
    if replaces is None:
        return True
    return posixpath.dirname(rel_path) in replaces


def partitions_of(rel_paths: Iterable[str]) -> tuple[str, ...]:
    """The partition directories (below the root; "" for the root) that files at ``rel_paths`` are in."""
    return tuple(sorted({posixpath.dirname(p) for p in rel_paths}))


def expire(fs: pafs.FileSystem, root: str, keep: float, *, local: bool, now: float | None = None) -> list[str]:
    """Delete the files that commits older than ``keep`` and their own ``keep_replaced`` (when positive: with 0
    the commit deleted them itself) replaced, with their sidecars and, on a filesystem with directories,
    ``local``, the partition directories left empty; then those versions of the log, if older than
    ``LOG_KEEP_S``, never the latest. Returns the data files deleted. Only versions older than both are read (the
    listing's times tell them apart), each about once: a commit reads none, or the few that came of age."""
    now = time.time() if now is None else now
    entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    by_version = {v: e for e in entries for path, v in versions_listed([e]).items()}
    versions = sorted(by_version)
    ages = {v: _age(by_version[v], now) for v in versions}
    old = [v for v in versions[:-1] if ages[v] >= max(keep, LOG_KEEP_S)]
    if not old:
        return []
    commits = parallel(lambda v: _commit_of(fs, root, v), old)
    due = [(v, c) for v, c in zip(old, commits) if c is None or ages[v] >= c.keep_replaced]
    removed = {posixpath.join(root, p) for _, c in due if c is not None and c.keep_replaced > 0 for p in c.removed}
    files = sorted(removed - read_version(fs, root, versions[-1]).paths(root)) if removed else []
    _delete_files(fs, root, files, local=local)
    delete_quietly(fs, [version_path(root, v) for v, _ in due])
    return files


def delete_replaced(fs: pafs.FileSystem, root: str, version: Manifest, *, local: bool) -> None:
    """Right after ``version`` committed, delete the files it replaced (``keep_replaced_files=0``)."""
    if version.commit is not None:
        _delete_files(fs, root, sorted(posixpath.join(root, p) for p in version.commit.removed), local=local)


def _delete_files(fs: pafs.FileSystem, root: str, files: Sequence[str], *, local: bool) -> None:
    # Sidecars exist where files are renamed into place; on an object store the version holds the index.
    delete_quietly(fs, [*files, *(c for p in files if local for c in index_candidates(p))])
    if local and files:
        remove_empty_dirs(fs, root, {posixpath.dirname(p) for p in files})


def _commit_of(fs: pafs.FileSystem, root: str, version: int) -> CommitInfo | None:
    """Version ``version``'s commit; ``None`` when it has none, or another writer expired it meanwhile."""
    with contextlib.suppress(FileNotFoundError):
        return read_version(fs, root, version).commit
    return None


def replaced_recently(fs: pafs.FileSystem, root: str, keep: float, now: float | None = None) -> set[str]:
    """The files that commits within the last ``keep`` seconds, or within their own ``keep_replaced``, replaced:
    readers may still be reading them."""
    now = time.time() if now is None else now
    versions = list_versions(fs, root)
    infos = _version_infos(fs, root) if versions else {}
    found: set[str] = set()
    for v, commit in zip(versions, parallel(lambda v: _commit_of(fs, root, v), versions)):
        if commit is not None and _age(infos.get(version_path(root, v)), now) <= max(keep, commit.keep_replaced):
            found.update(posixpath.join(root, p) for p in commit.removed)
    return found


def _version_infos(fs: pafs.FileSystem, root: str) -> dict[str, pafs.FileInfo]:
    listed = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    versions = versions_listed(listed)
    return {e.path: e for e in listed if e.path in versions}


def _age(info: pafs.FileInfo | None, now: float) -> float:
    if info is None or info.mtime is None:
        return 0.0  # unknown: keep it
    return now - info.mtime.timestamp()


def delete_quietly(fs: pafs.FileSystem, paths: Sequence[str]) -> None:
    """Delete ``paths`` in parallel; one already gone (another writer expired it, or it never existed) is fine."""
    def delete(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(path)

    parallel(delete, paths)
