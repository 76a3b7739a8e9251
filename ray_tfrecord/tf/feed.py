"""Stream Ray Data batches into TensorFlow as a ``tf.data.Dataset``.

The feed turns each Arrow batch that Ray Data hands out into tensors with
vectorised numpy views (no Python work per row): fixed-length columns become
dense tensors, variable-length lists become ``tf.RaggedTensor`` built from the
Arrow offsets, and ``list<list<T>>`` (SequenceExample feature lists) becomes a
ragged tensor with two ragged dimensions.

Equal steps on every rank
-------------------------
Synchronous data-parallel training (``MultiWorkerMirroredStrategy``) hangs if
one rank runs out of batches before the others.  The policy here is **drop the
remainder**: only full batches of ``batch_size`` rows are produced.  Ray
Train's default ``DataConfig`` splits every dataset with
``streaming_split(world_size, equal=True)``, which gives every rank exactly
``N // world_size`` rows, so every rank yields exactly
``(N // world_size) // batch_size`` batches per epoch; at most
``world_size * batch_size - 1`` rows per epoch go unseen (different ones each
epoch when the data is shuffled).  When the shards may be unequal (a custom
``DataConfig``, or each rank reading its own files), pass ``steps_per_epoch``:
every rank then yields exactly that many batches and raises, instead of
hanging its peers, if its shard is too short.

Batch size under MultiWorkerMirroredStrategy
--------------------------------------------
Keras ``fit`` under ``MultiWorkerMirroredStrategy`` follows TensorFlow's
global-batch convention: it splits every element of the dataset into
``num_replicas_in_sync`` pieces and the worker runs one step per piece.  So pass
``batch_size = per_replica_batch * world_size`` (what TensorFlow calls the
global batch size): each worker then takes that many rows from its own shard
per element and every replica trains on ``per_replica_batch`` rows per step.
The split is the same on every rank, so step counts stay equal: Keras runs,
and prints, ``world_size * ((N // world_size) // batch_size)`` steps per
epoch (1000 rows, 2 workers, ``batch_size=100``: ``10/10``), not the
``(N // world_size) // batch_size`` batches the feed yields.

Per-replica batches
-------------------
That re-split costs Keras a pass over every element, and on a ragged column
TensorFlow encodes each row as its own variant to do it: it can cost more than
the feed.  ``strategy=strategy`` skips it: the feed cuts each replica's
``batch_size // num_replicas_in_sync`` rows itself and returns a
``tf.distribute.DistributedDataset`` (``distribute_datasets_from_function``).
Keras requires a step count for those and keeps one iterator across epochs, so
pass the same ``steps_per_epoch`` to ``tf_dataset`` and ``model.fit``, counted
in Keras steps: ``(rows // world_size) // (batch_size // world_size)`` for an
equal split of ``rows``.  Each Keras epoch is then one pass over the shard.  As
Keras prefetches, the last epoch starts one more pass, which ends when ``fit``
returns.

Example::

    import pyarrow as pa
    import ray
    from ray_tfrecord.tf.feed import tf_dataset

    ds = ray.data.from_arrow(pa.table({
        "pixels": pa.FixedSizeListArray.from_arrays(
            pa.array(range(4 * 6), pa.float32()), 6),
        "tokens": pa.array([[1], [2, 3], [], [4, 5, 6]], pa.list_(pa.int64())),
        "label": pa.array([0, 1, 0, 1]),
    }))
    feed = tf_dataset(ds, features=["pixels", "tokens"], label="label",
                      batch_size=2)
    for features, label in feed:
        print(features["pixels"].shape, features["tokens"].row_splits, label)
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray.train
import tensorflow as tf
from ray.data import DataIterator, Dataset

from ray_tfrecord.core.codec import BYTE_ARRAY_SCHEMA, decode_records
from ray_tfrecord.core.errors import SchemaError
from ray_tfrecord.core.types import is_bytes, is_var_list, single_chunk

__all__ = ["tensors_from_arrow", "tf_dataset", "type_spec"]

# How much to pull from Ray per generator call (see _Batching.fitting): up to this
# many rows, and about this many bytes. Variable-length columns are guessed at _VAR_BYTES.
_FETCH_ROWS = 4096
_FETCH_BYTES = 16 << 20
_VAR_BYTES = 64

# Row size from which a dense component is not worth copying into a shared buffer (see _Packing).
_ALONE_ROW_BYTES = 256

# Rows sampled by _warn_constant_length_lists.
_SAMPLE_ROWS = 1024

# The pyarrow constructor of each numeric type whose name differs from str(type).
_CONSTRUCTORS = {pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64", pa.bool_(): "bool_"}

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

_Tensor = tf.Tensor | tf.RaggedTensor
_Converter = Callable[[pa.Array], tuple[np.ndarray, list[np.ndarray]]]


@dataclass(frozen=True)
class _Plan:
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
        if self.ragged_rank == 0:
            return tf.TensorSpec((None, *self.inner_shape), self.dtype)
        return tf.RaggedTensorSpec(
            shape=(None,) * (self.ragged_rank + 1) + self.inner_shape,
            dtype=self.dtype,
            ragged_rank=self.ragged_rank,
            row_splits_dtype=tf.int64,
        )

    @property
    def row_bytes(self) -> int:
        """Bytes one row takes: exact for dense numeric tensors, a guess otherwise."""
        if self.ragged_rank or self.dtype == tf.string:
            return _VAR_BYTES
        return int(np.prod(self.inner_shape)) * self.dtype.size

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


def _plan(t: pa.DataType, column: str) -> _Plan:
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
        return _Plan(inner.ragged_rank + 1, inner.inner_shape, inner.dtype, convert)
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
        if shape is not None and all(isinstance(d, int) and d >= 0 for d in shape):
            return tuple(shape)
    return None


def _leaf_plan(dtype: tf.DType, column: str, *, zero_copy: bool, as_binary: bool) -> _Plan:
    convert = functools.partial(_leaf_values, column=column, zero_copy=zero_copy, as_binary=as_binary)
    return _Plan(0, (), dtype, convert)


def _dense_plan(
    inner: _Plan, shape: tuple[int, ...], children: Callable[[pa.Array], pa.Array], column: str
) -> _Plan:
    """A dense tensor of ``shape`` per row, from the rows' ``children`` converted by ``inner``."""
    convert = functools.partial(_dense_values, column=column, children=children, inner=inner.convert, shape=shape)
    return _Plan(0, shape, inner.dtype, convert)


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
    # Ray stores tensors as (large) lists of the flattened elements.
    return _list_children(arr.storage)[0]


def _refuse_nulls(arr: pa.Array, column: str, plan: _Plan) -> None:
    raise SchemaError(
        f"{arr.null_count} of the {len(arr)} rows in this batch are null (records without the feature), "
        "and a TensorFlow tensor cannot hold nulls; pass "
        f"defaults={{{column!r}: {plan.example_default}}} to fill them, as FixedLenFeature's default_value does",
        column=column,
    )


def _with_default(plan: _Plan, arrow_type: pa.DataType, column: str, value: Any) -> _Plan:
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


def _tensor(values: Any, splits: Sequence[Any]) -> _Tensor:
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
) -> dict[str, tf.Tensor | tf.RaggedTensor]:
    """Convert Arrow columns to tensors eagerly, with the same mapping as :func:`tf_dataset`.

    Useful where a batch arrives as Arrow outside a ``tf.data`` pipeline, such as
    a ``map_batches`` function that runs a model.  ``defaults`` fills null rows
    of scalar and fixed-size columns, as in :func:`tf_dataset`.

    >>> import pyarrow as pa
    >>> tensors_from_arrow(pa.table({"x": pa.array([[1], [2, 3]])}))["x"]
    <tf.RaggedTensor [[1], [2, 3]]>
    """
    names = table.column_names if columns is None else list(columns)
    plans = _plans_with_defaults(table.schema, names, defaults)
    return {name: _tensor(*plan.convert(single_chunk(table.column(name)))) for name, plan in plans.items()}


@dataclass(frozen=True)
class _Batching:
    """Rows per element (``batch_size``) and per trip through ``from_generator``.

    ``from_generator`` has a fixed cost per element, so several batches travel
    together (``fetch_rows``, a multiple of ``batch_size``) and the graph slices
    them apart again.
    """

    batch_size: int
    fetch_rows: int

    @classmethod
    def fitting(cls, plans: Iterable[_Plan], batch_size: int, shuffle_buffer: int | None) -> _Batching:
        """Fetches of about ``_FETCH_BYTES``, within Ray's local shuffle buffer, which
        cannot hand out more rows than it holds."""
        rows = min(_FETCH_ROWS, _FETCH_BYTES // max(sum(p.row_bytes for p in plans), 1))
        if shuffle_buffer is not None:
            rows = min(rows, shuffle_buffer)
        return cls(batch_size, max(batch_size, rows - rows % batch_size))

    def batches_in(self, rows: int, drop_remainder: bool) -> int:
        """Batches a fetch of ``rows`` makes: the full ones, plus the tail if kept."""
        full, tail = divmod(rows, self.batch_size)
        return full + (1 if tail and not drop_remainder else 0)


@dataclass(frozen=True)
class _Fetches:
    """One epoch of Arrow tables from Ray per iteration, each cut to whole batches."""

    iterator: DataIterator
    batching: _Batching
    drop_remainder: bool
    steps_per_epoch: int | None
    iter_options: dict[str, Any]

    def __iter__(self) -> Iterator[pa.Table]:
        stream = iter(
            self.iterator.iter_batches(
                batch_size=self.batching.fetch_rows, batch_format="pyarrow", drop_last=False, **self.iter_options
            )
        )
        produced = 0
        try:
            for table in stream:
                # Only the last fetch of an epoch can be short.
                count = self.batching.batches_in(table.num_rows, self.drop_remainder)
                if self.steps_per_epoch is not None:
                    count = min(count, self.steps_per_epoch - produced)
                if count == 0:
                    break
                produced += count
                yield table.slice(0, count * self.batching.batch_size)
                if produced == self.steps_per_epoch:
                    break
        finally:
            # Stops Ray's prefetching threads when TensorFlow abandons the epoch early.
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if self.steps_per_epoch is not None and produced < self.steps_per_epoch:
            raise RuntimeError(
                f"this shard gave only {produced} full batches of {self.batching.batch_size} rows "
                f"but steps_per_epoch={self.steps_per_epoch}; failing instead of leaving "
                "the other ranks waiting in a collective"
            )


@dataclass(frozen=True)
class _Decoding:
    """Decodes a fetch of serialized ``Example`` records (``record_type="ByteArray"``) in this
    process, with :func:`~ray_tfrecord.core.codec.decode_records`: the native decoder runs here, with
    the GIL released, into the Arrow buffers the tensors are made from."""

    schema: pa.Schema

    def __call__(self, table: pa.Table) -> pa.Table:
        return pa.Table.from_batches([decode_records(table, self.schema)])


class _Packing:
    """Carries a fetch's arrays through ``from_generator`` as few buffers.

    ``from_generator`` pays a fixed cost for every array it converts, which for
    a 25-column batch outweighs copying the data, so the narrow components
    (leaf values and row splits of every column) are concatenated per dtype on
    the Python side and split apart again inside the ``tf.data`` graph.  A wide
    dense component (an image's pixels) travels alone: copying it would cost
    more than the conversion it saves.
    """

    def __init__(self, plans: dict[str, _Plan]) -> None:
        self.plans = plans
        components = [spec for plan in plans.values() for spec in plan.component_specs]
        self.inner_shapes = [shape for shape, _ in components]
        groups = [
            i if int(np.prod(shape)) * dtype.size >= _ALONE_ROW_BYTES else dtype
            for i, (shape, dtype) in enumerate(components)
        ]
        keys = list(dict.fromkeys(groups))
        self.members = [[i for i, g in enumerate(groups) if g == key] for key in keys]
        self.dtypes = [components[m[0]][1] for m in self.members]

    def signature(self) -> tuple[tf.TensorSpec, ...]:
        buffers = tuple(tf.TensorSpec((None,), d) for d in self.dtypes)
        return (*buffers, tf.TensorSpec((len(self.inner_shapes),), tf.int64))

    def pack(self, table: pa.Table) -> tuple[np.ndarray, ...]:
        components: list[np.ndarray] = []
        for name, plan in self.plans.items():
            values, splits = plan.convert(single_chunk(table.column(name)))
            components.append(values)
            components.extend(splits)
        lengths = np.fromiter((c.size for c in components), np.int64, len(components))
        buffers = []
        for members in self.members:
            flat = [components[i].reshape(-1) for i in members]
            buffers.append(flat[0] if len(flat) == 1 else np.concatenate(flat))
        return (*buffers, lengths)

    @tf.autograph.experimental.do_not_convert
    def unpack(self, *tensors: tf.Tensor) -> dict[str, _Tensor]:
        *buffers, lengths = tensors
        components: list[tf.Tensor] = [None] * len(self.inner_shapes)  # type: ignore[list-item]
        for buffer, members in zip(buffers, self.members, strict=True):
            pieces = [buffer] if len(members) == 1 else tf.split(buffer, tf.gather(lengths, members), num=len(members))
            for i, piece in zip(members, pieces, strict=True):
                components[i] = tf.reshape(piece, (-1, *self.inner_shapes[i]))
        out, i = {}, 0
        for name, plan in self.plans.items():
            out[name] = _tensor(components[i], components[i + 1 : i + 1 + plan.ragged_rank])
            i += 1 + plan.ragged_rank
        return out


@tf.autograph.experimental.do_not_convert
def _split_batches(tensors: dict[str, _Tensor], batch_size: int) -> tf.data.Dataset:
    """A fetch's tensors as a dataset of ``batch_size``-row slices."""
    first = next(iter(tensors.values()))
    rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first, out_type=tf.int64)[0]
    starts = tf.data.Dataset.range(0, rows, batch_size)
    return starts.map(lambda s: {n: t[s : s + batch_size] for n, t in tensors.items()})


@tf.autograph.experimental.do_not_convert
def _model_inputs(
    tensors: dict[str, _Tensor], features: str | Sequence[str], label: str | Sequence[str] | None
) -> Any:
    """``features`` or ``(features, label)``, each one tensor (one name) or a dict."""
    x = _pick(tensors, features)
    return x if label is None else (x, _pick(tensors, label))


def _pick(tensors: dict[str, _Tensor], columns: str | Sequence[str]) -> _Tensor | dict[str, _Tensor]:
    return tensors[columns] if isinstance(columns, str) else {n: tensors[n] for n in columns}


def _names(columns: str | Sequence[str] | None) -> list[str]:
    if columns is None:
        return []
    return [columns] if isinstance(columns, str) else list(columns)


def _column_plans(source: DataIterator, columns: list[str], defaults: Mapping[str, Any] | None) -> dict[str, _Plan]:
    """A plan per distinct column, in order; raises if a column is missing or unsupported."""
    schema = source.schema()
    if schema is None:
        raise ValueError("the dataset is empty or its schema is unknown")
    if not isinstance(schema, pa.Schema):
        schema = schema.base_schema
    return _plans_with_defaults(schema, columns, defaults)


def _check_serialized(source: DataIterator) -> None:
    """Refuse ``record_schema=`` unless ``source`` holds what ``record_type="ByteArray"`` reads."""
    schema = source.schema()
    if schema is not None and not isinstance(schema, pa.Schema):
        schema = schema.base_schema
    column = BYTE_ARRAY_SCHEMA.names[0]
    if schema is None or column not in schema.names or not (
        pa.types.is_binary(schema.field(column).type) or pa.types.is_large_binary(schema.field(column).type)
    ):
        raise ValueError(
            f"record_schema= decodes serialized records, but the dataset's schema is {schema}; read it with "
            f"read_tfrecords(..., record_type='ByteArray') (one binary column {column!r}), or drop record_schema="
        )


def _plans_with_defaults(schema: pa.Schema, columns: list[str], defaults: Mapping[str, Any] | None) -> dict[str, _Plan]:
    """A plan per distinct column of ``schema``, in order, filling nulls from ``defaults``."""
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
    plans = {}
    for c in wanted:
        t = schema.field(c).type
        plans[c] = _plan(t, c)
        if c in defaults:
            plans[c] = _with_default(plans[c], t, c, defaults[c])
    return plans


def _warn_constant_length_lists(ds: Dataset, columns: Sequence[str] | None = None) -> list[str]:
    """Warn about numeric ``list<T>`` columns whose sampled rows all hold the same count.

    Such a column (what ``read_tfrecords`` infers for a fixed-length TFRecord
    feature unless ``fixed_size_lists=True``) becomes a ``tf.RaggedTensor``,
    which Keras ``Dense`` and most layers refuse, only once Keras traces the
    model.  The warning comes before that and names the read option or type
    that gives a dense tensor instead.  Samples the first rows of ``ds``;
    returns the columns warned about.
    """
    schema = ds.schema(fetch_if_missing=True)
    if schema is None:
        return []
    schema = schema if isinstance(schema, pa.Schema) else schema.base_schema
    candidates = [
        f
        for f in schema
        if (columns is None or f.name in columns) and is_var_list(f.type) and f.type.value_type in _NUMERIC_DTYPES
    ]
    if not candidates:
        return []
    sample = ds.select_columns([f.name for f in candidates]).take_batch(_SAMPLE_ROWS, batch_format="pyarrow")
    warned = []
    for field in candidates:
        column = single_chunk(sample.column(field.name))
        if len(column) < 2 or column.null_count:
            continue
        lengths = np.diff(_list_children(column)[1])
        if lengths[0] == 0 or not (lengths == lengths[0]).all():
            continue
        n = int(lengths[0])
        value = field.type.value_type
        warnings.warn(
            f"column {field.name!r} is {field.type} with {n} values in every sampled row; the feed makes it a "
            f"tf.RaggedTensor, which Keras Dense refuses. For a dense (batch, {n}) tensor, read with "
            f"read_tfrecords(..., fixed_size_lists=True) or give it the type "
            f"pa.list_(pa.{_CONSTRUCTORS.get(value, str(value))}(), {n}) in schema=",
            UserWarning,
            stacklevel=3,
        )
        warned.append(field.name)
    return warned


def _world_size() -> int:
    """Workers in this Ray Train run; 1 outside one (driver, Ray task, Tune function).

    Ray Train v2 raises RuntimeError outside a training function, and
    DeprecationWarning inside a plain Tune function: both mean no peers share
    a collective with this process.
    """
    try:
        return ray.train.get_context().get_world_size()
    except (RuntimeError, DeprecationWarning):
        return 1


def tf_dataset(
    source: DataIterator | Dataset,
    *,
    features: str | Sequence[str],
    label: str | Sequence[str] | None = None,
    batch_size: int,
    drop_remainder: bool = True,
    steps_per_epoch: int | None = None,
    defaults: Mapping[str, Any] | None = None,
    record_schema: pa.Schema | None = None,
    cache: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    ray_prefetch_batches: int = 2,
    tf_prefetch: int = tf.data.AUTOTUNE,
    strategy: tf.distribute.Strategy | None = None,
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """A ``tf.data.Dataset`` of batches streamed from a Ray ``DataIterator`` or ``Dataset``.

    Args:
        source: What ``ray.train.get_dataset_shard`` returns inside a training
            worker, or a whole ``ray.data.Dataset``.
        features: One column name (the model input is that tensor) or several
            (the input is a ``dict`` of tensors keyed by column name).
        label: Label column(s), same convention; ``None`` yields features only.
        batch_size: Rows per element, taken from this worker's shard (under
            ``MultiWorkerMirroredStrategy`` that is TensorFlow's global batch
            size; see the module docstring).
        drop_remainder: Yield only full batches (see the module docstring for why
            this keeps ranks in step).  ``False`` keeps the last partial batch;
            inside a Ray Train run of several workers that is refused unless
            ``steps_per_epoch`` is given, because ranks could then disagree on
            the step count.
        steps_per_epoch: Yield exactly this many batches per epoch, raising if
            the source runs short.  ``None`` means as many as the data gives.
            With ``strategy``, Keras steps: every replica gets this many
            per-replica batches an epoch.
        defaults: Values for null rows, by column, like TensorFlow's
            ``FixedLenFeature(default_value=...)``: a record without a scalar or
            fixed-length feature reads as a null row, which a tensor cannot
            hold.  Each value is one row of its column (a scalar, or a list of
            the column's fixed shape) of the column's kind.  Without one, a
            null in a scalar or fixed-size column raises ``SchemaError`` naming
            the column and the null count.  Variable-length lists need none:
            their null rows are empty.
        record_schema: Decode in this process: ``source`` holds serialized
            ``Example`` records (``read_tfrecords(..., record_type="ByteArray")``),
            and the feed decodes the columns it needs with this schema, as
            ``read_tfrecords(..., schema=record_schema)`` would.  Ray then
            moves the records' serialized bytes instead of decoded columns,
            much less for wide integer rows (an image's int64 pixels), and the
            training workers decode in parallel with the read tasks.
        cache: Keep the converted batches in memory after the first epoch so
            later epochs do not read through Ray again.  Without it every
            epoch (every new iterator over the returned dataset) re-reads.
        local_shuffle_buffer_size: Rows held in Ray's local shuffle buffer
            (``None`` disables local shuffling).
        local_shuffle_seed: Seed for the local shuffle.
        ray_prefetch_batches: Batches Ray fetches ahead on its own threads.
        tf_prefetch: Batches TensorFlow keeps ready ahead of the training step.
        strategy: Hand Keras per-replica batches already cut, as a
            ``tf.distribute.DistributedDataset`` (see "Per-replica batches" in
            the module docstring): each replica gets ``batch_size //
            strategy.num_replicas_in_sync`` rows straight from this worker's
            shard, and Keras skips its own re-split of every element, which on
            a ragged column costs more than the feed.  Needs
            ``steps_per_epoch``, counted in Keras steps, and the same value
            given to ``model.fit``; every Keras epoch then reads the shard once.

    Inside a training worker, create the ``MultiWorkerMirroredStrategy`` first:
    TensorFlow refuses to set up collectives once other ops have run.

    Returns:
        A dataset whose elements are ``(features, label)``, or ``features`` when
        ``label`` is ``None``.  Its ``element_spec`` follows the Arrow schema,
        see :func:`type_spec`.  Auto-sharding is off: Ray already sharded it.
        tf.data autotuning is off (an epoch's end would often wait for the
        autotuner's next wake-up); ``with_options`` turns it back on.  With
        ``strategy``, a ``tf.distribute.DistributedDataset`` of the same
        elements, cut per replica, that repeats epoch after epoch.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if steps_per_epoch is not None and steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
    if strategy is not None:
        _check_per_replica(strategy, batch_size, steps_per_epoch)
    elif not drop_remainder and steps_per_epoch is None and (world_size := _world_size()) > 1:
        raise ValueError(
            f"drop_remainder=False on one of {world_size} workers would let ranks run "
            "different step counts and hang synchronous training; keep "
            "drop_remainder=True or pass steps_per_epoch"
        )
    feature_names, label_names = _names(features), _names(label)
    if not feature_names:
        raise ValueError("features must name at least one column")
    if isinstance(source, Dataset):
        _warn_constant_length_lists(source, feature_names)
    iterator = source.iterator() if isinstance(source, Dataset) else source
    decoding = None
    if record_schema is None:
        plans = _column_plans(iterator, feature_names + label_names, defaults)
    else:
        _check_serialized(iterator)
        plans = _plans_with_defaults(record_schema, feature_names + label_names, defaults)
        decoding = _Decoding(pa.schema([record_schema.field(c) for c in plans]))
    iter_options = {
        "prefetch_batches": ray_prefetch_batches,
        "local_shuffle_buffer_size": local_shuffle_buffer_size,
        "local_shuffle_seed": local_shuffle_seed,
    }

    def batches(rows: int, steps: int | None) -> tf.data.Dataset:
        batching = _Batching.fitting(plans.values(), rows, local_shuffle_buffer_size)
        packing = _Packing(plans)
        fetches = _Fetches(iterator, batching, drop_remainder, steps, iter_options)
        pack = packing.pack if decoding is None else lambda table: packing.pack(decoding(table))
        dataset = tf.data.Dataset.from_generator(lambda: map(pack, fetches), output_signature=packing.signature())
        dataset = dataset.map(packing.unpack, num_parallel_calls=tf.data.AUTOTUNE)
        if batching.fetch_rows > batching.batch_size:
            dataset = dataset.flat_map(functools.partial(_split_batches, batch_size=batching.batch_size))
        dataset = dataset.map(functools.partial(_model_inputs, features=features, label=label))
        if steps is not None:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
        if cache:
            dataset = dataset.cache()
        options = tf.data.Options()
        # Ray already gave this worker its own shard; TF must not shard it again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        # With autotuning on, an epoch's end often waits for the autotuner's next wake-up, whose
        # period doubles from 10 ms (epochs of 2.56 s or 5.12 s exactly, in Ray Train and alone); the
        # AUTOTUNE knobs then take TensorFlow's static defaults, at the same throughput.
        options.autotune.enabled = False
        return dataset.prefetch(tf_prefetch).with_options(options)

    if strategy is None:
        return batches(batch_size, steps_per_epoch)

    def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # This worker's replicas take its elements in turn, one each per step. Keras never
        # restarts a distributed dataset's iterator, so each repetition is one pass over the shard.
        local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
        return batches(context.get_per_replica_batch_size(batch_size), steps_per_epoch * local_replicas).repeat()

    return strategy.distribute_datasets_from_function(per_worker)


def _check_per_replica(strategy: tf.distribute.Strategy, batch_size: int, steps_per_epoch: int | None) -> None:
    """Refuse a ``strategy=`` call that could not give every replica equal batches and steps."""
    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} is the global batch, cut into equal parts for the strategy's {replicas} "
            f"replicas; pass a multiple of {replicas}, e.g. batch_size={batch_size - batch_size % replicas or replicas}"
        )
    if steps_per_epoch is None:
        raise ValueError(
            "strategy= gives Keras a distributed dataset, and Keras fit then needs the step count up front: pass "
            "the same steps_per_epoch to tf_dataset and to model.fit: (rows // world_size) // "
            "(batch_size // world_size) for a Ray Train shard of a dataset of that many rows"
        )
