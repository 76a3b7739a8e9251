"""The type mapping between TFRecord features and Arrow: which Arrow types a feature kind and
shape decode to, which Arrow types can be written, and the native codes of record types.

Shared by the codec (decode and encode), schema inference and the TensorFlow feed, so that
each asks the same questions of an Arrow type in the same words.
"""

from __future__ import annotations

import pyarrow as pa

from . import _decimal, options
from ._contract import Kind, RecordTypeCode, Shape
from .errors import SchemaError

_RECORD_TYPE_CODES = {"Example": RecordTypeCode.EXAMPLE, "SequenceExample": RecordTypeCode.SEQUENCE_EXAMPLE,
                      "ByteArray": RecordTypeCode.BYTE_ARRAY}
#: How a feature kind is spelled in messages (the protobuf field's name).
KIND_NAMES = {Kind.BYTES: "bytes_list", Kind.FLOAT: "float_list", Kind.INT64: "int64_list", Kind.NULL: "no kind"}
#: The Arrow type the native decoder writes for each kind.
NATIVE_LEAF = {Kind.BYTES: pa.binary(), Kind.FLOAT: pa.float32(), Kind.INT64: pa.int64(), Kind.NULL: pa.null()}


def record_type_code(record_type: str) -> int:
    """The native code of a record type name (checked)."""
    return _RECORD_TYPE_CODES[options.record_type(record_type)]


def is_bytes(t: pa.DataType) -> bool:
    """Binary or string in any of Arrow's layouts (plain, large, view)."""
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary_view(t) or pa.types.is_string_view(t))


def leaf_kind(t: pa.DataType) -> Kind | None:
    """The feature kind an Arrow leaf type is written as, or None if it has no TFRecord form."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return Kind.INT64
    if pa.types.is_floating(t) or _decimal.is_decimal(t):
        return Kind.FLOAT
    if is_bytes(t):
        return Kind.BYTES
    if pa.types.is_null(t):
        return Kind.NULL
    return None


def is_var_list(t: pa.DataType) -> bool:
    """A variable-length list (32- or 64-bit offsets)."""
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def column_spec(field: pa.Field, record_type: str) -> tuple[Kind, Shape, int]:
    """(kind, shape, fixed length) of a column, or SchemaError naming the column and type.

    An extension type (such as Ray's fixed-shape tensor, a flattened list) is its storage type.
    """
    t = field.type.storage_type if isinstance(field.type, pa.BaseExtensionType) else field.type
    shape, n = Shape.SCALAR, 0
    if is_var_list(t) and is_var_list(t.value_type):
        if record_type != "SequenceExample":
            raise SchemaError(f"type {t} is a SequenceExample feature_list; use record_type='SequenceExample'",
                              column=field.name)
        shape, t = Shape.SEQUENCE, t.value_type.value_type
    elif is_var_list(t):
        shape, t = Shape.LIST, t.value_type
    elif pa.types.is_fixed_size_list(t):
        shape, n, t = Shape.FIXED, t.list_size, t.value_type
    kind = leaf_kind(t)
    if kind is None or (kind == Kind.NULL and shape in (Shape.SCALAR, Shape.FIXED)):
        raise SchemaError(f"type {field.type} has no TFRecord representation "
                          "(int/bool/float/string/binary scalars and lists of them only)", column=field.name)
    return kind, shape, n


def native_type(kind: Kind, shape: Shape, n: int) -> pa.DataType:
    """The Arrow type the native decoder writes for a column of this kind and shape."""
    leaf = NATIVE_LEAF[kind]
    if shape == Shape.SCALAR:
        return leaf
    if shape == Shape.FIXED:
        return pa.list_(leaf, n)
    if shape == Shape.LIST:
        return pa.list_(leaf)
    return pa.list_(pa.list_(leaf))


def leaf_type(t: pa.DataType) -> pa.DataType:
    """The element type under any nesting of lists."""
    while is_var_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def single_chunk(col: pa.ChunkedArray) -> pa.Array:
    """``col`` as one array: its only chunk as it is, several concatenated."""
    if col.num_chunks == 1:
        return col.chunk(0)
    if col.num_chunks == 0:
        return pa.array([], type=col.type)
    return col.combine_chunks()
