"""Arrow columns in the native encoder's layout: what ``codec.Encoder`` converts in Python (the
columns whose layout is not already the encoder's: other integer widths, bools, float64,
decimals, views, extension types), with the checks that make a value writable without loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _decimal
from ._casts import first_true
from ._contract import EncodeColumn, Kind, Shape
from .errors import TFRecordError
from .types import leaf_type


class Narrowing(NamedTuple):
    """Which lossy conversions to float32 the caller allowed."""

    float64: bool = False
    decimal: bool = False


def leaf_values(leaf: pa.Array, kind: Kind, column: str, narrowing: Narrowing,
                 row_of: Callable[[int], int] = int) -> tuple:
    """(values, data) buffers of a leaf array in the encoder's canonical layout; ``row_of`` maps a
    leaf element to its row, for messages."""
    t = leaf.type
    if kind == Kind.NULL:
        return None, None
    if kind == Kind.BYTES:
        if pa.types.is_binary_view(t) or pa.types.is_string_view(t):
            leaf = leaf.cast(pa.large_binary())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            leaf = leaf.view(pa.large_binary() if pa.types.is_large_string(t) else pa.binary())
        bufs = leaf.buffers()
        width = np.int64 if pa.types.is_large_binary(leaf.type) else np.int32
        offsets = np.frombuffer(bufs[1], width, count=leaf.offset + len(leaf) + 1)[leaf.offset:]
        return offsets.astype(np.int64), (bufs[2] if bufs[2] is not None else b"")
    if kind == Kind.INT64:
        if pa.types.is_uint64(t) and len(leaf) and pc.max(leaf).as_py() > 2**63 - 1:
            row = first_true(pc.greater(leaf, pa.scalar(2**63 - 1, pa.uint64())))
            raise TFRecordError(f"uint64 value {leaf[row].as_py()} (element {row}) exceeds the int64 range of "
                                "int64_list", column=column)
        leaf = leaf.cast(pa.int64())
        dtype: type[np.int64 | np.float32] = np.int64
    elif _decimal.is_decimal(t):
        return _decimal_values(leaf, column, narrowing.decimal, row_of), None
    else:
        if pa.types.is_float64(t) and not narrowing.float64:
            narrow = leaf.cast(pa.float32(), safe=False)
            exact = pc.or_(pc.equal(narrow.cast(pa.float64()), leaf), pc.is_nan(leaf))
            if pc.any(pc.invert(exact)).as_py():  # a null is no inexact value
                row = first_true(pc.invert(exact))
                raise TFRecordError(f"float64 value {leaf[row].as_py()!r} is not exactly representable as float32, "
                                    "TFRecord's only float type; pass allow_float64_narrowing=True to round it, or "
                                    "cast the column to float32", column=column)
        leaf = leaf.cast(pa.float32(), safe=False)
        dtype = np.float32
    return np.frombuffer(leaf.buffers()[1], dtype, count=leaf.offset + len(leaf))[leaf.offset:], None


def _decimal_values(leaf: pa.Array, column: str, allow_decimal_narrowing: bool,
                    row_of: Callable[[int], int]) -> np.ndarray:
    values, inexact = _decimal.to_float32(leaf)
    if not allow_decimal_narrowing and inexact.any():
        i = int(np.flatnonzero(inexact)[0])
        back = _decimal.text(_decimal.from_float32(pa.array(values[i:i + 1]), leaf.type)[0], 0)
        raise TFRecordError(f"decimal value {_decimal.text(leaf, i)} (row {row_of(i)}) has no exact float32 form, "
                            f"TFRecord's only float type (it would read back as {back}); pass "
                            "allow_decimal_narrowing=True to round it, or cast the "
                            "column to float32", column=column)
    return values


def _offsets(arr: pa.Array) -> np.ndarray:
    return arr.offsets.to_numpy().astype(np.int64)


def null_in_list(what: str, element: int, column: str) -> TFRecordError:
    return TFRecordError(f"null {what} at element {element}; TFRecord lists cannot hold nulls (a null row is "
                         "written as a missing feature)", column=column)


def _no_nulls_between(arr: pa.Array, lo: int, hi: int, column: str, what: str) -> None:
    part = arr.slice(lo, max(0, hi - lo))
    if part.null_count:
        raise null_in_list(what, lo + first_true(part.is_null()), column)


def _no_nulls_in_valid_rows(arr: pa.FixedSizeListArray, leaf: pa.Array, n: int, column: str) -> None:
    """A fixed-size list's null row is written as a missing feature, whatever its slots hold; a
    valid row's elements are written, and a null among them has no TFRecord form."""
    lo = arr.offset * n
    part = leaf.slice(lo, len(arr) * n)
    if not part.null_count:
        return
    bad = part.is_null().to_numpy(zero_copy_only=False).reshape(len(arr), n)
    bad &= arr.is_valid().to_numpy(zero_copy_only=False)[:, None]
    if bad.any():
        raise null_in_list("list element", lo + int(np.flatnonzero(bad)[0]), column)


def _row_of(*levels: np.ndarray) -> Callable[[int], int]:
    """Maps an element of a list column's leaf values to its row; ``levels``: the offsets from the
    rows down, as the encoder has them."""
    def row(i: int) -> int:
        for offsets in reversed(levels):
            i = int(np.searchsorted(offsets, i, "right")) - 1
        return i
    return row


def encode_column(f: pa.Field, arr: pa.Array, spec: tuple[Kind, Shape, int], narrowing: Narrowing) -> EncodeColumn:
    kind, shape, n = spec
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    valid = arr.buffers()[0] if arr.null_count else None
    rowoff = inner = None
    row_of: Callable[[int], int] = int
    if shape == Shape.SCALAR:
        leaf = arr
    elif shape == Shape.FIXED:
        leaf = arr.values
        rowoff = arr.offset * n + np.arange(len(arr) + 1, dtype=np.int64) * n
        row_of = _row_of(rowoff)
        shape = Shape.LIST
        _no_nulls_in_valid_rows(arr, leaf, n, f.name)
    else:
        rowoff = _offsets(arr)
        leaf = arr.values
        row_of = _row_of(rowoff)
        if shape == Shape.SEQUENCE:
            steps = leaf
            _no_nulls_between(steps, int(rowoff[0]), int(rowoff[-1]), f.name, "inner list")
            inner = _offsets(steps)
            leaf = steps.values
            row_of = _row_of(rowoff, inner)
            lo, hi = (int(inner[rowoff[0]]), int(inner[rowoff[-1]])) if len(arr) else (0, 0)
        else:
            lo, hi = (int(rowoff[0]), int(rowoff[-1])) if len(arr) else (0, 0)
        _no_nulls_between(leaf, lo, hi, f.name, "list element")
    vals, data = leaf_values(leaf, kind, f.name, narrowing, row_of)
    return EncodeColumn(f.name.encode(), kind, shape, valid, arr.offset, rowoff, inner, vals, data)


def natively_readable(t: pa.DataType) -> bool:
    """Whether the native encoder reads a column of type ``t`` as Arrow lays it out (its lists are
    what ``column_spec`` allows; the leaf decides)."""
    return not isinstance(t, pa.BaseExtensionType) and any(leaf_type(t) == c for c in _READABLE_LEAVES)


_READABLE_LEAVES = (pa.int64(), pa.float32(), pa.binary(), pa.large_binary(), pa.string(), pa.large_string(), pa.null())
