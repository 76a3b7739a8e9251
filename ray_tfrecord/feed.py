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
The split is the same on every rank, so step counts stay equal.

Example::

    import pyarrow as pa
    import ray
    from ray_tfrecord.feed import tf_dataset

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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf
from ray.data import DataIterator, Dataset

from ray_tfrecord.codec import _is_bytes, _is_var_list

__all__ = ["tensors_from_arrow", "tf_dataset", "type_spec"]

# How much to pull from Ray per generator call (see _fetch_rows): up to this many
# rows, and about this many bytes. Variable-length columns are guessed at _VAR_BYTES.
_FETCH_ROWS = 4096
_FETCH_BYTES = 16 << 20
_VAR_BYTES = 64

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


def _tensor_extension_shape(t: pa.DataType) -> tuple[int, ...] | None:
    """Shape of a fixed-shape tensor extension type (Ray's or Arrow's), else None."""
    if isinstance(t, pa.BaseExtensionType):
        shape = getattr(t, "shape", None)
        if shape is not None and all(isinstance(d, int) and d >= 0 for d in shape):
            return tuple(shape)
    return None


@dataclass(frozen=True)
class _Layout:
    """How one Arrow column maps onto a tensor: ragged levels, then fixed dims."""

    ragged_rank: int
    inner_shape: tuple[int, ...]
    dtype: tf.DType


def _layout(t: pa.DataType, column: str) -> _Layout:
    shape = _tensor_extension_shape(t)
    if shape is not None:
        leaf = _layout(t.storage_type.value_type, column)
        if leaf.ragged_rank or leaf.inner_shape or 0 in shape:
            raise TypeError(f"column {column!r}: tensor extension {t} is not supported")
        return _Layout(0, shape, leaf.dtype)
    if _is_var_list(t):
        inner = _layout(t.value_type, column)
        return _Layout(inner.ragged_rank + 1, inner.inner_shape, inner.dtype)
    if pa.types.is_fixed_size_list(t):
        inner = _layout(t.value_type, column)
        if inner.ragged_rank:
            raise TypeError(
                f"column {column!r}: a fixed-size list of variable-length lists ({t}) "
                "has no tf.RaggedTensor equivalent; store it as list<list<T>>"
            )
        if t.list_size == 0:
            raise TypeError(f"column {column!r}: zero-length fixed-size lists are not supported")
        return _Layout(0, (t.list_size, *inner.inner_shape), inner.dtype)
    if _is_bytes(t):
        return _Layout(0, (), tf.string)
    if t in _NUMERIC_DTYPES:
        return _Layout(0, (), _NUMERIC_DTYPES[t])
    raise TypeError(f"column {column!r}: Arrow type {t} has no TensorFlow equivalent")


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
    layout = _layout(arrow_type, "<column>")
    if layout.ragged_rank == 0:
        return tf.TensorSpec((None, *layout.inner_shape), layout.dtype)
    return tf.RaggedTensorSpec(
        shape=(None,) * (layout.ragged_rank + 1) + layout.inner_shape,
        dtype=layout.dtype,
        ragged_rank=layout.ragged_rank,
        row_splits_dtype=tf.int64,
    )


def _refuse_nulls(arr: pa.Array, column: str) -> None:
    raise ValueError(
        f"column {column!r} has {arr.null_count} null value(s) outside a "
        "variable-length list; TensorFlow tensors cannot hold nulls "
        "(fill them first, e.g. with Dataset.map_batches and pyarrow.compute.fill_null)"
    )


_Converter = Callable[[pa.Array], tuple[np.ndarray, list[np.ndarray]]]


def _converter(t: pa.DataType, column: str) -> _Converter:
    """The function that splits arrays of type ``t`` into leaf values and int64 row splits.

    Leaf values come shaped ``(k, *inner)``, as a zero-copy view of the Arrow
    buffer for numeric types; row splits are the (rebased) Arrow offsets, so no
    work is done per row.  The type dispatch happens here, once per column,
    rather than on every batch.
    """
    shape = _tensor_extension_shape(t)
    if shape is not None:
        leaf = _converter(t.storage_type.value_type, column)

        def tensor(arr: pa.Array) -> tuple[np.ndarray, list[np.ndarray]]:
            if arr.null_count:
                _refuse_nulls(arr, column)
            values, _ = leaf(_list_children(arr.storage)[0])
            return values.reshape((len(arr), *shape)), []

        return tensor
    if _is_var_list(t):
        inner = _converter(t.value_type, column)

        def var_list(arr: pa.Array) -> tuple[np.ndarray, list[np.ndarray]]:
            child, splits = _list_children(arr)
            values, nested = inner(child)
            return values, [splits, *nested]

        return var_list
    if pa.types.is_fixed_size_list(t):
        inner, size = _converter(t.value_type, column), t.list_size

        def fixed(arr: pa.Array) -> tuple[np.ndarray, list[np.ndarray]]:
            if arr.null_count:
                _refuse_nulls(arr, column)
            values, _ = inner(arr.flatten())
            return values.reshape((len(arr), size, *values.shape[1:])), []

        return fixed
    # Arrow packs booleans into bits and strings into one buffer: those must be copied.
    zero_copy = not _is_bytes(t) and t != pa.bool_()
    as_binary = pa.types.is_binary_view(t) or pa.types.is_string_view(t)

    def leaf_values(arr: pa.Array) -> tuple[np.ndarray, list[np.ndarray]]:
        if arr.null_count:
            _refuse_nulls(arr, column)
        if as_binary:
            arr = arr.cast(pa.large_binary())
        return arr.to_numpy(zero_copy_only=zero_copy), []

    return leaf_values


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


@dataclass(frozen=True)
class _Column:
    name: str
    layout: _Layout
    convert: _Converter


class _Packing:
    """Carries a batch's arrays through ``from_generator`` as one buffer per dtype.

    ``from_generator`` pays a fixed cost for every array it converts, which for
    a 25-column batch outweighs copying the data, so the components (leaf
    values and row splits of every column) are concatenated per dtype on the
    Python side and split apart again inside the ``tf.data`` graph.
    """

    def __init__(self, plan: list[_Column]) -> None:
        self.inner_shapes: list[tuple[int, ...]] = []
        dtypes: list[tf.DType] = []
        for col in plan:
            self.inner_shapes.append(col.layout.inner_shape)
            dtypes.append(col.layout.dtype)
            self.inner_shapes.extend([()] * col.layout.ragged_rank)
            dtypes.extend([tf.int64] * col.layout.ragged_rank)
        self.dtypes = list(dict.fromkeys(dtypes))
        self.members = [[i for i, d in enumerate(dtypes) if d == g] for g in self.dtypes]

    def signature(self) -> tuple[tf.TensorSpec, ...]:
        buffers = tuple(tf.TensorSpec((None,), d) for d in self.dtypes)
        return (*buffers, tf.TensorSpec((len(self.inner_shapes),), tf.int64))

    def pack(self, components: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        lengths = np.fromiter((c.size for c in components), np.int64, len(components))
        buffers = []
        for members in self.members:
            flat = [components[i].reshape(-1) for i in members]
            buffers.append(flat[0] if len(flat) == 1 else np.concatenate(flat))
        return (*buffers, lengths)

    def unpack(self, *tensors: tf.Tensor) -> list[tf.Tensor]:
        *buffers, lengths = tensors
        components: list[tf.Tensor] = [None] * len(self.inner_shapes)  # type: ignore[list-item]
        for buffer, members in zip(buffers, self.members, strict=True):
            pieces = [buffer] if len(members) == 1 else tf.split(buffer, tf.gather(lengths, members), num=len(members))
            for i, piece in zip(members, pieces, strict=True):
                components[i] = tf.reshape(piece, (-1, *self.inner_shapes[i]))
        return components


def _fetch_rows(plan: list[_Column], batch_size: int, shuffle_buffer: int | None) -> int:
    """Rows to pull from Ray per trip through ``from_generator``, a multiple of ``batch_size``.

    ``from_generator`` has a fixed cost per element, so several batches travel
    together (about ``_FETCH_BYTES``) and the graph slices them apart again.
    Ray's local shuffle cannot hand out more rows than its buffer holds.
    """
    row_bytes = 0
    for col in plan:
        dense = col.layout.ragged_rank == 0 and col.layout.dtype != tf.string
        row_bytes += int(np.prod(col.layout.inner_shape)) * col.layout.dtype.size if dense else _VAR_BYTES
    rows = min(_FETCH_ROWS, _FETCH_BYTES // max(row_bytes, 1))
    if shuffle_buffer is not None:
        rows = min(rows, shuffle_buffer)
    return max(batch_size, rows - rows % batch_size)


def _single_chunk(col: pa.ChunkedArray) -> pa.Array:
    if col.num_chunks == 1:
        return col.chunk(0)
    if col.num_chunks == 0:
        return pa.array([], type=col.type)
    return col.combine_chunks()


def tensors_from_arrow(table: pa.Table, columns: Sequence[str] | None = None) -> dict[str, tf.Tensor | tf.RaggedTensor]:
    """Convert Arrow columns to tensors eagerly, with the same mapping as :func:`tf_dataset`.

    Useful where a batch arrives as Arrow outside a ``tf.data`` pipeline, such as
    a ``map_batches`` function that runs a model.

    >>> import pyarrow as pa
    >>> tensors_from_arrow(pa.table({"x": pa.array([[1], [2, 3]])}))["x"]
    <tf.RaggedTensor [[1], [2, 3]]>
    """
    out: dict[str, tf.Tensor | tf.RaggedTensor] = {}
    for name in table.column_names if columns is None else columns:
        arrow_type = table.schema.field(name).type
        _layout(arrow_type, name)  # refuses types TensorFlow cannot hold
        values, splits = _converter(arrow_type, name)(_single_chunk(table.column(name)))
        out[name] = (
            tf.RaggedTensor.from_nested_row_splits(values, splits, validate=False)
            if splits
            else tf.convert_to_tensor(values)
        )
    return out


def _arrow_schema(source: DataIterator | Dataset) -> pa.Schema:
    schema = source.schema()
    if schema is None:
        raise ValueError("the dataset is empty or its schema is unknown")
    return schema if isinstance(schema, pa.Schema) else schema.base_schema


def _names(columns: str | Sequence[str] | None) -> list[str]:
    if columns is None:
        return []
    return [columns] if isinstance(columns, str) else list(columns)


def tf_dataset(
    source: DataIterator | Dataset,
    *,
    features: str | Sequence[str],
    label: str | Sequence[str] | None = None,
    batch_size: int,
    drop_remainder: bool = True,
    steps_per_epoch: int | None = None,
    cache: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    ray_prefetch_batches: int = 2,
    tf_prefetch: int = tf.data.AUTOTUNE,
) -> tf.data.Dataset:
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
            that is refused on a multi-worker shard unless ``steps_per_epoch``
            is given, because ranks could then disagree on the step count.
        steps_per_epoch: Yield exactly this many batches per epoch, raising if
            the source runs short.  ``None`` means as many as the data gives.
        cache: Keep the converted batches in memory after the first epoch so
            later epochs do not read through Ray again.  Without it every
            epoch (every new iterator over the returned dataset) re-reads.
        local_shuffle_buffer_size: Rows held in Ray's local shuffle buffer
            (``None`` disables local shuffling).
        local_shuffle_seed: Seed for the local shuffle.
        ray_prefetch_batches: Batches Ray fetches ahead on its own threads.
        tf_prefetch: Batches TensorFlow keeps ready ahead of the training step.

    Inside a training worker, create the ``MultiWorkerMirroredStrategy`` first:
    TensorFlow refuses to set up collectives once other ops have run.

    Returns:
        A dataset whose elements are ``(features, label)``, or ``features`` when
        ``label`` is ``None``.  Its ``element_spec`` follows the Arrow schema,
        see :func:`type_spec`.  Auto-sharding is off: Ray already sharded it.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if steps_per_epoch is not None and steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
    iterator = source.iterator() if isinstance(source, Dataset) else source
    world_size = iterator.world_size() if hasattr(iterator, "world_size") else 1
    if not drop_remainder and steps_per_epoch is None and world_size > 1:
        raise ValueError(
            f"drop_remainder=False on one of {world_size} shards would let ranks run "
            "different step counts and hang synchronous training; keep "
            "drop_remainder=True or pass steps_per_epoch"
        )

    feature_names, label_names = _names(features), _names(label)
    if not feature_names:
        raise ValueError("features must name at least one column")
    schema = _arrow_schema(iterator)
    wanted = list(dict.fromkeys(feature_names + label_names))
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise ValueError(f"columns {missing} are not in the dataset; it has {schema.names}")
    plan = [_Column(c, _layout(schema.field(c).type, c), _converter(schema.field(c).type, c)) for c in wanted]
    packing = _Packing(plan)

    group = _fetch_rows(plan, batch_size, local_shuffle_buffer_size) // batch_size

    def batches() -> Iterator[tuple[np.ndarray, ...]]:
        stream = iter(
            iterator.iter_batches(
                batch_size=group * batch_size,
                batch_format="pyarrow",
                drop_last=False,
                prefetch_batches=ray_prefetch_batches,
                local_shuffle_buffer_size=local_shuffle_buffer_size,
                local_shuffle_seed=local_shuffle_seed,
            )
        )
        produced = 0
        try:
            for table in stream:
                # Only the last fetch of an epoch can be short; cut it to whole batches
                # (or keep the tail as one partial batch when drop_remainder=False).
                full, tail = divmod(table.num_rows, batch_size)
                count = full + (1 if tail and not drop_remainder else 0)
                if steps_per_epoch is not None:
                    count = min(count, steps_per_epoch - produced)
                if count == 0:
                    break
                table = table.slice(0, min(table.num_rows, count * batch_size))
                components: list[np.ndarray] = []
                for col in plan:
                    values, splits = col.convert(_single_chunk(table.column(col.name)))
                    components.append(values)
                    components.extend(splits)
                produced += count
                yield packing.pack(components)
                if produced == steps_per_epoch:
                    break
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if steps_per_epoch is not None and produced < steps_per_epoch:
            raise RuntimeError(
                f"this shard gave only {produced} full batches of {batch_size} rows "
                f"but steps_per_epoch={steps_per_epoch}; failing instead of leaving "
                "the other ranks waiting in a collective"
            )

    @tf.autograph.experimental.do_not_convert
    def assemble(*packed: tf.Tensor) -> dict[str, tf.Tensor | tf.RaggedTensor]:
        parts = packing.unpack(*packed)
        tensors = {}
        i = 0
        for col in plan:
            rr = col.layout.ragged_rank
            values, splits = parts[i], list(parts[i + 1 : i + 1 + rr])
            i += 1 + rr
            tensors[col.name] = tf.RaggedTensor.from_nested_row_splits(values, splits, validate=False) if rr else values
        return tensors

    @tf.autograph.experimental.do_not_convert
    def split(tensors: dict[str, tf.Tensor | tf.RaggedTensor]) -> tf.data.Dataset:
        first = tensors[plan[0].name]
        rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first, out_type=tf.int64)[0]
        starts = tf.data.Dataset.range(0, rows, batch_size)
        return starts.map(lambda s: {n: t[s : s + batch_size] for n, t in tensors.items()})

    @tf.autograph.experimental.do_not_convert
    def structure(tensors: dict[str, tf.Tensor | tf.RaggedTensor]):
        x = tensors[features] if isinstance(features, str) else {n: tensors[n] for n in feature_names}
        if label is None:
            return x
        y = tensors[label] if isinstance(label, str) else {n: tensors[n] for n in label_names}
        return x, y

    dataset = tf.data.Dataset.from_generator(batches, output_signature=packing.signature())
    dataset = dataset.map(assemble, num_parallel_calls=tf.data.AUTOTUNE)
    if group > 1:
        dataset = dataset.flat_map(split)
    dataset = dataset.map(structure)
    if steps_per_epoch is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps_per_epoch))
    if cache:
        dataset = dataset.cache()
    options = tf.data.Options()
    # Ray already gave this worker its own shard; TF must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.prefetch(tf_prefetch).with_options(options)
