"""Index sidecars: record-boundary checkpoints that let readers split a TFRecord file.

Sidecars live at the dataset root, one ``_index.<relative path>`` file per data file
(``/`` and ``.`` of the relative path percent-encoded), e.g. ``root/_index.year=2021%2Fpart-0%2Etfrecord``
for ``root/year=2021/part-0.tfrecord``. TensorFlow's globs do not skip hidden names, so the
only place they cannot reach is beside the partition directories: ``root/*/*`` and
``root/*/*.tfrecord*`` match data files only, and ``root/*.tfrecord*`` (no ``.tfrecord`` in a
sidecar's name) too. Hadoop-style readers, this package's listing included, skip ``_`` names.
The dataset root of a file is found from its path alone: its directory, less the trailing Hive
``key=value`` directories. Readers also accept the former layout, ``<dir>/.<name>.idx``.

The index is *sparse*: it records the header offset and ordinal of one record
roughly every ``spacing_bytes`` (256 KiB by default), not of every record. That
keeps it tiny (16 bytes per checkpoint, ~64 KiB per GiB of data) while still
letting a reader cut a file into byte ranges that start exactly on record
boundaries and know how many records each range holds.

Layout, version 1 (all integers little-endian)::

    header      "<6sHIQQQIIQ": magic b"RTFIDX", version, flags (0), spacing_bytes,
                data_size, num_records, head_crc, tail_crc, num_checkpoints
    ordinals    int64[num_checkpoints]  record number of each checkpoint
    offsets     int64[num_checkpoints]  byte offset of that record's header
    trailer     uint32 zlib.crc32 of everything above

Staleness: ``data_size`` plus CRC-32 of the first and last ``FINGERPRINT_BYTES`` of
the data file. A reader compares those with the file it is about to split and
ignores the index on any mismatch (file appended to, truncated or rewritten). File
modification times are deliberately not used: moving a file on an object store
(as the datasink's commit does) changes them without changing the content.

Indexes are only written for uncompressed files; compressed files cannot be
split and are always read whole.

Example:
    >>> import numpy as np
    >>> builder = IndexBuilder(spacing_bytes=100)
    >>> builder.add_records(np.array([0, 60, 120, 180, 240]))
    >>> builder.observe_bytes(b"x" * 300)
    >>> index = builder.finish(data_size=300)
    >>> index.num_records, index.offsets.tolist()
    (5, [0, 120, 240])
    >>> RecordIndex.from_bytes(index.to_bytes(), path="f").split(130)
    [(0, 240, 4), (240, 300, 1)]
"""

from __future__ import annotations

import logging
import posixpath
import struct
import urllib.parse
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs

from . import sizes
from .layout import INDEX_PREFIX, LEGACY_INDEX_SUFFIX

logger = logging.getLogger(__name__)

INDEX_VERSION = 1
# Bytes hashed at each end of the data file to detect a changed file.
FINGERPRINT_BYTES = 4096

_MAGIC = b"RTFIDX"
_HEADER = struct.Struct("<6sHIQQQIIQ")
_TRAILER = struct.Struct("<I")


class IndexFormatError(ValueError):
    """An index sidecar is unreadable: wrong magic, unknown version, or damaged."""


def _hive_roots(data_path: str) -> list[str]:
    """The directories that may be ``data_path``'s dataset root, nearest first: its own
    directory, then each parent reached through a Hive ``key=value`` directory."""
    roots = [posixpath.dirname(data_path)]
    while "=" in posixpath.basename(roots[-1]) and posixpath.dirname(roots[-1]) != roots[-1]:
        roots.append(posixpath.dirname(roots[-1]))
    return roots


def dataset_root(data_path: str) -> str:
    """The dataset directory holding ``data_path`` (a file, or a directory written with a
    trailing "/"): its directory less trailing Hive ``key=value`` directories, where the writer
    puts sidecars and the recorded schema."""
    return _hive_roots(data_path)[-1]


def index_path(data_path: str, root: str | None = None) -> str:
    """Return where the sidecar of ``data_path`` is written: ``<root>/_index.<relative path>``.

    ``root`` is the dataset directory holding ``data_path`` at any depth; by default the
    file's directory less its trailing Hive ``key=value`` directories.
    """
    root = (dataset_root(data_path) if root is None else root).rstrip("/")
    relative = posixpath.relpath(data_path, root)
    if relative.startswith("../"):
        raise ValueError(f"{data_path} is not under {root}")
    # No "/" so the sidecar sits in the root; no "." so `*.tfrecord*` globs skip it.
    name = urllib.parse.quote(relative, safe="=-_~").replace(".", "%2E")
    return posixpath.join(root, INDEX_PREFIX + name)


def index_candidates(data_path: str) -> list[str]:
    """Where a reader looks for the sidecar of ``data_path``, in order: the dataset roots the
    path allows (``index_path``), then the former ``<dir>/.<name>.idx``."""
    directory, name = posixpath.split(data_path)
    # The outermost root first: the datasink and the CLI write there.
    return [index_path(data_path, root) for root in reversed(_hive_roots(data_path))] + [
        posixpath.join(directory, f".{name}{LEGACY_INDEX_SUFFIX}")
    ]


def is_index_path(path: str) -> bool:
    """Whether ``path`` names an index sidecar (of either layout)."""
    name = posixpath.basename(path)
    return name.startswith(INDEX_PREFIX) or (name.startswith(".") and name.endswith(LEGACY_INDEX_SUFFIX))


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, eq=False)  # numpy fields: compare to_bytes() instead
class RecordIndex:
    """Checkpoints of one data file: ``offsets[i]`` is the header offset of record
    number ``ordinals[i]``. ``ordinals[0] == offsets[0] == 0`` unless the file is
    empty (then there are no checkpoints)."""

    data_size: int
    num_records: int
    head_crc: int
    tail_crc: int
    ordinals: np.ndarray
    offsets: np.ndarray
    spacing_bytes: int = sizes.INDEX_SPACING_BYTES

    def matches(self, data_size: int, head: bytes, tail: bytes) -> bool:
        """Whether this index still describes a file of ``data_size`` bytes that
        starts with ``head`` and ends with ``tail`` (each ``FINGERPRINT_BYTES`` long,
        or the whole file when shorter)."""
        return (
            self.data_size == data_size
            and self.head_crc == _crc(head)
            and self.tail_crc == _crc(tail)
        )

    def split(self, target_bytes: int) -> list[tuple[int, int, int]]:
        """Cut the file into ranges of about ``target_bytes`` that start on record
        boundaries.

        Returns ``(start, end, num_records)`` triples covering ``[0, data_size)``;
        every record's header lies in exactly one range.
        """
        if self.num_records == 0 or len(self.offsets) == 0:
            return [(0, self.data_size, 0)]
        chosen = [0]
        desired = target_bytes
        while desired < self.data_size:
            j = int(np.searchsorted(self.offsets, desired, side="left"))
            if j >= len(self.offsets):
                break
            if j > chosen[-1]:
                chosen.append(j)
            desired = int(self.offsets[j]) + target_bytes
        ranges = []
        for a, b in zip(chosen, chosen[1:] + [None]):
            start = int(self.offsets[a])
            end = self.data_size if b is None else int(self.offsets[b])
            rows_end = self.num_records if b is None else int(self.ordinals[b])
            ranges.append((start, end, rows_end - int(self.ordinals[a])))
        return ranges

    def to_bytes(self) -> bytes:
        """Serialise to the version-1 sidecar layout."""
        body = (
            _HEADER.pack(
                _MAGIC,
                INDEX_VERSION,
                0,
                self.spacing_bytes,
                self.data_size,
                self.num_records,
                self.head_crc,
                self.tail_crc,
                len(self.offsets),
            )
            + np.asarray(self.ordinals, dtype="<i8").tobytes()
            + np.asarray(self.offsets, dtype="<i8").tobytes()
        )
        return body + _TRAILER.pack(_crc(body))

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str) -> RecordIndex:
        """Parse a sidecar; raises ``IndexFormatError`` naming ``path``."""
        if len(data) < _HEADER.size + _TRAILER.size:
            raise IndexFormatError(f"{path}: index sidecar truncated ({len(data)} bytes)")
        magic, version, _flags, spacing, size, count, head, tail, n = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise IndexFormatError(f"{path}: not a ray_tfrecord index (magic {magic!r})")
        if version != INDEX_VERSION:
            raise IndexFormatError(f"{path}: unsupported index version {version}")
        expected = _HEADER.size + 16 * n + _TRAILER.size
        if len(data) != expected:
            raise IndexFormatError(
                f"{path}: index sidecar is {len(data)} bytes, expected {expected}"
            )
        body = data[: -_TRAILER.size]
        (crc,) = _TRAILER.unpack_from(data, len(body))
        if crc != _crc(body):
            raise IndexFormatError(f"{path}: index sidecar checksum mismatch")
        arrays = np.frombuffer(body, dtype="<i8", offset=_HEADER.size).astype(np.int64)
        return cls(
            data_size=size,
            num_records=count,
            head_crc=head,
            tail_crc=tail,
            ordinals=arrays[:n],
            offsets=arrays[n:],
            spacing_bytes=spacing,
        )


class IndexBuilder:
    """Builds a ``RecordIndex`` while a file is written or scanned.

    Feed it the absolute header offsets of records in file order
    (``add_records``) and, when writing, the bytes written
    (``observe_bytes``) so it can fingerprint the file's head and tail.
    """

    def __init__(self, spacing_bytes: int = sizes.INDEX_SPACING_BYTES):
        if spacing_bytes <= 0:
            raise ValueError(f"spacing_bytes must be positive, got {spacing_bytes}")
        self._spacing = spacing_bytes
        self._num_records = 0
        self._next_checkpoint = 0
        self._ordinals: list[int] = []
        self._offsets: list[int] = []
        self._head = bytearray()
        self._tail = b""

    def add_records(self, offsets: np.ndarray) -> None:
        """Register records whose headers start at the given absolute offsets."""
        offsets = np.asarray(offsets, dtype=np.int64)
        # One searchsorted per checkpoint rather than a Python loop per record:
        # checkpoints are rare (one per spacing_bytes), records may be tiny.
        while True:
            j = int(np.searchsorted(offsets, self._next_checkpoint, side="left"))
            if j >= len(offsets):
                break
            self._ordinals.append(self._num_records + j)
            self._offsets.append(int(offsets[j]))
            self._next_checkpoint = int(offsets[j]) + self._spacing
        self._num_records += len(offsets)

    def observe_bytes(self, data) -> None:
        """Register bytes appended to the data file (for the fingerprint)."""
        view = memoryview(data).cast("B")
        if len(self._head) < FINGERPRINT_BYTES:
            self._head += view[: FINGERPRINT_BYTES - len(self._head)]
        self._tail = (self._tail + bytes(view[-FINGERPRINT_BYTES:]))[-FINGERPRINT_BYTES:]

    def finish(
        self, data_size: int, head: bytes | None = None, tail: bytes | None = None
    ) -> RecordIndex:
        """Return the index of a ``data_size``-byte file. ``head``/``tail`` default to
        what ``observe_bytes`` saw."""
        return RecordIndex(
            data_size=data_size,
            num_records=self._num_records,
            head_crc=_crc(bytes(self._head) if head is None else head),
            tail_crc=_crc(self._tail if tail is None else tail),
            ordinals=np.asarray(self._ordinals, dtype=np.int64),
            offsets=np.asarray(self._offsets, dtype=np.int64),
            spacing_bytes=self._spacing,
        )


def read_fingerprint(
    filesystem: pafs.FileSystem, path: str, size: int
) -> tuple[bytes, bytes]:
    """Read the head and tail bytes of ``path`` that an index fingerprints."""
    with filesystem.open_input_file(path) as f:
        head = f.read_at(min(size, FINGERPRINT_BYTES), 0)
        tail_len = min(size, FINGERPRINT_BYTES)
        tail = f.read_at(tail_len, size - tail_len) if tail_len else b""
    return head, tail


def load_index(
    filesystem: pafs.FileSystem, data_path: str, size: int, head: bytes, tail: bytes, stored: bytes | None = None
) -> RecordIndex | None:
    """Return the sidecar index of ``data_path`` (the first of ``index_candidates`` that
    exists; ``stored``: the index bytes a manifest holds instead) if it still matches the file;
    ``None`` (with a log line saying why) otherwise."""
    sidecar, data = f"{data_path} (the manifest's index)", stored
    for sidecar in index_candidates(data_path) if stored is None else ():
        try:
            with filesystem.open_input_stream(sidecar, compression=None) as f:
                data = f.read()
            break
        except FileNotFoundError:
            continue
    if data is None:
        return None
    try:
        index = RecordIndex.from_bytes(data, path=sidecar)
    except IndexFormatError as e:
        logger.warning("Ignoring index sidecar: %s", e)
        return None
    if not index.matches(size, head, tail):
        logger.warning(
            "Ignoring stale index sidecar %s: %s changed since it was indexed; "
            "splitting by record resynchronisation instead.",
            sidecar,
            data_path,
        )
        return None
    return index


def write_index(
    filesystem: pafs.FileSystem, data_path: str, index: RecordIndex, root: str | None = None
) -> str:
    """Write ``index`` as the sidecar of ``data_path`` (at ``index_path``, which says
    what ``root`` is); returns the sidecar path."""
    sidecar = index_path(data_path, root)
    with filesystem.open_output_stream(sidecar, compression=None) as f:
        f.write(index.to_bytes())
    return sidecar


def build_index(
    filesystem: pafs.FileSystem,
    data_path: str,
    *,
    spacing_bytes: int = sizes.INDEX_SPACING_BYTES,
) -> RecordIndex | None:
    """Scan ``data_path`` (verifying every CRC) and return its index, or ``None`` if
    the file is compressed (compressed files are never split, so never indexed).

    Raises ``CorruptRecordError`` naming the file and
    offset if the file is damaged: an index of a damaged file would be wrong.
    """
    from ray_tfrecord._src.core.framing import detect_compression, iter_chunks

    size = filesystem.get_file_info(data_path).size
    head, tail = read_fingerprint(filesystem, data_path, size)
    if size and detect_compression(head[:16]) is not None:
        return None
    builder = IndexBuilder(spacing_bytes)
    with filesystem.open_input_file(data_path) as f:
        for chunk in iter_chunks(f, path=data_path):
            builder.add_records(chunk.offsets())
    return builder.finish(size, head, tail)
