"""The named contract with the native codec (``ray_tfrecord._src.core._native``), in one place.

The enums take their values from the dicts the extension exports, so Python never re-types a native
number (their names are spelled out for type checkers; tests/test_contract.py checks they are
exactly the exported ones); results come back as named struct sequences (``ScanResult``, ...) or,
for a decode, an Arrow C data interface batch (``Batch``), and specs go in as the NamedTuples
below, which the extension reads by field name.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

from . import _native


class Status(IntEnum):
    """Every way a native call fails. ``MALFORMED_*``: a protobuf wire-format violation."""

    OK = _native.STATUS["OK"]
    TRUNCATED_HEADER = _native.STATUS["TRUNCATED_HEADER"]
    TRUNCATED_DATA = _native.STATUS["TRUNCATED_DATA"]
    BAD_LENGTH_CRC = _native.STATUS["BAD_LENGTH_CRC"]
    BAD_DATA_CRC = _native.STATUS["BAD_DATA_CRC"]
    MALFORMED_TAG = _native.STATUS["MALFORMED_TAG"]
    MALFORMED_FIELD_NUMBER = _native.STATUS["MALFORMED_FIELD_NUMBER"]
    MALFORMED_VARINT = _native.STATUS["MALFORMED_VARINT"]
    MALFORMED_FIXED64 = _native.STATUS["MALFORMED_FIXED64"]
    MALFORMED_FIXED32 = _native.STATUS["MALFORMED_FIXED32"]
    MALFORMED_LENGTH = _native.STATUS["MALFORMED_LENGTH"]
    MALFORMED_OVERRUN = _native.STATUS["MALFORMED_OVERRUN"]
    MALFORMED_WIRE_TYPE = _native.STATUS["MALFORMED_WIRE_TYPE"]
    MALFORMED_PACKED_INT64 = _native.STATUS["MALFORMED_PACKED_INT64"]
    MALFORMED_PACKED_FLOAT = _native.STATUS["MALFORMED_PACKED_FLOAT"]
    KIND_MISMATCH = _native.STATUS["KIND_MISMATCH"]
    COUNT_MISMATCH = _native.STATUS["COUNT_MISMATCH"]
    TENSOR_MALFORMED = _native.STATUS["TENSOR_MALFORMED"]
    TENSOR_DTYPE_MISMATCH = _native.STATUS["TENSOR_DTYPE_MISMATCH"]
    TENSOR_SHAPE_MISMATCH = _native.STATUS["TENSOR_SHAPE_MISMATCH"]
    TENSOR_CONTENT_SIZE = _native.STATUS["TENSOR_CONTENT_SIZE"]
    TENSOR_TOO_MANY_VALUES = _native.STATUS["TENSOR_TOO_MANY_VALUES"]
    TENSOR_VALUE_RANGE = _native.STATUS["TENSOR_VALUE_RANGE"]
    NULL_INNER_LIST = _native.STATUS["NULL_INNER_LIST"]
    NULL_LIST_ELEMENT = _native.STATUS["NULL_LIST_ELEMENT"]
    BYTES_TOO_LARGE = _native.STATUS["BYTES_TOO_LARGE"]
    TOO_MANY_VALUES = _native.STATUS["TOO_MANY_VALUES"]
    RECORDS_TOO_LARGE = _native.STATUS["RECORDS_TOO_LARGE"]
    OUT_OF_MEMORY = _native.STATUS["OUT_OF_MEMORY"]
    BAD_SPAN = _native.STATUS["BAD_SPAN"]
    BAD_SPEC = _native.STATUS["BAD_SPEC"]
    VALIDITY_TOO_SHORT = _native.STATUS["VALIDITY_TOO_SHORT"]
    BYTES_OFFSETS_OUT_OF_RANGE = _native.STATUS["BYTES_OFFSETS_OUT_OF_RANGE"]
    FEWER_VALUES_THAN_ROWS = _native.STATUS["FEWER_VALUES_THAN_ROWS"]
    FEWER_LIST_OFFSETS_THAN_ROWS = _native.STATUS["FEWER_LIST_OFFSETS_THAN_ROWS"]
    SEQUENCE_OFFSETS_OUT_OF_RANGE = _native.STATUS["SEQUENCE_OFFSETS_OUT_OF_RANGE"]
    INNER_OFFSETS_OUT_OF_RANGE = _native.STATUS["INNER_OFFSETS_OUT_OF_RANGE"]
    NULL_LIST_HOLDS_VALUES = _native.STATUS["NULL_LIST_HOLDS_VALUES"]
    LIST_OFFSETS_OUT_OF_RANGE = _native.STATUS["LIST_OFFSETS_OUT_OF_RANGE"]
    JPEG_CORRUPT = _native.STATUS["JPEG_CORRUPT"]
    JPEG_UNSUPPORTED = _native.STATUS["JPEG_UNSUPPORTED"]
    JPEG_BAD_WINDOW = _native.STATUS["JPEG_BAD_WINDOW"]
    SIZE_MISMATCH = _native.STATUS["SIZE_MISMATCH"]


class Kind(IntEnum):
    """A feature's kind (``NONE``: no kind set); the column's leaf type."""

    NONE = _native.KINDS["NONE"]
    BYTES = _native.KINDS["BYTES"]
    FLOAT = _native.KINDS["FLOAT"]
    INT64 = _native.KINDS["INT64"]
    NULL = _native.KINDS["NULL"]


class Shape(IntEnum):
    """A column's shape: scalar, list, fixed-size list, or SequenceExample feature_list (list of lists)."""

    SCALAR = _native.SHAPES["SCALAR"]
    LIST = _native.SHAPES["LIST"]
    FIXED = _native.SHAPES["FIXED"]
    SEQUENCE = _native.SHAPES["SEQUENCE"]


class Section(IntEnum):
    """Which map of a record a feature lives in."""

    CONTEXT = _native.SECTIONS["CONTEXT"]
    FEATURE_LISTS = _native.SECTIONS["FEATURE_LISTS"]


class TFDtype(IntEnum):
    """TensorFlow's ``DataType`` codes of the tensors a tensor column reads (numbers and bool)."""

    FLOAT = _native.TF_DTYPES["FLOAT"]
    DOUBLE = _native.TF_DTYPES["DOUBLE"]
    INT32 = _native.TF_DTYPES["INT32"]
    UINT8 = _native.TF_DTYPES["UINT8"]
    INT16 = _native.TF_DTYPES["INT16"]
    INT8 = _native.TF_DTYPES["INT8"]
    INT64 = _native.TF_DTYPES["INT64"]
    BOOL = _native.TF_DTYPES["BOOL"]
    BFLOAT16 = _native.TF_DTYPES["BFLOAT16"]
    UINT16 = _native.TF_DTYPES["UINT16"]
    HALF = _native.TF_DTYPES["HALF"]
    UINT32 = _native.TF_DTYPES["UINT32"]
    UINT64 = _native.TF_DTYPES["UINT64"]


class RecordTypeCode(IntEnum):
    """The native code of each record type."""

    EXAMPLE = _native.RECORD_TYPES["EXAMPLE"]
    SEQUENCE_EXAMPLE = _native.RECORD_TYPES["SEQUENCE_EXAMPLE"]
    BYTE_ARRAY = _native.RECORD_TYPES["BYTE_ARRAY"]


def is_malformed(status: int) -> bool:
    """Whether ``status`` says a record's protobuf is malformed."""
    return Status(status).name.startswith("MALFORMED_")


class DecodeSpec(NamedTuple):
    """One column for ``_native.Decoder``."""

    name: bytes
    kind: Kind
    shape: Shape
    fixed_size: int
    section: Section
    nullable: bool
    # A tensor column (kind BYTES, shape FIXED): each feature one serialized TensorProto of this dtype
    # (0: not a tensor column) and shape, bfloat16 widened to float32 when tensor_widen.
    tensor_dtype: int = 0
    tensor_shape: tuple[int, ...] = ()
    tensor_widen: bool = False


class EncodeSpec(NamedTuple):
    """One column for ``_native.Encoder``: its shape as ``DecodeSpec``'s (a fixed-size list is FIXED)."""

    name: bytes
    kind: Kind
    shape: Shape
    fixed_size: int


class EncodeColumn(NamedTuple):
    """One column's Arrow buffers for ``_native.encode`` (offsets and bytes offsets as int64)."""

    name: bytes
    kind: Kind
    shape: Shape
    validity: Any
    validity_offset: int
    row_offsets: Any
    inner_offsets: Any
    values: Any
    data: Any
