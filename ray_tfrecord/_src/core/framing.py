"""TFRecord framing: find records in byte streams, verify CRCs, (de)compress, write framed bytes.

A TFRecord file is records laid end to end, each ``uint64 length | uint32 masked_crc32c(length) |
data | uint32 masked_crc32c(data)``. GZIP and ZLIB wrap the whole stream. The scan itself runs in
the native core; this module feeds it bounded chunks of a stream and turns its findings into
``RecordChunk`` objects or located ``CorruptRecordError`` s.

Example::

    import io
    from ray_tfrecord._src.core.framing import frame_records, iter_chunks

    data = frame_records([b"a", b"bc"])
    (chunk,) = iter_chunks(io.BytesIO(data), path="<memory>")
    assert [bytes(chunk.record(i)) for i in range(len(chunk))] == [b"a", b"bc"]
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Literal, Protocol

import numpy as np

from . import _native, options, sizes
from ._contract import Status
from .errors import CorruptRecordError, NotTFRecordError
from .options import Compression, OnCorrupt
from .public import public

_log = logging.getLogger(__name__)
# A record's frame, as the extension defines it: the length (LENGTH_BYTES) and the length's CRC make
# the header before the payload (HEADER_BYTES); the payload's CRC follows it (FOOTER_BYTES).
LENGTH_BYTES = _native.FRAME["LENGTH_BYTES"]
HEADER_BYTES = _native.FRAME["HEADER_BYTES"]
FOOTER_BYTES = _native.FRAME["FOOTER_BYTES"]
FRAME_OVERHEAD = HEADER_BYTES + FOOTER_BYTES

_WBITS = {"gzip": 31, "zlib": 15}
#: Protobuf cannot parse a message of 2 GiB or more, so no Example can be larger.
MAX_RECORD_BYTES = (1 << 31) - 1


def masked_crc32c(data: bytes | memoryview) -> int:
    """The masked CRC-32C TFRecord stores after the length and after the data."""
    return _native.masked_crc32c(data)


def frame_records(records: Iterable[bytes]) -> bytes:
    """Frame raw record payloads as a TFRecord byte stream."""
    out = bytearray()
    for r in records:
        header = struct.pack("<Q", len(r))
        out += header + struct.pack("<I", masked_crc32c(header)) + r + struct.pack("<I", masked_crc32c(r))
    return bytes(out)


def detect_compression(head: bytes) -> Compression | None:
    """Tell GZIP, ZLIB and plain TFRecord apart from a file's first bytes (16 are plenty).

    A plain file whose first length CRC holds is plain whatever its bytes look like: a length
    whose low bytes happen to read ``78 9c`` must not be mistaken for a ZLIB header.
    """
    length_crc = struct.unpack_from("<I", head, LENGTH_BYTES)[0] if len(head) >= HEADER_BYTES else None
    if length_crc is not None and masked_crc32c(head[:LENGTH_BYTES]) == length_crc:
        return None
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and ((head[0] << 8) | head[1]) % 31 == 0:
        return "zlib"
    return None


@dataclass(frozen=True)
class RecordChunk:
    """Whole framed records found in ``buffer``.

    ``positions[i]`` is the offset of record i's header within ``buffer``, ``lengths[i]`` its
    payload length; ``base_offset`` is the stream offset of ``buffer[0]`` (an offset in the
    decompressed stream when ``compressed``).
    """

    buffer: bytes | memoryview | np.ndarray
    positions: np.ndarray
    lengths: np.ndarray
    base_offset: int
    path: str
    compressed: bool = False

    def __len__(self) -> int:
        return len(self.positions)

    def offsets(self) -> np.ndarray:
        """Stream offsets of every record header."""
        return self.positions + self.base_offset

    def offset(self, i: int) -> int:
        return int(self.positions[i]) + self.base_offset

    def record(self, i: int) -> memoryview:
        """The payload of record i (no copy)."""
        p = int(self.positions[i]) + HEADER_BYTES
        return memoryview(self.buffer)[p : p + int(self.lengths[i])]


@dataclass
class CorruptionReport:
    """Bad records skipped under ``on_corrupt="skip"``: a count and the first few places."""

    count: int = 0
    samples: list[tuple[str, int, str]] = field(default_factory=list)
    max_samples: int = 20

    def add(self, path: str, offset: int, reason: str) -> None:
        self.count += 1
        if len(self.samples) < self.max_samples:
            self.samples.append((path, offset, reason))
        _log.warning("skipping corrupt TFRecord data in %s at offset %d: %s", path, offset, reason)

    def merge(self, other: CorruptionReport) -> None:
        self.count += other.count
        self.samples.extend(other.samples[: max(0, self.max_samples - len(self.samples))])


_NOT_TFRECORD = ("; the file does not look like TFRecord at all: if it is not data, leave it out of the read "
                 "(read_tfrecords(..., file_extensions=[...]) or a glob matching only the data files); if it is "
                 "Parquet, CSV or JSON, read it with ray.data.read_parquet/read_csv/read_json or "
                 "`ray-tfrecord convert` it")


def _frame_error(status: Status, length: int, available: int) -> str:
    if status == Status.TRUNCATED_HEADER:
        return f"truncated record header: {available} bytes left, {HEADER_BYTES} needed"
    if status == Status.TRUNCATED_DATA:
        return (f"truncated record: length field claims {length} bytes (+{FOOTER_BYTES} CRC) but only {available} "
                "bytes remain")
    if status == Status.BAD_LENGTH_CRC:
        return "corrupted record: length CRC mismatch"
    return f"corrupted record: data CRC mismatch over {length} bytes"


class ByteStream(Protocol):
    """What the reader needs of a stream: a file object, a ``pyarrow`` input stream, or what
    ``open_stream`` returns (``readinto`` is used when the stream has it)."""

    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class _Replay:
    """A stream whose first bytes were already read (for compression detection, or a whole small file
    fetched in one request): they are handed out from a view, without copying what remains of them."""

    def __init__(self, head: bytes, raw: ByteStream) -> None:
        self._head, self._at, self._raw = memoryview(head), 0, raw

    def read(self, n: int = -1) -> bytes:
        left = len(self._head) - self._at
        if not left:
            return self._raw.read(n)
        take = left if n < 0 else min(n, left)
        out = bytes(self._head[self._at:self._at + take])
        self._at += take
        if n < 0:
            return out + self._raw.read()
        return out if take == n else out + self._raw.read(n - take)

    def readinto(self, view: np.ndarray) -> int:
        left = len(self._head) - self._at
        if not left:
            return _read_into(self._raw, view)
        n = min(left, len(view))
        view[:n] = np.frombuffer(self._head, np.uint8, n, self._at)
        self._at += n
        return n

    def close(self) -> None:
        self._raw.close()


class _Inflate:
    """A decompressing reader that never inflates more than it was asked for (no zip bombs)."""

    def __init__(self, raw: ByteStream, compression: Compression, path: str) -> None:
        self._raw, self._kind, self._path = raw, compression, path
        self._d = zlib.decompressobj(_WBITS[compression])
        self._raw_pos = 0
        self._eof = False
        # Raised by the next read, so that the bytes inflated before the damage still arrive.
        self._damage: CorruptRecordError | None = None

    def _fail(self, why: str) -> CorruptRecordError:
        return CorruptRecordError(f"{why} (compressed byte {self._raw_pos})", path=self._path)

    def read(self, n: int = -1) -> bytes:
        if self._damage is not None:
            raise self._damage
        if n < 0:
            n = 1 << 62
        out: list[bytes] = []
        try:
            self._inflate(n, out)
        except CorruptRecordError as e:
            if not any(out):
                raise
            self._damage = e
        return b"".join(out)

    def _inflate(self, n: int, out: list[bytes]) -> None:
        size = 0
        while size < n and not self._eof:
            src = self._d.unconsumed_tail
            if not src:
                if self._d.eof:
                    src = self._d.unused_data or self._raw.read(sizes.COMPRESSED_READ_BYTES)
                    if not src:
                        self._eof = True
                        break
                    if self._kind == "zlib":
                        raise self._fail("data after the end of the ZLIB stream")
                    self._d = zlib.decompressobj(_WBITS[self._kind])  # concatenated gzip members
                else:
                    src = self._raw.read(sizes.COMPRESSED_READ_BYTES)
                    if not src:
                        raise self._fail(f"truncated {self._kind.upper()} stream")
                    self._raw_pos += len(src)
            try:
                data = self._d.decompress(src, n - size)
            except zlib.error as e:
                raise self._fail(f"corrupted {self._kind.upper()} stream: {e}") from None
            out.append(data)
            size += len(data)

    def close(self) -> None:
        self._raw.close()


@public("ray_tfrecord")
def open_stream(path: str, filesystem, compression: Compression | Literal["auto"] | None = "auto", *,
                first_read: int = 16) -> tuple[ByteStream, Compression | None]:
    """Open ``path`` on a ``pyarrow.fs`` filesystem as a (decompressed) byte stream.

    Compression is detected from the content when ``"auto"``, never from the file name. The first
    ``first_read`` bytes (at least 16) are read at once: on an object store every read is a request,
    so a small file's size plus one reads it whole in one (the extra byte finds a file that grew).
    """
    options.compression(compression, allow_auto=True)
    raw = filesystem.open_input_stream(path, compression=None)
    head = raw.read(max(16, first_read))
    found = detect_compression(head) if compression == "auto" else compression
    stream = _Replay(head, raw)
    return (_Inflate(stream, found, path) if found else stream), found


def _read_into(stream: ByteStream, view: np.ndarray) -> int:
    readinto = getattr(stream, "readinto", None)
    if readinto is not None:
        return readinto(view) or 0
    piece = stream.read(len(view))
    view[: len(piece)] = np.frombuffer(piece, np.uint8)
    return len(piece)


def _fill(stream: ByteStream, pending: bytes | np.ndarray, target: int,
          piece_bytes: int) -> tuple[np.ndarray, bool, CorruptRecordError | None]:
    """``pending`` followed by the stream's next bytes, up to ``target`` in all, in one new buffer;
    whether the stream ended; and the error that ended it, if a damaged (compressed) stream
    failed part way, the bytes before the damage being in the buffer.

    The bytes are read straight into that buffer rather than read and joined: each fresh
    buffer costs its pages' first touch, which on a 4 MiB chunk outweighs the CRC scan, so one
    is better than two. numpy asks for transparent huge pages on large arrays, which makes that
    touch cheaper still. The buffer grows only as bytes arrive, never to a size a length field
    merely claims.
    """
    have = len(pending)
    buf = np.empty(max(have, min(target, have + piece_bytes)), np.uint8)
    buf[:have] = np.frombuffer(pending, np.uint8)
    while have < target:
        if have == len(buf):
            grown = np.empty(min(target, 2 * len(buf)), np.uint8)
            grown[:have] = buf[:have]
            buf = grown
        try:
            n = _read_into(stream, buf[have : min(len(buf), have + piece_bytes)])
        except CorruptRecordError as e:
            return buf[:have], True, e
        if not n:
            return buf[:have], True, None
        have += n
    return buf[:have], False, None


@public("ray_tfrecord")
def iter_chunks(stream: ByteStream, *, path: str, start: int = 0, end: int | None = None, resync: bool = False,
                verify_crc: bool = True, on_corrupt: OnCorrupt = "raise", report: CorruptionReport | None = None,
                chunk_bytes: int = sizes.STREAM_CHUNK_BYTES, size: int | None = None, compressed: bool = False,
                max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[RecordChunk]:
    """Yield chunks of whole records read from ``stream``, which is positioned at ``start``.

    Only records whose header starts in ``[start, end)`` are yielded (``end=None``: to the end).
    ``resync=True`` first searches for a record boundary at or after ``start`` using the length
    and data CRCs; use it for a byte range that does not begin at a known boundary. ``size`` (the
    stream's total length, when known) lets a length field that claims more than the file holds
    be rejected without reading on; ``max_record_bytes`` does the same for any stream (the default
    is protobuf's own 2 GiB message limit). Memory stays within about ``chunk_bytes`` plus the
    largest record. The length CRC is always checked (it is what makes a length trustworthy);
    ``verify_crc`` governs the data CRC. ``compressed`` only changes how offsets are described.
    """
    skip = options.on_corrupt(on_corrupt) == "skip"
    skipped = report if report is not None else CorruptionReport()
    where = " in the decompressed stream" if compressed else ""

    def defect(offset: int, reason: str, error: type = CorruptRecordError) -> None:
        if not skip:
            raise error(reason, path=path, offset=offset)
        skipped.add(path, offset, reason)

    if size is not None and start >= size:
        # Nothing starts at or past the end: TensorFlow's reader reports end-of-data there, so
        # yield nothing rather than measure a negative remainder as a truncated record.
        return
    base, need, resyncing = start, 0, resync
    pending: bytes | np.ndarray = b""
    while end is None or base < end:
        most = max_record_bytes + FRAME_OVERHEAD
        room = most if size is None else min(size - base, most)
        if need > room:
            # The length at `base` claims more than the file (or any valid record) can hold: no
            # need to read it. A resync candidate that cannot fit is simply no boundary.
            if not resyncing and size is not None and size - base < need:
                claimed = need - FRAME_OVERHEAD
                defect(base, _frame_error(Status.TRUNCATED_DATA, claimed, size - base - HEADER_BYTES) + where)
            elif not resyncing:
                defect(base, f"record length field claims {need - FRAME_OVERHEAD} bytes, more than max_record_bytes="
                       f"{max_record_bytes}{where}")
            pending, base, need, resyncing = pending[1:], base + 1, 0, True
        data, eof, broken = _fill(stream, pending, max(len(pending) + chunk_bytes, need), max(chunk_bytes, 1 << 16))
        if broken is not None and not skip:
            raise broken
        # A damaged compressed stream cannot be resynchronised: with skip, the records
        # decompressed so far are kept and the rest of the file is reported as one lost stretch.
        limit = -1 if end is None else end - base
        found = _native.scan(data, verify=verify_crc, final=eof and broken is None, skip=skip, limit=limit,
                             resync=resyncing)
        for e in found.errors:
            status, reason = Status(e.status), _frame_error(Status(e.status), e.length, e.available)
            if base + e.offset == 0 and not resync and status == Status.BAD_LENGTH_CRC:
                defect(0, reason + where + _NOT_TFRECORD, NotTFRecordError)
            else:
                defect(base + e.offset, reason + where)
        if skip:
            skipped.count += found.error_count - len(found.errors)
        if len(found.positions):
            yield RecordChunk(data, np.frombuffer(found.positions, np.int64), np.frombuffer(found.lengths, np.int64),
                              base, path, compressed)
        pending = data[found.consumed:]
        base += found.consumed
        need, resyncing = found.need, found.resyncing
        if eof:
            if broken is not None:
                defect(base, f"{broken.reason}: the records from decompressed offset {base} to the end are lost")
            return


@public("ray_tfrecord")
class RecordWriter:
    """Writes framed records to a binary stream, compressing the whole stream when asked.

    ``bytes_written`` counts uncompressed stream bytes, i.e. the offsets an index refers to.
    ``level`` is zlib's (0-9; ``None``: zlib's default), for GZIP/ZLIB streams only.
    """

    def __init__(self, stream: BinaryIO, compression: Compression | None = None, level: int | None = None) -> None:
        options.compression(compression)
        options.compression_level(level, compression)
        self._stream = stream
        self._z = (zlib.compressobj(-1 if level is None else level, zlib.DEFLATED, _WBITS[compression])
                   if compression else None)
        self.bytes_written = 0

    def write(self, framed: bytes | memoryview) -> None:
        self.bytes_written += len(framed)
        self._stream.write(self._z.compress(framed) if self._z else framed)

    def close(self) -> None:
        if self._z:
            self._stream.write(self._z.flush())
            self._z = None
        self._stream.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
