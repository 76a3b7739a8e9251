"""``write_tfrecords(num_files=N)``: exactly N files of balanced rows, named as TFDS, Beam and TFX name shards
(``<prefix>-00003-of-00128.tfrecord``), and the checks of every option that cuts, bundles or names files.

How: ``write_tfrecords`` hands Ray ``ds.repartition(N, shuffle=False)``, whose split (Ray 2.50 to 2.60) cuts the
rows at ``int(k * rows / N)``: N blocks of ``rows // N`` or one more row, in the object store, never on the driver.
Ray's write operator runs one task per block, numbered in order (``ctx.task_idx``), and each task writes its
block as shard ``task_idx``: one file (one per partition directory). What Ray does not promise is checked on the
driver before the commit (``complete``): every shard index below N, and their rows within one of even. Ray
runs no task for some empty blocks (2.60 bundles them into one task, and an empty dataset may run none), so
``complete`` writes the shards no task wrote as empty files: N files always, as Beam writes a fixed shard count.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from typing import Any

from ray.data.datasource import FilenameProvider

from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.layout import is_hidden_name
from ray_tfrecord._src.data.write.commit import Commit, StagedFile
from ray_tfrecord._src.data.write.dataset_files import listed_entries
from ray_tfrecord._src.data.write.writers import UNEVEN, WriteConfig, shard_name, task_past_shards, write_empty

#: The default prefix's length of the write id: names stay short, and no two writes' names meet (an append of a
#: name that exists is refused by the commit before any file moves).
_ID_CHARS = 8


def default_prefix(write_id: str) -> str:
    """``part-<8 hex of the write id>``: a name no other write's files take, so that an overwrite or an append
    replaces no file in place before its commit (a reader of the version before would read the new bytes)."""
    return f"part-{write_id[:_ID_CHARS]}"


def check_file_options(*, num_files: int | None, file_prefix: str | None, min_rows_per_file: int | None,
                       max_rows_per_file: int | None, target_file_size: int | None,
                       filename_provider: FilenameProvider | None) -> None:
    """Refuse the options that cut, bundle and name files where they are wrong or contradict each other:
    ``num_files`` beside any of the others (they would cut, bundle or name files otherwise), and a
    ``file_prefix`` without it or that names no visible file."""
    sizes = {"min_rows_per_file": min_rows_per_file, "max_rows_per_file": max_rows_per_file,
             "target_file_size": target_file_size}
    for name, value in sizes.items():
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if min_rows_per_file is not None and max_rows_per_file is not None and min_rows_per_file > max_rows_per_file:
        raise ValueError(f"min_rows_per_file ({min_rows_per_file}) must not exceed max_rows_per_file "
                         f"({max_rows_per_file})")
    if filename_provider is not None and not isinstance(filename_provider, FilenameProvider):
        raise TypeError(f"filename_provider must be a ray.data.datasource.FilenameProvider, got "
                        f"{type(filename_provider).__name__}")
    if num_files is None:
        if file_prefix is not None:
            raise ValueError(f"file_prefix={file_prefix!r} names the files of num_files=N "
                             "(<prefix>-00000-of-0000N); give num_files too, or leave file_prefix out")
        return
    if isinstance(num_files, bool) or not isinstance(num_files, int) or num_files <= 0:
        raise ValueError(f"num_files must be a positive integer, got {num_files!r}")
    given = [name for name, value in {**sizes, "filename_provider": filename_provider}.items() if value is not None]
    if given:
        raise ValueError(f"num_files={num_files} writes exactly {num_files} files of balanced rows, which "
                         f"{' and '.join(given)} would cut, bundle or name otherwise; leave "
                         f"{'them' if len(given) > 1 else 'it'} out, or leave num_files out")
    if file_prefix is not None and (not isinstance(file_prefix, str) or not file_prefix or "/" in file_prefix
                                    or is_hidden_name(file_prefix)):
        raise ValueError(f"file_prefix must be a non-empty string without '/' that does not start with '.' or "
                         f"'_' (readers skip those names), got {file_prefix!r}")


def refuse_taken_names(commit: Commit, prefix: str) -> None:
    """Refuse a caller's ``prefix`` that the files of the dataset ``commit`` writes to already use (``append``,
    ``overwrite``): the write's files would replace them in place before its commit, so a reader of the version
    before, or the dataset left by a write killed then, would hold the new bytes under the old version."""
    fs, path, mode = commit.filesystem, commit.path, commit.mode
    if mode not in ("append", "overwrite"):
        return  # error, ignore: no data there
    shard = re.compile(re.escape(prefix) + r"-\d{5,}-of-\d{5,}")
    taken = sorted(e.rel_path for e in listed_entries(fs, path) if shard.match(posixpath.basename(e.rel_path)))
    if taken:
        raise TFRecordError(f"file_prefix={prefix!r}: the dataset already holds {taken[0]!r}"
                            f"{f' and {len(taken) - 1} more' if len(taken) > 1 else ''}, and mode={mode!r} with "
                            "the same names would replace them in place before the commit; pass a file_prefix of "
                            "this write's own (a date, a run id), or leave file_prefix out (the names then carry "
                            "the write's id)", path=path)


def complete(returns: Sequence[dict[str, Any]], config: WriteConfig) -> list[StagedFile]:
    """The write tasks' files (``returns``: each task's ``files`` and ``shard``, its index); for ``num_files``, its
    shards checked and, without partitions, an empty file for each shard no task wrote. Raises if a shard index
    is out of range or the shards' rows are not within one row of even: the dataset did not reach the sink split
    evenly in N blocks (``ds.write_datasink`` without ``ds.repartition(N)``)."""
    staged: list[StagedFile] = [f for ret in returns for f in ret["files"]]
    count = config.num_files
    if count is None:
        return staged
    rows = [0] * count
    for ret in returns:
        if not 0 <= ret["shard"] < count:  # the task raised already; a check, should Ray number tasks otherwise
            raise task_past_shards(count, ret["shard"], config.path)
        rows[ret["shard"]] += sum(f.rows for f in ret["files"])
    total = sum(rows)
    low, high = total // count, -(-total // count)
    if not all(low <= r <= high for r in rows):
        raise TFRecordError(f"num_files={count}: its shards hold {min(rows)} to {max(rows)} of the {total} rows, "
                            f"where an even split gives {low} or {high}: {UNEVEN.format(count)}", path=config.path)
    if not config.partition_cols:  # a partitioned shard without rows has no directory to be in
        written = {ret["shard"] for ret in returns if ret["files"]}
        staged.extend(write_empty(config, shard_name(config.file_prefix, i, count, config.extension))
                      for i in range(count) if i not in written)
    return staged
