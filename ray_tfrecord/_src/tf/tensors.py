"""Arrow columns as TensorFlow tensors: one plan per column, worked out once from its type.

Every conversion uses vectorised numpy views (no Python work per row): fixed-length columns
become dense tensors, variable-length lists become ``tf.RaggedTensor`` built from the Arrow
offsets, and ``list<list<T>>`` (SequenceExample feature lists) becomes a ragged tensor with two
ragged dimensions.  A null row of a scalar or fixed-size column (a record without the feature)
is refused unless ``defaults=`` gives the value to fill it with, as ``FixedLenFeature``'s
``default_value`` does; a null variable-length list is an empty row.

``type_spec`` and ``tensors_from_arrow`` are the public face; ``ColumnPlan`` and
``column_plans`` are what the ``tf.data`` feed (``ray_tfrecord._src.tf.feed``) and batch
inference build on.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf
from ray.data import Schema

from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.core.types import is_bytes, is_var_list, single_chunk

#: A batch of one column, dense or ragged.
Tensor: TypeAlias = tf.Tensor | tf.RaggedTensor

_NUMERIC_DTYPES: dict[pa.DataType, tf.DType] = {
    pa.bool_(): tf.bool,
    pa.int8(): tf.int8,
    pa.int16(): tf.int16,
    pa.int32(): tf.int32,
    pa.int64(): tf.int64,
    pa.uint8(): tf.uint8,
    pa.uint16(): tf.uint16,
    pa.uint32(): tf.uint32,
    pa.uint64(): tf.uint64,
    pa.float16(): tf.float16,
    pa.float32(): tf.float32,
    pa.float64(): tf.float64,
}

# A value of each kind, to show in a message what a default looks like.
_EXAMPLE_VALUES = {tf.string: 'b""', tf.bool: "False"}

# Python and numpy types a default may hold, by the kind of the column's values;
# anything else (a float for an integer column, say) would be silently converted.
_INTEGERS = (int, np.integer)
_DEFAULT_TYPES: dict[str, tuple[type, ...]] = {
    "bytes or str": (bytes, str),
    "bool": (bool, np.bool_),
    "int": _INTEGERS,
    "int or float": (*_INTEGERS, float, np.floating),
}

_Converter = Callable[[pa.Array], tuple[np.ndarray, list[np.ndarray]]]


@dataclass(frozen=True)
class ColumnPlan:
    """How arrays of one Arrow type become a tensor, worked out once per column.

    The tensor has ``ragged_rank`` variable-length levels over fixed
    ``inner_shape`` dims of ``dtype``.  ``convert`` splits an array into leaf
    values shaped ``(k, *inner_shape)`` (a zero-copy view of the Arrow buffer
    for numeric types) and one int64 row-splits array per ragged level (the
    rebased Arrow offsets), so no work is done per row.
    """

    ragged_rank: int
    inner_shape: tuple[int, ...]
    dtype: tf.DType
    convert: _Converter

    @property
    def spec(self) -> tf.TypeSpec:
        """The ``tf.TypeSpec`` of a batch of the column."""
        if self.ragged_rank == 0:
            return tf.TensorSpec((None, *self.inner_shape), self.dtype)
        return tf.RaggedTensorSpec(
            shape=(None,) * (self.ragged_rank + 1) + self.inner_shape,
            dtype=self.dtype,
            ragged_rank=self.ragged_rank,
            row_splits_dtype=tf.int64,
        )

    @property
    def example_default(self) -> str:
        """A ``defaults=`` value of this plan's row shape and kind, as Python source."""
        value = _EXAMPLE_VALUES.get(self.dtype, "0.0" if self.dtype.is_floating else "0")
        for n in reversed(self.inner_shape):
            value = f"[{value}] * {n}"
        return value

    @property
    def component_specs(self) -> list[tuple[tuple[int, ...], tf.DType]]:
        """Inner shape and dtype of each array ``convert`` returns, values first."""
        return [(self.inner_shape, self.dtype)] + [((), tf.int64)] * self.ragged_rank


def _plan(t: pa.DataType, column: str) -> ColumnPlan:
    """The plan for Arrow type ``t``; raises TypeError for types TensorFlow cannot hold."""
    shape = _tensor_extension_shape(t)
    if shape is not None:
        leaf = _plan(t.storage_type.value_type, column)
        if leaf.ragged_rank or leaf.inner_shape or 0 in shape:
            raise TypeError(f"column {column!r}: tensor extension {t} is not supported")
        return _dense_plan(leaf, shape, _tensor_storage_values, column)
    if is_var_list(t):
        inner = _plan(t.value_type, column)
        convert = functools.partial(_ragged_values, inner=inner.convert)
        return ColumnPlan(inner.ragged_rank + 1, inner.inner_shape, inner.dtype, convert)
    if pa.types.is_fixed_size_list(t):
        inner = _plan(t.value_type, column)
        if inner.ragged_rank:
            raise TypeError(
                f"column {column!r}: a fixed-size list of variable-length lists ({t}) "
                "has no tf.RaggedTensor equivalent; store it as list<list<T>>"
            )
        if t.list_size == 0:
            raise TypeError(f"column {column!r}: zero-length fixed-size lists are not supported")
        return _dense_plan(inner, (t.list_size, *inner.inner_shape), pa.FixedSizeListArray.flatten, column)
    if is_bytes(t):
        # Views have no numpy conversion; Arrow packs strings into one buffer, so copy.
        as_binary = pa.types.is_binary_view(t) or pa.types.is_string_view(t)
        return _leaf_plan(tf.string, column, zero_copy=False, as_binary=as_binary)
    if t in _NUMERIC_DTYPES:
        # Arrow packs booleans into bits: those must be copied.
        return _leaf_plan(_NUMERIC_DTYPES[t], column, zero_copy=t != pa.bool_(), as_binary=False)
    raise TypeError(f"column {column!r}: Arrow type {t} has no TensorFlow equivalent")


def _tensor_extension_shape(t: pa.DataType) -> tuple[int, ...] | None:
    """Shape of a fixed-shape tensor extension type (Ray's or Arrow's), else None."""
    if isinstance(t, pa.BaseExtensionType):
        shape = getattr(t, "shape", None)
        # Arrow's fixed_shape_tensor may store its dims permuted; only the row-major layout is a view.
        permutation = getattr(t, "permutation", None)
        if permutation and list(permutation) != sorted(permutation):
            return None
        if shape is not None and all(isinstance(d, int) and d >= 0 for d in shape):
            return tuple(shape)
    return None


def _leaf_plan(dtype: tf.DType, column: str, *, zero_copy: bool, as_binary: bool) -> ColumnPlan:
    convert = functools.partial(_leaf_values, column=column, zero_copy=zero_copy, as_binary=as_binary)
    return ColumnPlan(0, (), dtype, convert)


def _dense_plan(
    inner: ColumnPlan, shape: tuple[int, ...], children: Callable[[pa.Array], pa.Array], column: str
) -> ColumnPlan:
    """A dense tensor of ``shape`` per row, from the rows' ``children`` converted by ``inner``."""
    convert = functools.partial(_dense_values, column=column, children=children, inner=inner.convert, shape=shape)
    return ColumnPlan(0, shape, inner.dtype, convert)


def _leaf_values(
    arr: pa.Array, *, column: str, zero_copy: bool, as_binary: bool
) -> tuple[np.ndarray, list[np.ndarray]]:
    if arr.null_count:
        _refuse_nulls(arr, column, _plan(arr.type, column))
    if as_binary:
        arr = arr.cast(pa.large_binary())
    return arr.to_numpy(zero_copy_only=zero_copy), []


def _ragged_values(arr: pa.Array, *, inner: _Converter) -> tuple[np.ndarray, list[np.ndarray]]:
    child, splits = _list_children(arr)
    values, nested = inner(child)
    return values, [splits, *nested]


def _dense_values(
    arr: pa.Array,
    *,
    column: str,
    children: Callable[[pa.Array], pa.Array],
    inner: _Converter,
    shape: tuple[int, ...],
) -> tuple[np.ndarray, list[np.ndarray]]:
    if arr.null_count:
        _refuse_nulls(arr, column, _plan(arr.type, column))
    elements = children(arr)
    if elements.null_count:
        # Not an absent feature (TFRecord cannot express this), so defaults= is no fix.
        raise SchemaError(
            f"{elements.null_count} values inside the rows of this batch are null, and a TensorFlow tensor "
            "cannot hold nulls; defaults= fills only whole null rows, so fill these first "
            "(Dataset.map_batches with pyarrow.compute.fill_null on the list's values)",
            column=column,
        )
    values, _ = inner(elements)
    return values.reshape((len(arr), *shape)), []


def _tensor_storage_values(arr: pa.Array) -> pa.Array:
    # Ray stores tensors as (large) lists of the flattened elements, Arrow's fixed_shape_tensor as a
    # fixed-size list of them; either way the rows' elements are one slice of one buffer.
    storage = arr.storage
    if pa.types.is_fixed_size_list(storage.type):
        return storage.flatten()
    return _list_children(storage)[0]


def _refuse_nulls(arr: pa.Array, column: str, plan: ColumnPlan) -> None:
    raise SchemaError(
        f"{arr.null_count} of the {len(arr)} rows in this batch are null (records without the feature), "
        "and a TensorFlow tensor cannot hold nulls; pass "
        f"defaults={{{column!r}: {plan.example_default}}} to fill them, as FixedLenFeature's default_value does",
        column=column,
    )


def _with_default(plan: ColumnPlan, arrow_type: pa.DataType, column: str, value: Any) -> ColumnPlan:
    """``plan`` with null rows replaced by ``value`` before conversion.

    ``value`` must be one row of the column as TensorFlow's ``FixedLenFeature``
    ``default_value`` would be: the row's shape, and values of the column's kind
    (no float for an integer column, no number for a string column), so that
    nothing is converted behind the caller's back.
    """

    def refuse(problem: str) -> SchemaError:
        return SchemaError(
            f"defaults={{{column!r}: {value!r}}}: {problem}; give one row of {arrow_type}, "
            f"e.g. defaults={{{column!r}: {plan.example_default}}}",
            column=column,
        )

    if plan.ragged_rank:
        raise SchemaError(
            f"defaults={{{column!r}: ...}}: the column is {arrow_type}, a variable-length list, whose nulls "
            "(records without the feature) already become empty rows; defaults apply to scalar and "
            "fixed-size columns only, so drop this entry",
            column=column,
        )
    given = np.asarray(value, dtype=object)
    if given.shape != plan.inner_shape:
        raise refuse(f"it has shape {given.shape} but a row has shape {plan.inner_shape}")
    kind = (
        "bytes or str" if plan.dtype == tf.string
        else "bool" if plan.dtype == tf.bool
        else "int or float" if plan.dtype.is_floating
        else "int"
    )
    # bool is an int subclass in Python; True is not a number here.
    wrong = [v for v in given.flat if not isinstance(v, _DEFAULT_TYPES[kind])
             or (kind != "bool" and isinstance(v, (bool, np.bool_)))]
    if wrong:
        raise refuse(f"{wrong[0]!r} is a {type(wrong[0]).__name__}, not {kind}")
    storage = arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else arrow_type
    try:
        fill = pa.scalar(given.tolist(), storage)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise refuse(str(e)) from None
    return dataclasses.replace(plan, convert=functools.partial(_filled, fill=fill, convert=plan.convert))


def _filled(arr: pa.Array, *, fill: pa.Scalar, convert: _Converter) -> tuple[np.ndarray, list[np.ndarray]]:
    if arr.null_count:
        if isinstance(arr, pa.ExtensionArray):
            arr = pa.ExtensionArray.from_storage(arr.type, pc.fill_null(arr.storage, fill))
        else:
            arr = pc.fill_null(arr, fill)
    return convert(arr)


def _list_children(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The values a (possibly sliced) list array covers, and its row splits from 0."""
    if arr.null_count:
        # A null list is an absent feature: treat it as empty. Arrow lets a null
        # slot's offsets span values, so rebuild offsets from the valid lengths.
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy()
        splits = np.zeros(len(arr) + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        return arr.flatten(), splits
    offsets = arr.offsets.to_numpy()
    start, end = int(offsets[0]), int(offsets[-1])
    return arr.values.slice(start, end - start), (offsets - start).astype(np.int64, copy=False)


def is_numeric(arrow_type: pa.DataType) -> bool:
    """Whether ``arrow_type`` holds values of a numeric tensor (bool, integer or floating point)."""
    return arrow_type in _NUMERIC_DTYPES


def as_tensor(values: Any, splits: Sequence[Any]) -> Tensor:
    """Values and row splits (numpy eagerly, tensors in the graph) as one tensor."""
    if splits:
        return tf.RaggedTensor.from_nested_row_splits(values, splits, validate=False)
    return tf.convert_to_tensor(values)


def type_spec(arrow_type: pa.DataType) -> tf.TypeSpec:
    """The ``tf.TypeSpec`` of a batch of one Arrow column, as ``tf_dataset`` yields it.

    ``fixed_size_list<T>[n]`` (nested for more dimensions) and fixed-shape tensor
    extension types give a dense ``tf.TensorSpec`` of shape ``(None, *dims)``;
    each variable-length ``list`` level adds a ragged dimension
    (``tf.RaggedTensorSpec`` with int64 row splits); binary and string give
    ``tf.string``.

    >>> import pyarrow as pa
    >>> type_spec(pa.list_(pa.list_(pa.float32())))
    RaggedTensorSpec(TensorShape([None, None, None]), tf.float32, 2, tf.int64)
    """
    return _plan(arrow_type, "<column>").spec


def tensors_from_arrow(
    table: pa.Table, columns: Sequence[str] | None = None, *, defaults: Mapping[str, Any] | None = None
) -> dict[str, Tensor]:
    """Convert Arrow columns to tensors eagerly, with the same mapping as ``tf_dataset``.

    Useful where a batch arrives as Arrow outside a ``tf.data`` pipeline, such as
    a ``map_batches`` function that runs a model.  ``defaults`` fills null rows
    of scalar and fixed-size columns, as in ``tf_dataset``.

    >>> import pyarrow as pa
    >>> tensors_from_arrow(pa.table({"x": pa.array([[1], [2, 3]])}))["x"]
    <tf.RaggedTensor [[1], [2, 3]]>
    """
    names = table.column_names if columns is None else list(columns)
    plans = column_plans(table.schema, names, defaults)
    return {name: as_tensor(*plan.convert(single_chunk(table.column(name)))) for name, plan in plans.items()}


def column_plans(
    schema: pa.Schema, columns: Sequence[str], defaults: Mapping[str, Any] | None
) -> dict[str, ColumnPlan]:
    """A plan per distinct name in ``columns``, in order, filling nulls from ``defaults``.

    Raises ``ValueError`` if a column is not in ``schema``, ``TypeError`` if TensorFlow cannot
    hold its type, and ``SchemaError`` for a default that does not fit its column (see
    ``defaults=`` of ``tf_dataset``).
    """
    wanted = list(dict.fromkeys(columns))
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise ValueError(f"columns {missing} are not in the dataset; it has {schema.names}")
    defaults = dict(defaults or {})
    unknown = [c for c in defaults if c not in wanted]
    if unknown:
        raise SchemaError(
            f"defaults= names {unknown}, which the feed does not convert; it converts {wanted} "
            "(the features and label columns)",
            column=unknown[0],
        )
    plans: dict[str, ColumnPlan] = {}
    for c in wanted:
        t = schema.field(c).type
        plans[c] = _plan(t, c)
        if c in defaults:
            plans[c] = _with_default(plans[c], t, c, defaults[c])
    return plans



def arrow_schema(schema: Schema | pa.Schema | None) -> pa.Schema | None:
    """The Arrow schema behind what a Ray ``Dataset`` or ``DataIterator`` reports (None: unknown).

    Raises ``SchemaError`` for a dataset of pandas blocks, whose schema has no Arrow types to
    plan tensors from.
    """
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    base = schema.base_schema
    if not isinstance(base, pa.Schema):
        raise SchemaError(
            f"the dataset's blocks are pandas ({base}), not Arrow; convert them first with "
            "ds.map_batches(lambda batch: batch, batch_format='pyarrow')"
        )
    return base
