"""A dataset cut into record-exact splits, for a feed that can stop and resume at any record.

``plan_splits`` lists a dataset's files and cuts each into ``Split`` s of about
``split_bytes``: a byte range that starts on a record boundary, with its exact record count. The
boundaries come from the file's index sidecar (``ray_tfrecord._src.core.index``) when it is current;
an uncompressed file without one is scanned once, in a Ray task, and the index kept for the next
plan (``ray_tfrecord._src.data.feed.indexing``). A GZIP/ZLIB file cannot be cut and is one split, whose
record count also costs a scan the first time: decompressing the whole file, and a resumed or
padded piece of it decompresses the file again up to the piece.

``read_pieces`` reads pieces of splits (``ray_tfrecord._src.data.feed.order``) with the native decoder,
adding a weight column; it runs inside Ray Data tasks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.codec import decode
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.feature_specs import SchemaLike, arrow_schema
from ray_tfrecord._src.core.framing import iter_chunks, open_stream
from ray_tfrecord._src.core.manifest import explain_missing
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.core.schema import read_stored_schema
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.feed.by_reference import StoredTuple
from ray_tfrecord._src.data.feed.indexing import FileIndex, file_indexes
from ray_tfrecord._src.data.feed.order import SEED_COLUMN, Piece, row_order, row_seeds
from ray_tfrecord._src.data.partitioning import PartitionValues
from ray_tfrecord._src.data.read.listing import DataFile, Listing, list_files
from ray_tfrecord._src.data.read.planning import MAX_RANGES_PER_TASK
from ray_tfrecord._src.data.read.read_tasks import PATH_COLUMN, Compression

#: A weighted piece: ``(piece, weight)``.
Weighted = tuple[Piece, float]

#: Bytes per split: the resume granularity is a record, so this only bounds the in-split shuffle
#: buffer (one split decoded) and sets how many Ray tasks an epoch makes.
DEFAULT_SPLIT_BYTES = 8 * sizes.MiB

@dataclass(frozen=True)
class Split:
    """Records ``[start, end)`` of one file by byte offset (``end=None``: the whole, compressed
    file), ``rows`` of them."""

    path: str
    start: int
    end: int | None
    rows: int
    size: int  # bytes on disk: end - start, or the whole compressed file's


@public("ray_tfrecord")
@dataclass(frozen=True)
class SplitPlan:
    """A dataset's splits in file order, and what reading them needs (pickleable: it travels in
    ``train_loop_config`` and into read tasks)."""

    splits: tuple[Split, ...]
    schema: pa.Schema
    filesystem: Any  # made pickleable (compat.pickleable_filesystem)
    compression: Compression
    # The partition values of each file (Hive directories, a TFDS shard's split), as read_tfrecords
    # returns them: ((path, ((column, value), ...)), ...), typed by partition_schema.
    partitions: tuple[tuple[str, PartitionValues], ...] = ()
    partition_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))

    def columns(self, *, include_paths: bool = False) -> pa.Schema:
        """What ``read_tfrecords`` returns for these files: the records' columns, then the partition
        columns (which win over a record column of the same name, as in Spark), then with
        ``include_paths`` a ``path`` column."""
        fields = [*(f for f in self.schema if f.name not in self.partition_schema.names), *self.partition_schema]
        return pa.schema(fields + ([pa.field(PATH_COLUMN, pa.string())] if include_paths else []))

    @property
    def split_rows(self) -> list[int]:
        return [s.rows for s in self.splits]

    @property
    def rows(self) -> int:
        return sum(self.split_rows)

    def fingerprint(self) -> list[int]:
        """What a saved position checks its dataset against: split count and rows."""
        return [len(self.splits), self.rows]


@public("ray_tfrecord")
def plan_splits(
    paths: str | list[str],
    *,
    schema: SchemaLike | None = None,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    filesystem: pafs.FileSystem | None = None,
    compression: Compression = "auto",
    keep_index: bool = True,
) -> SplitPlan:
    """List ``paths`` (as ``read_tfrecords`` does) and cut every file into record-exact splits.

    ``schema`` is the columns to decode, in any dialect ``read_tfrecords`` takes (a ``pyarrow.Schema``,
    a ``tf.io`` feature-spec dict, a TFMD ``Schema`` or a ``schema.pbtxt`` path); ``None`` takes the
    schema the writer recorded, and raises ``ValueError`` if there is none.  Deterministic: the same
    files give the same splits.

    Files without a current index sidecar are scanned in Ray tasks spread over the cluster (in
    threads here when Ray is not running) and, with ``keep_index`` (the default), what the scan found
    is kept: as index sidecars in a dataset this package wrote, else (another writer's directory, or
    one that cannot be written) in this machine's index cache, so planning the same files again
    reads only each file's first and last 4 KiB.  ``keep_index=False`` writes nothing.  A plan of many
    splits pickles as an object reference while Ray runs, so a ``train_loop_config`` holding it stays
    small ([At scale](../scale.md#a-plan-of-many-splits-travels-by-reference)).
    """
    if split_bytes <= 0:
        raise ValueError(f"split_bytes must be positive, got {split_bytes}")
    schema = arrow_schema(schema)  # the plan's splits hold Example records
    listing = list_files(paths, filesystem=filesystem)
    fs = listing.filesystem
    if schema is None:
        recorded = (read_stored_schema(fs, root, version=listing.version_of(root)) for root in listing.roots)
        schema = next((s for s in recorded if s is not None), None)
        if schema is None:
            raise ValueError(f"no schema is recorded under {listing.roots}; pass schema= to plan_splits")
    files = [f for f in listing.files if f.size]
    # Checkpoints at a quarter of the split size at most, so that splits come out near their size.
    spacing = max(1, min(sizes.INDEX_SPACING_BYTES, split_bytes // 4))
    indexes = file_indexes(fs, files, compression, spacing, keep=keep_index)
    splits = StoredTuple(s for file, found in zip(files, indexes, strict=True)
                         for s in _file_splits(file, found, split_bytes))
    return SplitPlan(splits, schema, compat.pickleable_filesystem(fs), compression, *_partitions(listing))


def _partitions(listing: Listing) -> tuple[tuple[tuple[str, PartitionValues], ...], pa.Schema]:
    return tuple((f.path, f.partitions) for f in listing.files if f.partitions), listing.partition_schema


def _file_splits(file: DataFile, found: FileIndex, split_bytes: int) -> list[Split]:
    if found.compressed:
        return [Split(file.path, 0, None, found.index.num_records, file.size)]
    return [Split(file.path, a, b, n, b - a) for a, b, n in found.index.split(split_bytes) if n]


def _split_table(fs: pafs.FileSystem, split: Split, schema: pa.Schema, compression: Compression,
                 wanted: np.ndarray | None = None) -> pa.Table:
    """The records of ``split`` numbered ``wanted`` (sorted; ``None``: every one), decoded, in file
    order.  Every record is framed and checked; only the wanted ones are decoded."""
    if split.end is None:
        with explain_missing(fs, split.path):
            stream, found = open_stream(split.path, fs, compression)
        chunks = iter_chunks(stream, path=split.path, compressed=bool(found), chunk_bytes=sizes.READ_CHUNK_BYTES)
    else:
        with explain_missing(fs, split.path):
            stream = fs.open_input_file(split.path)
        stream.seek(split.start)
        chunks = iter_chunks(stream, path=split.path, start=split.start, end=split.end, size=stream.size(),
                             chunk_bytes=sizes.READ_CHUNK_BYTES)
    batches, seen = [], 0
    try:
        for chunk in chunks:
            start, seen = seen, seen + len(chunk)
            if wanted is not None:
                first, last = np.searchsorted(wanted, (start, seen))
                if first == last:
                    continue
                keep = wanted[first:last] - start
                chunk = replace(chunk, positions=chunk.positions[keep], lengths=chunk.lengths[keep])
            batches.append(decode(chunk, schema))
    finally:
        stream.close()
    if seen != split.rows:
        raise TFRecordError(f"{seen} records from here where the plan counted {split.rows}; the file changed "
                            "since plan_splits ran: plan again", path=split.path, offset=split.start)
    return pa.Table.from_batches(batches, schema=schema)


def group_pieces(plan: SplitPlan, pieces: Sequence[Weighted], blocks: Sequence[Sequence[int]],
                 target_bytes: int = sizes.MIN_SPLIT_BYTES, max_pieces: int = MAX_RANGES_PER_TASK,
                 ) -> list[list[Weighted]]:
    """Consecutive ``pieces`` (of ``blocks``, ``mix_blocks``) in groups of
    about ``target_bytes`` on disk and at most ``max_pieces``: one read task each. A task per piece
    cost a Ray task's overhead per small file (``make bench``, Ray Train drain: 12% of the plain
    feed's rows/s with 8 MB files read one per task)."""
    groups: list[list[Weighted]] = []
    size = 0
    for weighted in pieces:
        (index, lo, hi), _ = weighted
        members = [plan.splits[i] for i in blocks[index]]
        rows = sum(m.rows for m in members)
        if not groups or size >= target_bytes or len(groups[-1]) >= max_pieces:
            groups.append([])
            size = 0
        groups[-1].append(weighted)
        # A piece of a block of several splits decodes them all, whatever its rows.
        block_bytes = sum(m.size for m in members)
        size += block_bytes if len(members) > 1 else block_bytes * (hi - lo) // max(1, rows)
    return groups


def read_pieces(
    plan: SplitPlan, pieces: Sequence[Weighted], *, blocks: Sequence[Sequence[int]], seed: int, epoch: int,
    shuffle: bool, columns: Sequence[str], weight_column: str, with_seed_column: bool = False,
) -> Iterator[pa.Table]:
    """One table per piece of a block: its rows in the block's seeded order
    (``row_order``), ``columns`` plus ``weight_column`` (float32, the
    piece's weight) and with ``with_seed_column`` ``SEED_COLUMN`` (each row's
    ``row_seeds``)."""
    fs = compat.unpickled_filesystem(plan.filesystem)
    available = plan.columns(include_paths=PATH_COLUMN in columns)
    attached = {*plan.partition_schema.names, PATH_COLUMN}
    schema = pa.schema([plan.schema.field(c) for c in columns if c not in attached])
    extra = [available.field(c) for c in columns if c in attached]
    partitions = dict(plan.partitions) if extra else {}
    for (index, lo, hi), weight in pieces:
        members = blocks[index]
        counts = [plan.splits[i].rows for i in members]
        starts = np.cumsum([0, *counts[:-1]])
        total = sum(counts)
        rows = row_order(total, seed, epoch, index, shuffle=shuffle)[lo:hi]
        # A piece of part of a block (a share's edge, a resumed epoch) decodes only its own records.
        wanted = None if hi - lo == total else np.sort(rows)
        parts = []
        for i, start, count in zip(members, starts, counts, strict=True):
            mine = None if wanted is None else wanted[np.searchsorted(wanted, start):
                                                      np.searchsorted(wanted, start + count)] - start
            if mine is None or len(mine):
                parts.append(_attached(partitions, plan.splits[i],
                                       _split_table(fs, plan.splits[i], schema, plan.compression, mine), extra))
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        if shuffle:
            # The decoded rows are in record order (all of them, or wanted's): put them in the piece's.
            # One chunk first: Arrow's take over a table of many chunks (one a decoded chunk of the
            # file) costs 6x the concatenation and a take over one (make bench, resume section).
            at = rows if wanted is None else _ranks(wanted, rows, total)
            table = table.combine_chunks().take(pa.array(at))
        table = table.append_column(pa.field(weight_column, pa.float32()),
                                    pa.array(np.full(hi - lo, weight, np.float32)))
        if with_seed_column:
            split = np.repeat(np.asarray(members, np.int64), counts)
            record = np.arange(len(split)) - np.repeat(starts, counts)
            table = table.append_column(pa.field(SEED_COLUMN, pa.uint64()),
                                        pa.array(row_seeds(seed, epoch, split[rows], record[rows])))
        yield table


def _ranks(wanted: np.ndarray, rows: np.ndarray, total: int) -> np.ndarray:
    """Where each of ``rows`` is in ``wanted`` (the same numbers, sorted, all below ``total``): a
    table lookup, not a binary search per row (a third of a partial block's shuffle, cache misses)."""
    place = np.empty(total, np.int64)
    place[wanted] = np.arange(len(wanted))
    return place[rows]


def _attached(partitions: dict[str, PartitionValues], split: Split, table: pa.Table,
              extra: Sequence[pa.Field]) -> pa.Table:
    """``table`` (rows of ``split``) with the partition and path columns of ``extra``: one value a file."""
    values = dict(partitions.get(split.path, ()))
    values[PATH_COLUMN] = split.path
    for f in extra:
        table = table.append_column(f, pa.array([values.get(f.name)] * table.num_rows, f.type))
    return table


@dataclass(frozen=True, kw_only=True)
class PieceReader:
    """The body of a resumable feed's Ray Data tasks (``map_batches``): rows of ``pieces`` (runs of
    ``[block, lo, hi, weight]``, ``group_pieces``) in, their decoded rows out.  It lives here, not
    beside the feed, so that a read task's worker imports no TensorFlow (seconds per fresh worker,
    which Ray starts for the feed's tasks every epoch)."""

    plan: SplitPlan
    blocks: tuple[tuple[int, ...], ...]
    seed: int
    epoch: int
    shuffle: bool
    columns: tuple[str, ...]
    weight_column: str
    #: Add each row's seed (``SEED_COLUMN``), which a transform or ``keep`` predicate reads.
    with_seed_column: bool = False

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for group in batch.column("pieces").to_pylist():
            yield from self.read(group)

    def read(self, group: Sequence[Sequence[float]]) -> Iterator[pa.Table]:
        """The rows of one group (``[block, lo, hi, weight]`` runs), a table per piece."""
        pieces = [((int(s), int(lo), int(hi)), w) for s, lo, hi, w in group]  # one Arrow type: doubles
        yield from read_pieces(self.plan, pieces, blocks=self.blocks, seed=self.seed, epoch=self.epoch,
                               shuffle=self.shuffle, columns=self.columns, weight_column=self.weight_column,
                               with_seed_column=self.with_seed_column)


def read_group(reader: PieceReader, group: Sequence[Sequence[float]]) -> pa.Table:
    """The body of a resumable feed's read task without a transform (a plain Ray task): one
    group's rows as one table."""
    return pa.concat_tables(list(reader.read(group)))
