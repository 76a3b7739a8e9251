"""Decoded columns to the read schema's types where they differ from what the native decoder
writes: other integer and float widths, strings (UTF-8 checked), decimals, large and extension
types. Each failure is a ``DecodeError`` naming the file, the first bad record and the column.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _decimal
from .errors import DecodeError
from .framing import RecordChunk
from .types import leaf_type


def first_true(mask: pa.Array) -> int:
    """The index of the first true value of a boolean array that holds one."""
    return int(pc.index(mask, True).as_py())


def cast(arr: pa.Array, field: pa.Field, chunk: RecordChunk) -> pa.Array:
    """``arr``, decoded from ``chunk``, as ``field``'s type (checked: no value changes)."""
    if arr.type == field.type:
        return arr
    if isinstance(field.type, pa.BaseExtensionType):
        storage = cast(arr, pa.field(field.name, field.type.storage_type), chunk)
        return pa.ExtensionArray.from_storage(field.type, storage)
    leaf = leaf_type(field.type)
    if _decimal.is_decimal(leaf):
        arr = _decimals(arr, leaf, chunk, field.name)
        if arr.type == field.type:
            return arr
    try:
        return arr.cast(field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        row = _first_bad_row(arr, field.type)
        offset = chunk.offset(row) if row is not None else None
        raise DecodeError(f"cannot convert {arr.type} to {field.type}: {e}", path=chunk.path, offset=offset,
                          column=field.name) from None


def _decimals(arr: pa.Array, t: pa.Decimal128Type | pa.Decimal256Type, chunk: RecordChunk,
              column: str) -> pa.Array:
    """A decoded float32 column (scalar or nested lists) with its values as decimals of type ``t``."""
    out, row, value = _decimal_leaf(arr, t)
    if row is None:
        return out
    if not np.isfinite(value):
        msg = f"float_list value {np.float32(value)} has no decimal form; read the column as float32"
    else:
        need = _decimal.digits(value, t.scale)
        wide = pa.decimal128 if need <= 38 else pa.decimal256
        fix = f"ask for {wide(need, t.scale)} in the schema" if need <= 76 else "read the column as float32"
        msg = (f"float_list value {np.float32(value)} has {need} digits at scale {t.scale} (rounded half to even), "
               f"more than {t} holds; {fix}")
    raise DecodeError(msg, path=chunk.path, offset=chunk.offset(row), column=column)


def _decimal_leaf(arr: pa.Array, t: pa.Decimal128Type | pa.Decimal256Type) -> tuple[pa.Array, int | None, float]:
    """(``arr`` with decimal leaves, the first row holding a value with no ``t`` form or None, that value)."""
    if isinstance(arr, (pa.ListArray, pa.FixedSizeListArray)):
        child, bad, value = _decimal_leaf(arr.values, t)
        if isinstance(arr, pa.ListArray):
            new_type, nbufs = pa.list_(child.type), 2
            if bad is not None:
                offsets = np.frombuffer(arr.buffers()[1], np.int32, count=arr.offset + len(arr) + 1)
                bad = int(np.searchsorted(offsets, bad, "right")) - 1 - arr.offset
        else:
            size = arr.type.list_size
            new_type, nbufs = pa.list_(child.type, size), 1
            bad = None if bad is None else bad // size - arr.offset
        out = pa.Array.from_buffers(new_type, len(arr), arr.buffers()[:nbufs], null_count=arr.null_count,
                                    offset=arr.offset, children=[child])
        return out, bad, value
    out, mask = _decimal.from_float32(arr, t)
    if not mask.any():
        return out, None, 0.0
    i = int(np.flatnonzero(mask)[0])
    return out, i, arr[i].as_py()


def _first_bad_row(arr: pa.Array, t: pa.DataType) -> int | None:
    for i in range(len(arr)):  # error path only: find the row to name in the message
        try:
            arr.slice(i, 1).cast(t, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return i
    return None
