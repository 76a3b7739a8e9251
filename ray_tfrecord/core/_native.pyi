"""Type stub of the native codec (ray_tfrecord/core/native/module.c). Enum values: see _contract.py."""

from collections.abc import Buffer as BufferLike
from collections.abc import Sequence
from typing import Any, Final

HARDWARE_CRC: Final[bool]
STATUS: Final[dict[str, int]]
KINDS: Final[dict[str, int]]
SHAPES: Final[dict[str, int]]
SECTIONS: Final[dict[str, int]]
RECORD_TYPES: Final[dict[str, int]]

class Buffer:
    """Read-only memory owned by the native codec (supports the buffer protocol)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class CodecError(ValueError):
    """A record the core could not decode or inspect; str() is the status's message."""

    status: int
    record: int
    column: bytes | None
    offset: int
    actual: int
    expected: int
    other_record: int

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

class DecodedColumn(tuple[Any, ...]):
    validity: Buffer | None
    null_count: int
    row_offsets: Buffer | None
    inner_offsets: Buffer | None
    values: Buffer
    data: Buffer | None
    value_count: int
    step_count: int

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

def scan(buffer: BufferLike, verify: bool = True, final: bool = True, skip: bool = False, limit: int = -1,
         resync: bool = False) -> ScanResult: ...
def masked_crc32c(data: BufferLike, /) -> int: ...
def decode(buffer: BufferLike, positions: BufferLike, lengths: BufferLike, record_type: int,
           columns: Sequence[Any], /) -> list[DecodedColumn]: ...
def inspect(buffer: BufferLike, positions: BufferLike, lengths: BufferLike, record_type: int, /
            ) -> list[InspectedColumn]: ...
def byte_array(buffer: BufferLike, positions: BufferLike, lengths: BufferLike, /) -> ByteArray: ...
def encode(record_type: int, nrows: int, columns: Sequence[Any], /) -> Encoded: ...
