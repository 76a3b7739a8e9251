"""Type stub of the native codec (ray_tfrecord/_src/core/native/module.c). Enum values: see _contract.py."""

from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import numpy as np
from typing_extensions import Buffer as _Buffer

# What the functions read through the buffer protocol (numpy's stubs do not declare it for arrays).
BufferLike: TypeAlias = _Buffer | np.ndarray[Any, Any]

HARDWARE_CRC: Final[bool]
STATUS: Final[dict[str, int]]
KINDS: Final[dict[str, int]]
SHAPES: Final[dict[str, int]]
SECTIONS: Final[dict[str, int]]
RECORD_TYPES: Final[dict[str, int]]
TF_DTYPES: Final[dict[str, int]]
STATUS_MESSAGES: Final[dict[str, str]]
# A record's frame: LENGTH_BYTES, HEADER_BYTES (length and its CRC), FOOTER_BYTES (the payload's CRC).
FRAME: Final[dict[str, int]]

class Buffer:
    """Read-only memory owned by the native codec (supports the buffer protocol)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class CodecError(ValueError):
    """A record the core could not decode or inspect (str() is the status's message), or a column's
    buffers it could not encode (str() names the column)."""

    status: int
    record: int
    column: bytes | None
    offset: int
    actual: int
    expected: int
    other_record: int
    index: int

class FrameError(tuple[Any, ...]):
    status: int
    offset: int
    length: int
    available: int

class ScanResult(tuple[Any, ...]):
    positions: Buffer
    lengths: Buffer
    consumed: int
    errors: list[FrameError]
    error_count: int
    need: int
    resyncing: bool

class Batch:
    """A decoded chunk as an Arrow struct array (pa.record_batch(batch) imports it, once)."""

    @property
    def null_column(self) -> int: ...
    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]: ...

class Decoder:
    """Decoder(columns, record_type): columns are DecodeSpecs; record_type an Example or SequenceExample code."""

    def __init__(self, columns: Sequence[Any], record_type: int) -> None: ...
    @property
    def nogil_ns(self) -> int: ...
    def decode(self, buffer: BufferLike, positions: BufferLike, lengths: BufferLike, /) -> Batch: ...

class InspectedColumn(tuple[Any, ...]):
    name: bytes
    section: int
    kind: int
    present: int
    min_count: int
    max_count: int
    kind_record: int

class Encoded(tuple[Any, ...]):
    data: Buffer
    offsets: Buffer

class ByteArray(tuple[Any, ...]):
    offsets: Buffer
    data: Buffer

class Encoder:
    """Encoder(columns, record_type): columns are EncodeSpecs; record_type a record type code."""

    def __init__(self, columns: Sequence[Any], record_type: int) -> None: ...
    def encode(self, batch: Any, nrows: int, converted: Sequence[Any], /) -> Encoded: ...

def scan(buffer: BufferLike, verify: bool = True, final: bool = True, skip: bool = False, limit: int = -1,
         resync: bool = False) -> ScanResult: ...
def masked_crc32c(data: BufferLike, /) -> int: ...
def inspect(buffer: BufferLike, positions: BufferLike, lengths: BufferLike, record_type: int, /
            ) -> list[InspectedColumn]: ...
def byte_array(buffer: BufferLike, positions: BufferLike, lengths: BufferLike, /) -> ByteArray: ...
def tensor_describe(data: BufferLike, /) -> tuple[int, tuple[int, ...]] | None: ...
def encode(record_type: int, nrows: int, columns: Sequence[Any], /) -> Encoded: ...
def pool_held() -> int: ...
def jpeg_window(data: BufferLike, denom: int, channels: int, y: int, x: int, h: int, w: int, out: BufferLike, /
                ) -> tuple[int, str]: ...
