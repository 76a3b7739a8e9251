"""Listing a TFRecord dataset: which files, how large, in which partition.

Paths are resolved like every Ray reader's; directories are listed recursively with one
``FileSelector`` call each and sorted. Files or directories whose name starts with ``.`` or
``_`` are skipped at any depth (Hadoop convention: ``_SUCCESS``, ``_temporary/``, ``.crc``
files and this package's ``_index.*`` sidecars). ``partition_filter`` and
``file_extensions`` are then applied, so a pruned file is never opened.

Example::

    >>> from ray_tfrecord.listing import list_files
    >>> listing = list_files("/data/spark_output")  # doctest: +SKIP
    >>> listing.files[0]  # doctest: +SKIP
    DataFile(path='/data/spark_output/year=2021/part-00000.tfrecord', size=52311,
             partitions=(('year', 2021),), has_index=False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Set, Tuple, Union

import pyarrow as pa
import pyarrow.fs as pafs
from ray.data.datasource import Partitioning, PathPartitionFilter

from ray_tfrecord import _compat
from ray_tfrecord.index import index_candidates, is_index_path
from ray_tfrecord.partitioning import PartitionValues, parse_partitions

__all__ = ["DataFile", "Listing", "list_files"]


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset."""

    path: str
    size: int
    partitions: PartitionValues  # ((column, typed value), ...); empty when unpartitioned
    # Whether the listing saw an index sidecar of the file: known for files found by listing
    # the directory that holds their sidecars, None otherwise (a file named directly, or a
    # partition directory read on its own: its sidecars are at the dataset root).
    has_index: Optional[bool] = None


@dataclass(frozen=True)
class Listing:
    """The files of a dataset and what they were found with."""

    files: List[DataFile]
    partition_schema: pa.Schema  # the partition columns, typed from every file's values
    filesystem: pafs.FileSystem  # resolved from the paths, retrying transient errors
    roots: List[str]  # the paths as given, resolved


def list_files(
    paths: Union[str, List[str]],
    *,
    filesystem: Optional[pafs.FileSystem] = None,
    file_extensions: Optional[List[str]] = None,
    ignore_missing_paths: bool = False,
    partitioning: Optional[Partitioning] = Partitioning("hive"),
    partition_filter: Optional[PathPartitionFilter] = None,
) -> Listing:
    """List the visible files under ``paths`` (files, or directories read recursively).

    Raises ``FileNotFoundError`` for a missing path (unless ``ignore_missing_paths``) and
    ``ValueError`` when no file is left to read.
    """
    roots, fs = _compat.resolve_paths(paths, filesystem)
    fs = _compat.retrying_filesystem(fs)
    found = _expand(roots, fs, ignore_missing_paths)
    if not found:
        raise ValueError(
            f"No TFRecord files found under {roots}. Note that names starting "
            "with '.' or '_' are skipped."
        )
    if partition_filter is not None:
        keep = set(partition_filter([p for p, _, _ in found]))
        found = [f for f in found if f[0] in keep]
        if not found:
            raise ValueError(
                "No input files left after applying 'partition_filter'. "
                "Please double check that it is set properly."
            )
    if file_extensions is not None:
        found = [f for f in found if _compat.has_file_extension(f[0], file_extensions)]
        if not found:
            raise ValueError(f"No input files found with the file extensions {file_extensions}.")
    partition_schema, partitions = parse_partitions([p for p, _, _ in found], partitioning)
    files = [DataFile(p, size, parts, has_index) for (p, size, has_index), parts in zip(found, partitions)]
    return Listing(files, partition_schema, fs, roots)


def _is_hidden(relative_path: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative_path.split("/") if part)


def _has_index(path: str, base: str, sidecars: Set[str]) -> Optional[bool]:
    candidates = index_candidates(path)
    if any(c in sidecars for c in candidates):
        return True
    # A sidecar at a dataset root above the listed directory was not listed.
    return None if any(not c.startswith(base) for c in candidates) else False


def _expand(roots: List[str], fs: pafs.FileSystem, ignore_missing: bool) -> List[Tuple[str, int, Optional[bool]]]:
    """``(path, size, has_index)`` of each named file and each visible file under each named
    directory (sorted per directory)."""
    files: List[Tuple[str, int, Optional[bool]]] = []
    for path, info in zip(roots, fs.get_file_info(roots)):
        if info.type == pafs.FileType.File:
            files.append((path, info.size, None))
        elif info.type == pafs.FileType.Directory:
            base = path.rstrip("/") + "/"
            entries = [e for e in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if e.is_file]
            sidecars = {e.path for e in entries if is_index_path(e.path)}
            visible = sorted(
                (e.path, e.size)
                for e in entries
                if not _is_hidden(e.path[len(base):] if e.path.startswith(base) else e.path)
            )
            files.extend((p, size, _has_index(p, base, sidecars)) for p, size in visible)
        elif not ignore_missing:
            raise FileNotFoundError(f"No such file or directory: {path}")
    return files
