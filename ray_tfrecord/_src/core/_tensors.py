"""Tensor columns held as serialized tensors: a feature whose one ``bytes_list`` value is a ``TensorProto``, as
``tf.io.serialize_tensor`` writes it (and Ray's ``write_tfrecords`` for its tensor columns).

A read schema's fixed-shape tensor column (``pa.fixed_shape_tensor``, Ray's ``ArrowTensorType`` /
``ArrowTensorTypeV2``) reads either form of its feature: numeric lists (the flat values, as this package
writes them) or serialized tensors, which the native codec parses (``native/tensor.h``), checking each
row's dtype and shape against the column's. Which form a file holds shows in its first record; the
``Decoder`` starts with lists and switches a column to serialized tensors when a chunk's feature is bytes
(``flip``). Arrow has no bfloat16: a column reads bfloat16 tensors when its field's metadata says
``ray_tfrecord.tensor_dtype: bfloat16``, as their bits (value type ``uint16``) or widened exactly to
``float32``; without that, a bfloat16 tensor is refused, never reinterpreted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from . import _native
from ._contract import DecodeSpec, EncodeColumn, Kind, Shape, Status, TFDtype
from .errors import SchemaError, TFRecordError

#: Field metadata naming the serialized tensors' dtype where Arrow has no type for it.
DTYPE_KEY = b"ray_tfrecord.tensor_dtype"
_RAY_TENSORS = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")
_DTYPES = {pa.int8(): TFDtype.INT8, pa.int16(): TFDtype.INT16, pa.int32(): TFDtype.INT32, pa.int64(): TFDtype.INT64,
           pa.uint8(): TFDtype.UINT8, pa.uint16(): TFDtype.UINT16, pa.uint32(): TFDtype.UINT32,
           pa.uint64(): TFDtype.UINT64, pa.float16(): TFDtype.HALF, pa.float32(): TFDtype.FLOAT,
           pa.float64(): TFDtype.DOUBLE, pa.bool_(): TFDtype.BOOL}
_ARROW = {v: k for k, v in _DTYPES.items()}
_TF_NAMES = {TFDtype.FLOAT: "float32", TFDtype.DOUBLE: "float64", TFDtype.HALF: "float16", 0: "no dtype (DT_INVALID)",
             7: "string", 8: "complex64", 18: "complex128", 20: "resource", 21: "variant"}
_MAX_RANK = 32  # RT_TENSOR_MAX_RANK


class TensorColumn(NamedTuple):
    """A tensor column: the serialized tensors' dtype and shape, and the leaf type the native codec writes."""

    dtype: TFDtype
    shape: tuple[int, ...]
    widen: bool
    leaf: pa.DataType

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def dtype_name(code: int) -> str:
    """TensorFlow's name of a ``DataType`` code."""
    if code in _TF_NAMES:
        return _TF_NAMES[code]
    try:
        return TFDtype(code).name.lower()
    except ValueError:
        return f"DataType {code}"


def tensor_shape(t: pa.DataType) -> tuple[int, ...] | None:
    """The shape of a fixed-shape tensor type (row-major, no permutation), or None."""
    if isinstance(t, pa.FixedShapeTensorType):
        perm = t.permutation
        if perm is not None and list(perm) != list(range(len(perm))):
            return None
        return tuple(int(d) for d in t.shape)
    if isinstance(t, pa.BaseExtensionType) and t.extension_name in _RAY_TENSORS:
        shape = getattr(t, "shape", None)
        if isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape):
            return shape
    return None


def tensor_column(field: pa.Field) -> TensorColumn | None:
    """How ``field`` reads serialized tensors, or None when it is no fixed-shape tensor column."""
    shape = tensor_shape(field.type)
    if shape is None or len(shape) > _MAX_RANK:
        return None
    value = field.type.storage_type.value_type
    asked = (field.metadata or {}).get(DTYPE_KEY)
    if asked is not None:
        if asked != b"bfloat16" or value not in (pa.uint16(), pa.float32()):
            raise SchemaError(f"field metadata {DTYPE_KEY.decode()}={asked.decode(errors='replace')!r} is for "
                              "bfloat16 tensors only, read as uint16 (their bits) or float32 (widened)",
                              column=field.name)
        return TensorColumn(TFDtype.BFLOAT16, shape, value == pa.float32(), value)
    dtype = _DTYPES.get(value)
    if dtype is None:
        return None
    return TensorColumn(dtype, shape, False, pa.uint8() if dtype == TFDtype.BOOL else value)


def tensor_columns(schema: pa.Schema) -> dict[int, TensorColumn]:
    """The schema's tensor columns by index."""
    found = {i: tensor_column(f) for i, f in enumerate(schema)}
    return {i: t for i, t in found.items() if t is not None}


def proto_spec(spec: DecodeSpec, t: TensorColumn) -> tuple[DecodeSpec, pa.DataType]:
    """The native spec of a column read as serialized tensors, and the Arrow type it decodes to."""
    native = DecodeSpec(spec.name, Kind.BYTES, Shape.FIXED, t.size, spec.section, spec.nullable,
                        int(t.dtype), t.shape, t.widen)
    return native, pa.list_(t.leaf, t.size)


def flip(e: _native.CodecError, index: dict[bytes, int], tensors: dict[int, TensorColumn],
         proto: frozenset[int]) -> frozenset[int] | None:
    """The tensor columns to read as serialized tensors after ``e``: a tensor column's feature was bytes
    where lists were read, or lists where serialized tensors were; None when ``e`` is no such error."""
    if e.status != Status.KIND_MISMATCH or e.column is None:
        return None
    i = index.get(e.column)
    if i is None or i not in tensors:
        return None
    if i in proto:
        return proto - {i} if e.actual != Kind.BYTES else None
    return proto | {i} if e.actual == Kind.BYTES else None


def _arrow_name(code: int) -> str:
    if code == TFDtype.BFLOAT16:
        return (f"uint16 (its bits) or float32 (widened), with field metadata "
                f"{{{DTYPE_KEY.decode()!r}: 'bfloat16'}}")
    arrow = _ARROW.get(code)  # type: ignore[call-overload]
    return str(arrow) if arrow is not None else "no Arrow tensor type (numbers and bool only)"


def message(e: _native.CodecError, t: pa.DataType | None, stream: str) -> str:
    """The message of a TENSOR_* status of column type ``t``."""
    status, actual, expected = Status(e.status), e.actual, e.expected
    shape = tensor_shape(t) if t is not None else None
    where = f"the record{stream}'s serialized tensor"
    if status == Status.TENSOR_MALFORMED:
        inner = _native.STATUS_MESSAGES.get(Status(actual).name, "malformed") if actual in set(Status) else "malformed"
        return (f"{where} is not a well-formed TensorProto (tf.io.serialize_tensor's bytes): {inner} "
                f"(at byte {e.offset} of the record)")
    if status == Status.TENSOR_DTYPE_MISMATCH:
        return (f"{where} is {dtype_name(actual)} but the column holds {dtype_name(expected)} ({t}); "
                f"to read it, declare the tensor's value type as {_arrow_name(actual)}")
    if status == Status.TENSOR_SHAPE_MISMATCH:
        if e.index < 0:
            rank = "unknown rank" if actual < 0 else f"rank {actual}"
            return f"{where} has {rank} but the column's shape {shape} has rank {expected}"
        return f"{where} has dimension {e.index} of size {actual} but the column's shape {shape} has {expected}"
    if status == Status.TENSOR_CONTENT_SIZE:
        return f"{where} holds {actual} bytes of tensor_content but its shape {shape} needs {expected}"
    if status == Status.TENSOR_TOO_MANY_VALUES:
        return f"{where} lists {actual} or more values but its shape {shape} holds {expected}"
    return f"{where} holds the value {actual}, outside the range of {dtype_name(expected)}"


# ------------------------------------------------------------------------------------------------
# inspect: bytes columns that hold serialized tensors


def sampled_tensors(values: Iterable[object]) -> tuple[TFDtype, tuple[int, ...]] | None:
    """The dtype and shape of a bytes column's sampled values when every one that is not null is a serialized
    tensor of that same dtype and shape whose values parse (the native parser, ``_native.tensor_describe``);
    None otherwise, or when none is set."""
    found = set()
    for v in values:
        if v is None:
            continue
        described = _native.tensor_describe(v) if isinstance(v, bytes) else None
        if described is None:
            return None
        found.add(described)
        if len(found) > 1:
            return None
    if not found:
        return None
    dtype, shape = found.pop()
    return TFDtype(dtype), shape


def tensor_hint(name: str, dtype: TFDtype, shape: tuple[int, ...]) -> str:
    """What to tell a user whose bytes column ``name`` holds serialized tensors of ``dtype`` and ``shape``."""
    dims = list(shape)
    if dtype == TFDtype.BFLOAT16:
        field = (f"pa.field({name!r}, pa.fixed_shape_tensor(pa.float32(), {dims}), "
                 f"metadata={{{DTYPE_KEY.decode()!r}: 'bfloat16'}})")
    else:
        arrow = "bool_" if dtype == TFDtype.BOOL else dtype_name(dtype)
        field = f"pa.field({name!r}, pa.fixed_shape_tensor(pa.{arrow}(), {dims}))"
    return (f"column {name!r}: bytes that are serialized tensors ({dtype_name(dtype)}, shape {dims}); read them as "
            f"tensors with schema= holding {field}")


# ------------------------------------------------------------------------------------------------
# encode


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def proto_prefix(t: TensorColumn) -> bytes:
    """A row's TensorProto up to its values, byte for byte as tf.io.serialize_tensor writes it: dtype (1),
    tensor_shape (2) with a dim (2) per dimension whose size (1) is omitted when 0 (proto3), and the
    tensor_content (4) header, omitted with the content when the tensor is empty."""
    dims = b"".join(_field(0x12, b"\x08" + _varint(d) if d else b"") for d in t.shape)
    nbytes = t.size * t.leaf.bit_width // 8
    return b"\x08" + _varint(int(t.dtype)) + _field(0x12, dims) + (b"\x22" + _varint(nbytes) if nbytes else b"")


def serialized_column(field: pa.Field, arr: pa.Array, t: TensorColumn) -> EncodeColumn:
    """A tensor column's rows as one serialized tensor each (a scalar bytes column); null rows have no feature."""
    if t.widen:
        raise SchemaError("bfloat16 tensors are written from their bits (a uint16 tensor column with the "
                          f"{DTYPE_KEY.decode()} metadata), not narrowed from float32", column=field.name)
    storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    n, rows = t.size, len(storage)
    if isinstance(storage, pa.FixedSizeListArray):
        start = storage.offset * n
    else:
        offsets = np.asarray(storage.offsets, np.int64)
        start = int(offsets[0])
        if not np.array_equal(offsets - start, np.arange(rows + 1, dtype=np.int64) * n):
            raise TFRecordError(f"a tensor row does not hold the {n} values of its shape {t.shape}", column=field.name)
    values = storage.values.slice(start, rows * n)
    if values.null_count:
        # A null row's slots may be null; a null inside a row has no serialized form.
        nulls = np.asarray(values.is_null()).reshape(rows, n).any(axis=1) & np.asarray(storage.is_valid())
        if nulls.any():
            raise TFRecordError(f"the tensor of row {int(np.flatnonzero(nulls)[0])} holds a null value, which a "
                                "serialized tensor cannot", column=field.name)
        values = values.fill_null(False if t.dtype == TFDtype.BOOL else 0)
    np_values = values.to_numpy(zero_copy_only=False)
    if t.dtype == TFDtype.BOOL:
        np_values = np_values.astype(np.uint8)
    prefix = np.frombuffer(proto_prefix(t), np.uint8)
    width = len(prefix) + n * np_values.itemsize
    data = np.empty((rows, width), np.uint8)
    data[:, : len(prefix)] = prefix
    if width > len(prefix):
        data[:, len(prefix):] = np.ascontiguousarray(np_values).view(np.uint8).reshape(rows, width - len(prefix))
    valid = storage.buffers()[0] if storage.null_count else None
    return EncodeColumn(field.name.encode(), Kind.BYTES, Shape.SCALAR, valid, storage.offset, None, None,
                        np.arange(rows + 1, dtype=np.int64) * width, data.reshape(-1))
